"""SpecDiff-2: speculative decoding with masked-diffusion drafters, self-selection and exact verification."""

from specdiff.core.acceptance import Verdict, greedy_accept, speculative_accept
from specdiff.core.config import DecodeOptions, DrafterConfig, SamplingParams, SpecConfig
from specdiff.models.drafter import (
    Drafter,
    DrafterUnavailable,
    HFDiffusionDrafter,
    build_small_drafter,
    drafter_from_verifier,
    find_mask_token_id,
    load_drafter,
    save_drafter,
    window_inputs,
    window_logits,
)
from specdiff.core.engine import DecodeStream, GenerationResult, SpeculativeDecoder, generate_plain, make_generator, stream_plain
from specdiff.core.policy import SpeculationCosts, SpeculationPolicy
from specdiff.core.sampling import target_probs
from specdiff.core.selection import expected_streak, sample_candidates, select
from specdiff.core.stats import DecodeStats
from specdiff.core.tree import TokenTree, build_tree
from specdiff.models.verifier import HFVerifier, Verifier, VerifierSession

__all__ = [
    "DecodeOptions",
    "DecodeStats",
    "DecodeStream",
    "Drafter",
    "DrafterUnavailable",
    "DrafterConfig",
    "GenerationResult",
    "HFDiffusionDrafter",
    "HFVerifier",
    "SamplingParams",
    "SpecConfig",
    "SpeculationCosts",
    "SpeculationPolicy",
    "SpeculativeDecoder",
    "TokenTree",
    "Verdict",
    "Verifier",
    "VerifierSession",
    "build_small_drafter",
    "build_tree",
    "drafter_from_verifier",
    "expected_streak",
    "find_mask_token_id",
    "generate_plain",
    "greedy_accept",
    "load_drafter",
    "make_generator",
    "sample_candidates",
    "save_drafter",
    "select",
    "speculative_accept",
    "stream_plain",
    "target_probs",
    "window_inputs",
    "window_logits",
]
__version__ = "0.1.0"
