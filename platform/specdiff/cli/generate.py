"""``specdiff generate``: speculative decoding beside plain decoding, side by side in one run.

    specdiff generate --prompt "Write a Python function that checks whether a number is prime."
    specdiff generate --untrained --max-new-tokens 8      # no build: unaligned drafter layers

Defaults: the embedded SmolLM2-135M-Instruct verifier, the dtype this machine runs fastest (``--dtype auto``:
bfloat16 on a GPU or a CPU with native bf16, else float32), greedy decoding (T=0), adaptive γ and K. The drafter is
``--drafter DIR`` (a folder written by ``specdiff distill`` / ``save_drafter``), else the default drafter in the
state directory, which the first run builds (``specdiff build``: within a 15-minute budget, a slower CPU trains
fewer of the recipe's steps; later runs start in seconds). ``--drafter untrained`` (or ``--untrained``) skips that
and drafts with verifier layers that were never aligned (expect τ near 1 and a slowdown). At T=0 the command checks
that both outputs are identical.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from specdiff.cli.flags import DEFAULT_DRAFTER, UNTRAINED, add_decode_flags, add_model_flags, drafter_choice, resolve_device

PROMPT = "Write a Python function that checks whether a number is prime."


def add_parser(sub, name: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help="generate with speculative decoding beside plain decoding",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompt", default=PROMPT, help="the request (default: %(default)r)")
    p.add_argument("--no-chat", action="store_true", help="feed the prompt raw instead of through the chat template")
    add_model_flags(p)
    add_decode_flags(p)
    g = p.add_argument_group("generate")
    g.add_argument("--draft-temperature", type=float, default=None,
                   help="temperature the candidates are sampled at from the drafter's marginals (default: "
                   "SpecConfig's, 1.5)")
    g.add_argument("--top-p", type=float, default=1.0, help="the verifier's nucleus (default: %(default)s)")
    g.add_argument("--backend", default="auto", choices=("auto", "specdiff", "transformers"),
                   help="verifier forward and tokenizer: specdiff's lean Llama forward (no transformers import: starts "
                   "~6 s sooner), transformers, or auto (specdiff where the model is a Llama-family folder, else "
                   "transformers; default)")
    g.add_argument("--recalibrate", action="store_true", help="measure the adaptive policy's cost model again (it is "
                   "kept per machine under $SPECDIFF_HOME/costs; redo it if the machine was busy when it was measured)")
    return p


def run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    device = resolve_device(parser, args)  # before anything loads
    import torch

    from specdiff import DecodeOptions, HFVerifier, SamplingParams, SpecConfig, SpeculativeDecoder, generate_plain, load_drafter
    from specdiff.cli import STARTED
    from specdiff.core.text import TextStreamer
    from specdiff.lifecycle.build import build_default, untrained_drafter
    from specdiff.models.dtypes import dtype_name, resolve_dtype_with_reason
    from specdiff.models.sources import DEFAULT_VERIFIER, load_causal_lm, state_dir

    choice = drafter_choice(args)
    if choice == DEFAULT_DRAFTER and args.verifier != DEFAULT_VERIFIER:
        parser.error(f"--drafter is required for verifier {args.verifier!r} (the default drafter is aligned to "
                     f"{DEFAULT_VERIFIER}); align one with `specdiff distill`, or pass --drafter untrained")
    sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p)
    spec = SpecConfig(gamma=args.gamma, num_candidates=args.num_candidates,
                      **({} if args.draft_temperature is None else {"draft_temperature": args.draft_temperature}))
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
    model.to(device)
    if choice == UNTRAINED:
        drafter = untrained_drafter(model)
        drafter_name = "untrained feature drafter - align one with `specdiff build` or `specdiff distill`"
    else:
        if choice == DEFAULT_DRAFTER:
            from specdiff.cli.build import offline_env, render

            offline_env()
            with render() as progress:
                drafter_dir = build_default(progress=progress)  # returns at once when it exists
        else:
            drafter_dir = Path(choice)
        try:
            drafter = load_drafter(drafter_dir, dtype=dtype, verifier=model)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        drafter_name = str(drafter_dir)
    if device != "cpu" and isinstance(getattr(drafter, "model", None), torch.nn.Module):
        drafter.model.to(device)
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


def report_identity(model, prompt, plain: list[int], spec: list[int], dtype) -> int:
    """At T=0 both decoders must agree. In reduced precision a batched (tree) forward rounds differently from a
    single-token one, so where the verifier's top logits tie within that rounding the argmax may flip. How far
    rounding moves them is measured, not assumed: this verifier's reduced-precision logits against a float32 copy
    of it over the same text (the plain decode up to the first difference); a flip whose gap is within twice that
    counts as a tie (a real fault shows up where one token leads by much more). Where a float32 copy would not fit
    in half the free memory, one rounding unit of the top logit stands in for the measurement."""
    import torch

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

