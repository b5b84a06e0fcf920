"""Generate with speculative decoding and compare with plain decoding, side by side in one run.

    python jobs/generate.py --prompt "Write a Python function that checks whether a number is prime."

Defaults: the embedded SmolLM2-135M-Instruct verifier, the dtype this machine runs fastest (``--dtype auto``:
bfloat16 on a GPU or a CPU with native bf16, else float32), greedy decoding (T=0). The drafter is
``--drafter DIR`` (a directory written by ``jobs/distill.py`` / ``save_drafter``), else the default drafter in the
state directory, which the first run builds with ``jobs/build_drafter.py`` (within a 15-minute budget: a slower
CPU trains fewer of the recipe's steps; with a progress display; later runs start in seconds). ``--untrained``
skips that and drafts with verifier layers that were never aligned (expect tau near 1 and a slowdown). At T=0 the script checks that both outputs are identical.
"""

from __future__ import annotations

import time

STARTED = time.perf_counter()  # before the heavy imports: "first token after" counts them

import argparse  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from specdiff import (  # noqa: E402
    DecodeOptions,
    HFVerifier,
    SamplingParams,
    SpecConfig,
    SpeculativeDecoder,
    generate_plain,
    load_drafter,
)
from specdiff.models.dtypes import dtype_name, resolve_dtype_with_reason  # noqa: E402
from specdiff.models.sources import BACKENDS, DEFAULT_VERIFIER, load_causal_lm, state_dir  # noqa: E402
from specdiff.core.text import TextStreamer  # noqa: E402

from build_drafter import build_default, untrained_drafter  # noqa: E402 (jobs/ is on sys.path when this script runs)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--prompt", default="Write a Python function that checks whether a number is prime.")
    p.add_argument("--verifier", default=DEFAULT_VERIFIER, help="embedded default, local folder or HF model id")
    p.add_argument("--drafter", default=None, help="drafter directory (default: the default drafter, built if missing)")
    p.add_argument("--untrained", action="store_true", help="draft with unaligned verifier layers (no build)")
    p.add_argument("--no-chat", action="store_true", help="feed the prompt raw instead of through the chat template")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--gamma", type=int, default=None, help="window: drafted positions per round (default: adaptive)")
    p.add_argument("--k", type=int, default=None, help="candidates per round, self-selection (default: adaptive)")
    p.add_argument("--draft-temperature", type=float, default=SpecConfig().draft_temperature)
    p.add_argument("--temperature", type=float, default=0.0, help="verifier sampling temperature (0 = greedy)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16 (both decoders use it; auto: bfloat16 "
                   "where the CPU has native bf16, else float32)")
    p.add_argument("--backend", default="auto", choices=BACKENDS, help="verifier forward and tokenizer: specdiff's "
                   "lean Llama forward (no transformers import: starts ~6 s sooner), transformers, or auto (specdiff "
                   "where the model is a Llama-family folder, else transformers)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--recalibrate", action="store_true", help="measure the adaptive policy's cost model again (it is "
                   "kept per machine under $SPECDIFF_HOME/costs; redo it if the machine was busy when it was measured)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p)
    spec = SpecConfig(gamma=args.gamma, num_candidates=args.k, draft_temperature=args.draft_temperature)
    try:
        dtype, reason = resolve_dtype_with_reason(args.dtype, phase="decode")
    except ValueError as e:
        print(f"error: --dtype: {e}", file=sys.stderr)
        return 2
    print(f"dtype: {dtype_name(dtype)} ({reason})")
    t0 = time.perf_counter()
    try:
        model, tokenizer = load_causal_lm(args.verifier, dtype, backend=args.backend)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.untrained:
        drafter = untrained_drafter(model)
        drafter_name = "untrained feature drafter - align one with jobs/build_drafter.py or jobs/distill.py"
    else:
        if args.drafter:
            drafter_dir = Path(args.drafter)
        elif args.verifier == DEFAULT_VERIFIER:
            drafter_dir = build_default()  # returns at once when it exists
        else:
            print(f"error: --drafter is required for verifier {args.verifier!r} (the default drafter is aligned to "
                  f"{DEFAULT_VERIFIER}); align one with jobs/distill.py, or pass --untrained", file=sys.stderr)
            return 2
        try:
            drafter = load_drafter(drafter_dir, dtype=dtype, verifier=model)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        drafter_name = str(drafter_dir)
    # A feature drafter reads the verifier's tapped states: the verifier keeps them from its own scoring passes.
    verifier = HFVerifier(model, tap_layers=getattr(drafter, "tap_layers", None))
    print(f"verifier: {args.verifier} ({type(model).__module__.split('.')[0]} forward)  drafter: {drafter_name}  "
          f"(loaded in {time.perf_counter() - t0:.1f} s)")

    if args.no_chat:
        prompt = tokenizer(args.prompt)["input_ids"]
    else:
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": args.prompt}], add_generation_prompt=True)
        prompt = prompt["input_ids"] if hasattr(prompt, "keys") else prompt
    stops = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    options = DecodeOptions(max_new_tokens=args.max_new_tokens, sampling=sampling, spec=spec, stop_token_ids=stops,
                            seed=args.seed)

    decoder = SpeculativeDecoder(drafter, verifier, decode=tokenizer.decode, costs_cache=state_dir() / "costs",
                                 recalibrate=args.recalibrate)
    warm = decoder.generate(prompt, options, max_new_tokens=4)  # warm-up: first-call overheads
    if decoder.costs_measured is not None:
        how = (f"measured in {warm.stats.calibration_s:.1f} s and kept" if decoder.costs_measured else
               "kept from an earlier run (--recalibrate measures it again)")
        print(f"cost model: {how} under {decoder.costs_cache}")
    # The speculative decode streams to the terminal (the first token's latency counts from the script's start:
    # imports, loading and the warm-up included); plain decoding then runs the same request for the comparison.
    print()
    t0 = time.perf_counter()
    stream = decoder.stream(prompt, options)
    text = TextStreamer(lambda ids: tokenizer.decode(ids, skip_special_tokens=True), [])
    first_token_s = None
    for tokens in stream:
        if first_token_s is None:
            first_token_s = time.perf_counter() - STARTED
        print(text.push(tokens), end="", flush=True)
    spec_s = time.perf_counter() - t0
    result = stream.result()
    print(text.push([], final=True) + "\n")
    t0 = time.perf_counter()
    plain = generate_plain(HFVerifier(model), prompt, options)  # no taps: plain decoding pays for none
    plain_s = time.perf_counter() - t0

    if first_token_s is not None:
        print(f"first token after {first_token_s:.1f} s (from the script's start: imports, loading, warm-up)")
    s = result.stats
    print(f"speculative: {len(result.tokens)} tokens in {spec_s:.2f} s ({len(result.tokens) / spec_s:.1f} tok/s), "
          f"tau={s.tau:.2f}, rounds={s.rounds}, drafter {s.drafter_s:.2f} s, verifier {s.verifier_s:.2f} s")
    print(f"choices: {s.choices}")
    print(f"plain:       {len(plain.tokens)} tokens in {plain_s:.2f} s ({len(plain.tokens) / plain_s:.1f} tok/s)")
    speedup = (len(result.tokens) / spec_s) / (len(plain.tokens) / plain_s)
    print(f"speed-up over plain decoding: {speedup:.2f}x")
    print("alpha per position: " + " ".join(f"{a:.2f}" for a in s.alpha))
    if sampling.greedy:
        return report_identity(model, prompt, plain.tokens, result.tokens, dtype)
    return 0


def _float32_copy_fits(model) -> bool:
    """Whether a float32 copy of ``model`` takes under half the memory available now."""
    import psutil  # installed with accelerate and peft

    return sum(p.numel() for p in model.parameters()) * 4 < psutil.virtual_memory().available / 2


def report_identity(model, prompt, plain: list[int], spec: list[int], dtype: torch.dtype) -> int:
    """At T=0 both decoders must agree. In reduced precision a batched (tree) forward rounds differently from a
    single-token one, so where the verifier's top logits tie within that rounding the argmax may flip. How far
    rounding moves them is measured, not assumed: this verifier's reduced-precision logits against a float32 copy
    of it over the same text (the plain decode up to the first difference); a flip whose gap is within twice that
    counts as a tie (a real fault shows up where one token leads by much more). Where a float32 copy would not fit
    in half the free memory, one rounding unit of the top logit stands in for the measurement."""
    i = next((i for i, (a, b) in enumerate(zip(plain, spec)) if a != b), None)
    if i is None and len(plain) == len(spec):
        print("identical to plain greedy decoding: yes")
        return 0
    i = min(len(plain), len(spec)) if i is None else i  # None: one stopped where the other went on
    ids = torch.tensor([prompt + plain[:i]])
    rows = slice(len(prompt) - 1, None)  # the rows that predict plain[0..i]
    with torch.no_grad():
        logits = model(ids).logits[0, rows].float()
        a, b = (plain[i], spec[i]) if i < min(len(plain), len(spec)) else logits[-1].topk(2).indices.tolist()
        gap = float((logits[-1, a] - logits[-1, b]).abs())
        noise, how = 0.0, ""  # how: the rounding measured in reduced precision ("" in float32)
        if dtype != torch.float32:
            if _float32_copy_fits(model):
                import copy

                reference = copy.deepcopy(model).float()
                exact = reference(ids).logits[0, rows].float()
                del reference
                top = logits.topk(2, dim=-1).indices  # [rows, 2]
                noise = float((logits.gather(-1, top) - exact.gather(-1, top)).abs().max())
                how = f"its top logits differ from float32 by up to {noise:.3g} over these {i + 1} positions"
            else:  # no room for a float32 copy: one unit of rounding of the top logit
                noise = float(logits[-1].abs().max()) * torch.finfo(dtype).eps
                how = f"no room for a float32 copy to measure it; one rounding unit of the top logit is {noise:.3g}"
    if how and gap <= 2 * noise:
        print(f"identical to plain greedy decoding up to token {i}, where the two tokens' logits differ by {gap:.3g}: "
              f"within {dtype} rounding ({how}); use --dtype float32 for a bit-exact comparison")
        return 0
    print(f"NOT identical to plain greedy decoding: first difference at token {i} (the two tokens' logits differ by "
          f"{gap:.3g}" + (f"; {dtype} rounding: {how})" if how else ")"))
    return 1


if __name__ == "__main__":
    sys.exit(main())
