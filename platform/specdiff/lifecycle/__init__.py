"""Lifecycle: the stages that use the adapters (re-alignment: a new verifier version gets an aligned drafter)."""
