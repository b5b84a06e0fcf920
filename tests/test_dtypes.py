"""The one dtype policy (specdiff.models.dtypes): "auto" follows the CPU it finds, SPECDIFF_DTYPE forces each path, an
explicit name wins, bad names are errors that name the value; the loaders of the jobs, distillation and serving
all resolve "auto" through it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from helpers import tiny_llama
from specdiff import HFVerifier, SamplingParams, generate_plain
from specdiff.models import dtypes
from specdiff.models.dtypes import resolve_dtype, resolve_dtype_with_reason

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    """The host's overrides must not decide these tests."""
    monkeypatch.delenv(dtypes.ENV_DTYPE, raising=False)
    monkeypatch.delenv(dtypes.ENV_FAKE_NO_BF16, raising=False)


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    """A tiny random Llama over the byte tokenizer (259 ids), saved with that tokenizer."""
    from specdiff.serving.models import byte_tokenizer

    folder = tmp_path_factory.mktemp("tiny_verifier")
    tokenizer = byte_tokenizer()
    tiny_llama(len(tokenizer), seed=0).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("forced", ["float32", "bfloat16"])
def test_env_forces_each_path_and_a_decode_runs_in_it(forced, monkeypatch, tiny_folder):
    from specdiff.distill.trajectories import load_verifier_model
    from specdiff.models.sources import load_causal_lm
    from specdiff.serving.config import ModelSource
    from specdiff.serving.models import load_verifier

    monkeypatch.setenv(dtypes.ENV_DTYPE, forced)
    want = getattr(torch, forced)
    assert resolve_dtype_with_reason("auto") == (want, f"auto: forced by SPECDIFF_DTYPE={forced}")

    jobs_model, tokenizer = load_causal_lm(str(tiny_folder))  # the jobs' loader (generate.py, bench.py)
    distill_model = load_verifier_model(tiny_folder, "auto")  # the teacher's and evaluation's loader
    served = load_verifier(ModelSource(verifier=str(tiny_folder))).model  # serving's loader
    for model in (jobs_model, distill_model, served):
        assert next(model.parameters()).dtype == want
    with torch.no_grad():
        assert jobs_model(torch.tensor([[1, 2, 3]])).logits.dtype == want

    prompt = tokenizer.encode("Hello", add_special_tokens=False)
    out = generate_plain(HFVerifier(jobs_model), prompt, max_new_tokens=6, sampling=SamplingParams(0.0))
    assert len(out.tokens) == 6 and all(0 <= t < len(tokenizer) for t in out.tokens)


def test_auto_follows_the_cpu(monkeypatch):
    monkeypatch.setattr(dtypes, "cpu_has_native_bf16", lambda: False)
    dtype, reason = resolve_dtype_with_reason("auto")
    assert dtype == torch.float32 and reason.startswith("auto: no native bf16 on this CPU")
    assert resolve_dtype("auto", phase="decode") == torch.float32
    monkeypatch.setattr(dtypes, "cpu_has_native_bf16", lambda: True)
    dtype, reason = resolve_dtype_with_reason("auto")
    assert dtype == torch.bfloat16 and reason.startswith("auto: CPU has native bf16")
    assert resolve_dtype("auto", phase="decode") == torch.bfloat16
    assert resolve_dtype("auto", device="cuda") == torch.bfloat16  # no GPU needed to decide for one


def test_fake_no_bf16_env_simulates_a_cpu_without_it(monkeypatch):
    monkeypatch.setattr(dtypes, "cpu_bf16_flags", lambda: ("avx512_bf16",))
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    assert dtypes.cpu_has_native_bf16() and resolve_dtype("auto") == torch.bfloat16
    monkeypatch.setenv(dtypes.ENV_FAKE_NO_BF16, "1")
    assert not dtypes.cpu_has_native_bf16() and resolve_dtype("auto") == torch.float32


def test_bf16_flag_needs_avx512_kernels_on_x86(monkeypatch):
    monkeypatch.setattr(dtypes, "cpu_bf16_flags", lambda: ("avx512_bf16",))
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")  # e.g. ATEN_CPU_CAPABILITY=avx2
    assert not dtypes.cpu_has_native_bf16()
    monkeypatch.setattr(dtypes, "cpu_bf16_flags", lambda: ())
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")  # AVX-512 without bf16
    assert not dtypes.cpu_has_native_bf16()


def test_explicit_wins_over_env_and_cpu(monkeypatch):
    monkeypatch.setenv(dtypes.ENV_DTYPE, "bfloat16")
    monkeypatch.setattr(dtypes, "cpu_has_native_bf16", lambda: True)
    assert resolve_dtype_with_reason("float32") == (torch.float32, "explicit")
    assert resolve_dtype(torch.float32) == torch.float32
    monkeypatch.setenv(dtypes.ENV_DTYPE, "float32")
    assert resolve_dtype("bfloat16", phase="decode") == torch.bfloat16
    assert resolve_dtype("float16") == torch.float16


@pytest.mark.parametrize("call, named", [
    (lambda: resolve_dtype("fp64"), "'fp64'"),
    (lambda: resolve_dtype("bf16"), "'bf16'"),
    (lambda: resolve_dtype(torch.int64), "torch.int64"),
    (lambda: resolve_dtype("auto", phase="prefill"), "'prefill'"),
])
def test_bad_names_raise_and_name_the_value(call, named):
    with pytest.raises(ValueError, match=named):
        call()


def test_bad_env_value_names_the_variable(monkeypatch):
    monkeypatch.setenv(dtypes.ENV_DTYPE, "half")
    with pytest.raises(ValueError, match="SPECDIFF_DTYPE.*'half'"):
        resolve_dtype("auto")
    assert resolve_dtype("float32") == torch.float32  # explicit never reads it


def test_models_parse_dtype_is_the_same_helper():
    from specdiff.models.sources import DTYPES, parse_dtype

    assert parse_dtype is resolve_dtype and DTYPES is dtypes.DTYPES
    assert parse_dtype("float32") == torch.float32 and parse_dtype("bfloat16") == torch.bfloat16
    with pytest.raises(ValueError, match="'float64'"):
        parse_dtype("float64")


def test_configs_accept_auto_and_default_to_it():
    from pydantic import ValidationError

    from specdiff.distill.config import VerifierSection

    assert VerifierSection(path="v").dtype == "auto"
    assert VerifierSection(path="v", dtype="float32").dtype == "float32"
    with pytest.raises(ValidationError, match="float64"):
        VerifierSection(path="v", dtype="float64")


def test_training_autocast_on_cpu_only_for_wide_drafters_with_native_bf16(monkeypatch):
    monkeypatch.setattr(dtypes, "cpu_has_native_bf16", lambda: True)
    assert not dtypes.train_autocast_bf16("auto", "cpu")  # width unknown
    assert not dtypes.train_autocast_bf16("auto", "cpu", 32)  # measured slower for tiny drafters on a bf16 CPU
    assert dtypes.train_autocast_bf16("auto", "cpu", 576)  # measured faster for the default feature drafter
    monkeypatch.setattr(dtypes, "cpu_has_native_bf16", lambda: False)
    assert not dtypes.train_autocast_bf16("auto", "cpu", 576)  # emulated bf16: 5-7x slower
    assert dtypes.train_autocast_bf16("bf16", "cpu") and not dtypes.train_autocast_bf16("fp32", "cpu")
    with pytest.raises(ValueError, match="'half'"):
        dtypes.train_autocast_bf16("half")


def test_bench_records_the_resolved_dtype(monkeypatch, capsys):
    from specdiff.cli import bench

    monkeypatch.setattr(dtypes, "cpu_has_native_bf16", lambda: False)
    args = bench.parse_args([])
    assert args.dtype == "float32" and args.dtype_reason.startswith("auto: no native bf16")
    assert bench.parse_args(["--dtype", "bfloat16"]).dtype == "bfloat16"
    with pytest.raises(SystemExit):
        bench.parse_args(["--dtype", "fp8"])
    assert "'fp8'" in capsys.readouterr().err


def test_generate_rejects_a_bad_dtype_before_loading_anything(capsys):
    sys.path.insert(0, str(REPO / "jobs"))
    import generate  # the old command's thin file: the same parser

    with pytest.raises(SystemExit) as exit_:
        generate.main(["--dtype", "fp8"])
    assert exit_.value.code == 2 and "'fp8'" in capsys.readouterr().err


def test_generate_identity_report_tells_a_rounding_tie_from_a_fault(capsys, monkeypatch):
    # `specdiff generate`'s T=0 check: the same tokens pass; a flip to a token far behind the argmax fails; a flip
    # whose logit gap is within the measured bf16-vs-float32 rounding counts as a tie (reported, exit 0).
    from specdiff.cli import generate

    model = tiny_llama(64, seed=3, init_std=0.5).to(torch.bfloat16)
    prompt = [5, 9, 2]
    with torch.no_grad():
        plain = model.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False, pad_token_id=0)[0, 3:]
        plain = plain.tolist()
        logits = model(torch.tensor([prompt + plain[:4]])).logits[0, -1].float()
    assert generate.report_identity(model, prompt, plain, list(plain), torch.bfloat16) == 0
    assert "identical to plain greedy decoding: yes" in capsys.readouterr().out
    far = int(logits.argmin())  # the verifier's least likely token at position 4
    assert generate.report_identity(model, prompt, plain, plain[:4] + [far, 1], torch.bfloat16) == 1
    assert "NOT identical" in capsys.readouterr().out
    order = logits.argsort(descending=True)
    gaps = logits[order[0]] - logits[order[1:]]
    near = int(order[1 + int(gaps.argmin())])  # the runner-up
    code = generate.report_identity(model, prompt, plain, plain[:4] + [near, 1], torch.bfloat16)
    out = capsys.readouterr().out
    assert (code == 0) == ("within torch.bfloat16 rounding" in out)
    assert "differ from float32 by up to" in out  # measured against a float32 copy (a tiny model fits)
    # No room for a float32 copy: one rounding unit of the top logit stands in; the far flip still fails.
    monkeypatch.setattr(generate, "_float32_copy_fits", lambda model: False)
    assert generate.report_identity(model, prompt, plain, plain[:4] + [far, 1], torch.bfloat16) == 1
    generate.report_identity(model, prompt, plain, plain[:4] + [near, 1], torch.bfloat16)
    assert "differ from float32" not in capsys.readouterr().out
