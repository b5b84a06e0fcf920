"""Lineage: plain records that travel with artefacts — which verifier a drafter was aligned to
(``verifier.VerifierRecord``) and the held-out test a pair was measured on and its result (``evaluation``).
Standard library only; importable from every rung above the models."""
