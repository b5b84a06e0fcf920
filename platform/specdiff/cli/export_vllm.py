"""``specdiff export-vllm``: write a feature drafter in the layout vLLM loads for speculative method ``dflash`` (see docs/vllm.md).

    specdiff export-vllm ~/.cache/specdiff/drafters/default /tmp/drafter-vllm
    specdiff export-vllm DRAFTER_DIR OUT_DIR --verifier /path/to/hf/folder --full-vocab

Then, in a virtualenv with vLLM (README: "vLLM engine (optional)"):

    LLM(model=VERIFIER_DIR, speculative_config={"method": "dflash", "model": OUT_DIR, "num_speculative_tokens": 8})

Exit status: 0 written, 2 bad input (the message names the file or the mismatch). Needs no vLLM.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specdiff.cli.flags import add_verifier_flag



def add_parser(sub, name: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help="write a feature drafter in vLLM's dflash layout", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("drafter_dir", help="a feature drafter folder (save_feature_drafter / specdiff distill)")
    p.add_argument("out_dir", help="folder to write (created; files in it are overwritten)")
    add_verifier_flag(p)  # the embedded default or a local folder (a hub id is refused: no weights to read)
    p.add_argument("--full-vocab", action="store_true", help="let vLLM use the verifier's whole LM head instead of "
                   "the drafter's draft vocabulary (d2t)")
    p.add_argument("--prompt-lookup", type=int, nargs=2, default=[2, 4], metavar=("MIN", "MAX"),
                   help="n-gram sizes of the copied candidate that specdiff's vLLM plugin drafts where the context "
                   "has one (default: 2 4)")
    p.add_argument("--no-prompt-lookup", action="store_true", help="the drafter alone (vLLM's dflash as it is)")
    p.add_argument("--min-draft-confidence", type=float, default=None, metavar="C",
                   help="specdiff's vLLM plugin verifies the drafter's tokens only while the running product of its "
                   "top-1 probabilities stays >= C (default: export_vllm.DEFAULT_MIN_DRAFT_CONFIDENCE; 0: every window "
                   "whole)")
    p.add_argument("--mask-token-id", type=int, default=None, help="id vLLM feeds for masked slots (its embedding "
                   "is replaced by the drafter's mask vector); default: the highest id outside the draft vocabulary")
    return p


def run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from specdiff.vllm.export import DEFAULT_MIN_DRAFT_CONFIDENCE, export_vllm
    from specdiff.models.sources import resolve_model_path

    try:
        verifier_dir = resolve_model_path(args.verifier)
        if not Path(verifier_dir).is_dir():
            raise ValueError(f"--verifier must be the embedded default or a local folder, got {verifier_dir!r}")
        export = export_vllm(args.drafter_dir, args.out_dir, verifier_dir=verifier_dir, full_vocab=args.full_vocab,
                             mask_token_id=args.mask_token_id,
                             prompt_lookup=None if args.no_prompt_lookup else tuple(args.prompt_lookup),
                             min_draft_confidence=(DEFAULT_MIN_DRAFT_CONFIDENCE if args.min_draft_confidence is None
                                                   else args.min_draft_confidence or None))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    vocab = f"draft vocabulary {export.draft_vocab_size} (d2t)" if export.draft_vocab_size else "the verifier's head"
    lookup = (f"prompt lookup n-grams {export.prompt_lookup[0]}-{export.prompt_lookup[1]} (specdiff's vLLM plugin)"
              if export.prompt_lookup else "no prompt lookup")
    cut = (f"drafter windows cut below running confidence {export.min_draft_confidence:g}"
           if export.min_draft_confidence else "drafter windows verified whole")
    print(f"wrote {export.path}: taps {list(export.target_layer_ids)}, mask_token_id {export.mask_token_id}, "
          f"{vocab}, up to {export.num_speculative_tokens} speculative tokens, {lookup}, {cut}")
    print(f"vLLM: LLM(model={verifier_dir!r}, speculative_config={export.speculative_config()})")
    return 0

