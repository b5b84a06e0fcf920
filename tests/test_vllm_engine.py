"""Our feature drafter inside vLLM (speculative method ``dflash``) with the embedded default verifier.

Runs in the vLLM virtualenv (README: "vLLM engine (optional)"; CI: ``python -m pytest -m vllm`` there, with
SPECDIFF_REQUIRE_VLLM=1 so a missing vLLM fails instead of skipping). The main virtualenv skips it: vLLM is not
installed there. One module fixture trains a drafter on the prompts' greedy continuations, exports it and runs
``jobs/bench_vllm.py`` once on those prompts: four vLLM engines side by side (plain, n-gram, our drafter with and
without the plugin's copied candidate; about a minute each to load on 2 cores with ``enforce_eager``) and our
engine; every test but the plugin's reads that one run.
"""

import json
import os
import sys
import time
from pathlib import Path

import pytest
import torch

if os.environ.get("SPECDIFF_REQUIRE_VLLM") == "1":
    import vllm  # noqa: F401  (CI's vLLM virtualenv: a missing vLLM is a failure, not a skip)
else:
    pytest.importorskip("vllm")

from vllm_helpers import overfit_feature_drafter  # noqa: E402

from specdiff import HFVerifier, SpecConfig, SpeculativeDecoder, generate_plain  # noqa: E402
from specdiff.models.feature_drafter import save_feature_drafter  # noqa: E402
from specdiff.models.sources import default_verifier_path, load_causal_lm  # noqa: E402
from specdiff.prompts import chat_prompt_ids, load_prompts  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1200)]  # the fixture (three vLLM loads) counts here

GAMMA = 4
MAX_TOKENS = 24
DOMAINS = ("math", "code")
PER_DOMAIN = 2


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    threads = torch.get_num_threads()
    torch.set_num_threads(max(2, threads))  # conftest keeps tests at one thread; this one trains a real drafter
    clock = {"start": time.perf_counter()}
    try:
        verifier_dir = default_verifier_path()
        model, tokenizer = load_causal_lm(str(verifier_dir), "float32")
        # The bench's prompts (evaluation splits, chat template), in its order.
        prompts = [chat_prompt_ids(tokenizer, p) for d in DOMAINS for p in load_prompts(d, "eval", PER_DOMAIN)]
        # max_new_tokens with no stop token: the bench's vLLM engines may stop at EOS, which none of these reach.
        plain = [generate_plain(HFVerifier(model), p, max_new_tokens=MAX_TOKENS).tokens for p in prompts]
        clock["HF greedy"] = time.perf_counter()

        # A drafter that learnt these continuations (seconds), with a real draft vocabulary.
        drafter = overfit_feature_drafter(model, [p + o for p, o in zip(prompts, plain)], [len(p) for p in prompts],
                                          gamma=GAMMA, steps=120)
        root = tmp_path_factory.mktemp("vllm")
        save_feature_drafter(drafter, root / "drafter")
        clock["drafter trained"] = time.perf_counter()

        # Our engine with the same drafter, window and prompts (K=1: the argmax draft, as vLLM drafts; no prompt
        # lookup candidate, which vLLM's dflash method does not have: with it ours accepted 33 against vLLM's 9).
        decoder = SpeculativeDecoder(drafter, HFVerifier(model, tap_layers=drafter.tap_layers))
        k1 = SpecConfig(gamma=GAMMA, num_candidates=1, prompt_lookup=False)
        ours = [decoder.generate(p, max_new_tokens=MAX_TOKENS, spec=k1, seed=0) for p in prompts]
        clock["our engine"] = time.perf_counter()
    finally:
        torch.set_num_threads(threads)

    sys.path.insert(0, str(Path(__file__).parents[1] / "jobs"))
    import bench_vllm

    out = root / "bench"
    rc = bench_vllm.main(["--drafter", str(root / "drafter"), "--eager", "--domains", *DOMAINS,
                          "--prompts-per-domain", str(PER_DOMAIN), "--max-new-tokens", str(MAX_TOKENS),
                          "--gamma", str(GAMMA), "--concurrency", "2", "--lookup-ablation", "--outputs",
                          "--out", str(out)])
    clock["bench_vllm (4 engines)"] = time.perf_counter()
    marks = list(clock.items())
    print("stage seconds:", {k: round(t - t0, 1) for (_, t0), (k, t) in zip(marks, marks[1:])})
    report = json.loads((out / "bench_vllm.json").read_text())
    return {"rc": rc, "report": report, "out": out, "plain": plain, "ours": ours, "prompts": prompts, "root": root}


def test_speculative_output_equals_plain_decoding(runs):
    outputs = runs["report"]["outputs"]
    assert all(len(o) == MAX_TOKENS for o in runs["plain"])
    assert outputs["vllm_plain"] == runs["plain"]  # vLLM plain = HF greedy
    assert outputs["vllm_ours"] == runs["plain"]  # vLLM + our drafter (+ copied candidates) = the same tokens
    assert outputs["vllm_ours_nolookup"] == runs["plain"]


def test_counters_show_drafts_and_accepted_tokens(runs):
    for name in ("vllm_ours", "vllm_ours_nolookup"):  # per-request metrics: each engine's own counts
        m = runs["report"]["acceptance"][name]
        assert m.get("drafts", 0) > 0, m
        assert m.get("accepted_tokens", 0) > 0, m
    alone, ours = runs["report"]["acceptance"]["vllm_ours_nolookup"], runs["report"]["acceptance"]["vllm_ours"]
    assert alone["draft_tokens"] == GAMMA * alone["drafts"]  # vLLM's dflash: every window whole
    assert ours["draft_tokens"] <= GAMMA * ours["drafts"]  # the plugin's confidence cut may shorten them
    assert runs["report"]["acceptance"]["vllm_ngram"]["drafts"] > 0


def test_vllm_accepts_what_our_engine_accepts(runs):
    """Same drafter, same prompts, greedy drafts and greedy acceptance: vLLM and our engine should accept about
    the same number of tokens. A drafter vLLM misreads (untrained: 0 accepted) falls far short; a tap shifted by
    one layer would not (neighbouring layers are alike: 74 vs 77 accepted, measured; test_export_vllm pins the ids).
    Not exactly equal: the two engines' float32 kernels differ, and vLLM's last round is cut at max_tokens. 120
    training steps: at 40 the drafter accepted 9 of 96 tokens in both engines, too few to compare (ours, measured:
    120 steps 76 accepted in 20 rounds; 80 steps 27)."""
    ours_plain = [r.tokens for r in runs["ours"]]
    assert ours_plain == runs["plain"]  # our engine at T=0 = HF greedy
    ours_accepted = sum(r.stats.accepted for r in runs["ours"])
    acceptance = runs["report"]["acceptance"]["vllm_ours_nolookup"]  # the drafter alone, as our engine here
    vllm_accepted = acceptance["accepted_tokens"]
    print(f"accepted: vLLM {vllm_accepted} ({acceptance['drafts']} drafts), ours "
          f"{ours_accepted} ({sum(r.stats.rounds for r in runs['ours'])} rounds)")
    assert ours_accepted >= len(runs["ours"]), ours_accepted  # the drafter did learn something (untrained: 0)
    assert abs(vllm_accepted - ours_accepted) <= max(4, 0.25 * ours_accepted), (vllm_accepted, ours_accepted)


def test_bench_puts_vllm_rows_beside_ours(runs):
    """jobs/bench_vllm.py: three vLLM engines kept side by side (plain, n-gram, our drafter) and our engine, on the
    same prompts in one run; counters attributed per engine; every output equals vLLM plain at T=0."""
    report = runs["report"]
    assert runs["rc"] == 0 and report["vllm_outputs_equal_plain"], report["outputs_differing_from_vllm_plain"]
    assert set(report["outputs_differing_from_vllm_plain"].values()) == {0}  # ours too: plain and speculative
    methods = {"vllm_plain", "vllm_ngram", "vllm_ours", "vllm_ours_nolookup", "plain", "specdiff"}
    assert {(r["domain"], r["method"]) for r in report["rows"]} == {(d, m) for d in DOMAINS for m in methods}
    assert all(r["tokens_per_s"] > 0 for r in report["rows"])
    # Per-engine counters (vLLM's metrics are process-wide): plain drafts nothing; the drafter learnt these prompts.
    assert "vllm_plain" not in report["acceptance"]
    assert set(report["throughput_tokens_per_s"]) == {"vllm_plain", "vllm_ngram", "vllm_ours", "vllm_ours_nolookup"}
    assert "| math | vllm_ours |" in (runs["out"] / "bench_vllm.md").read_text()


def test_plugin_gets_copies_accepted_where_an_untrained_drafter_gets_none(runs):
    """specdiff.vllm.plugin inside vLLM (loaded through its entry point in vLLM's worker process): with an untrained
    drafter whose marginals are flat (final norm zeroed: every top-1 probability 1/V_draft), vLLM alone would accept
    none of its drafts; the copied candidate still gets tokens accepted on these prompts (our lookup replayed offline
    on their greedy outputs: 25 over the four), the confidence cut (export default) removes every drafter window, so
    only the steps with a copy verify anything (variable-length drafts through vLLM's scheduler), and every output
    stays greedy decoding's."""
    from vllm import LLM
    from vllm import SamplingParams as VllmSampling
    from vllm.inputs import TokensPrompt

    import bench_vllm
    from specdiff.vllm.export import export_vllm
    from specdiff.models.feature_drafter import build_feature_drafter

    verifier_dir = default_verifier_path()
    model, _ = load_causal_lm(str(verifier_dir), "float32")
    flat = build_feature_drafter(model, max_gamma=GAMMA, seed=0, init_from_verifier=False)
    with torch.no_grad():
        flat.model.norm.weight.zero_()  # hidden states 0: logits 0, uniform marginals
    save_feature_drafter(flat, runs["root"] / "random")
    export = export_vllm(runs["root"] / "random", runs["root"] / "random-vllm", verifier_dir=verifier_dir)
    assert export.prompt_lookup == (2, 4) and export.min_draft_confidence is not None
    llm = LLM(model=str(verifier_dir), dtype="float32", enforce_eager=True, max_model_len=2048, seed=0,
              speculative_config=export.speculative_config(GAMMA), per_request_spec_decode_metrics="summary")
    results = llm.generate([TokensPrompt(prompt_token_ids=p) for p in runs["prompts"]],
                           VllmSampling(temperature=0.0, max_tokens=MAX_TOKENS), use_tqdm=False)
    assert [list(r.outputs[0].token_ids) for r in results] == runs["plain"]
    counts = bench_vllm.spec_counters(results)
    print("flat drafter + copied candidates:", counts)
    assert counts["drafts"] > 0 and counts["accepted_tokens"] >= 5, counts
    steps = len(results) * MAX_TOKENS - counts["accepted_tokens"]  # verification steps (each emits accepted + 1)
    assert counts["drafts"] < steps / 2, (counts, steps)  # only the copy steps drafted (uncut: every step)
