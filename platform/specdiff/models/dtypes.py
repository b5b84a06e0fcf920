"""The one dtype policy of the platform: which floating-point type weights and activations use.

    resolve_dtype("auto")                    # bfloat16 on a GPU or a CPU with native bf16, else float32
    resolve_dtype("float32")                 # an explicit name (or a torch.dtype) always wins
    dtype, reason = resolve_dtype_with_reason("auto", phase="decode")

Why "auto" looks at the CPU: machines change between runs. On a CPU with native bf16 instructions (AVX512_BF16 or
AMX_BF16 on x86, BF16 on Arm) bf16 GEMMs run about twice as fast as float32 from 16 rows up; on an AVX2-only CPU
bf16 is emulated and every batched phase is 5-7x slower than float32. Measured, one thread, Linear 576->1536,
GFLOP/s at 1 / 16 / 64 rows:
  2-core AMD EPYC, AVX512 + avx512_bf16:  float32 9 / 33 / 44,    bfloat16 9 / 74 / 101
  2-core AMD EPYC, AVX2 only (DESIGN.md):  float32 21 / 70 / 109,  bfloat16 14-16 at every row count

Phases: "batched" (teacher sampling, training, evaluation, tree verification: many rows per forward) and "decode"
(batch-1 plain decoding). Both follow the same rule. Batch-1 decoding of SmolLM2-135M is memory- and overhead-bound:
on the AVX512_BF16 machine fp32 and bf16 tie (6.0-7.2 against 6.5-7.2 tok/s, loaded machine, one thread) while a
64-token forward is 1.6x faster in bf16 (206 against 331 ms); on the AVX2 machine bf16 decoded faster (20.0
against 15.1 tok/s) but lost 5-7x on batched work. Speculative decoding verifies many rows per round, and a speed
comparison is only fair when plain and speculative decoding use one dtype, so "decode" gets no rule of its own.

Overrides (for tests and for forcing a path by hand):
  SPECDIFF_DTYPE=auto|float32|bfloat16|float16  decides what "auto" means (an explicit name still wins);
  SPECDIFF_FAKE_NO_BF16=1                       makes ``cpu_has_native_bf16()`` report False.
Pure torch: no Ray, MLflow or transformers imports.
"""

from __future__ import annotations

import os

import torch

from specdiff.runtime.machine_cache import cpuinfo_value

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
PHASES = ("batched", "decode")
ENV_DTYPE = "SPECDIFF_DTYPE"
ENV_FAKE_NO_BF16 = "SPECDIFF_FAKE_NO_BF16"
_BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")  # x86 (/proc/cpuinfo "flags"), Arm ("Features")


def cpu_bf16_flags() -> tuple[str, ...]:
    """The bf16 flags the CPU advertises in /proc/cpuinfo (empty where the file is missing, e.g. macOS)."""
    flags = cpuinfo_value("flags", "Features").split()
    return tuple(f for f in _BF16_FLAGS if f in flags)


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bf16 natively (not by conversion to float32): a bf16 flag in /proc/cpuinfo and,
    on x86, torch dispatching AVX-512 kernels (``torch.backends.cpu.get_cpu_capability()``; ATEN_CPU_CAPABILITY
    can lower it). ``SPECDIFF_FAKE_NO_BF16=1`` makes it False (tests); tests may also monkeypatch it."""
    if os.environ.get(ENV_FAKE_NO_BF16) == "1":
        return False
    flags = cpu_bf16_flags()
    if any(f in flags for f in ("avx512_bf16", "amx_bf16")):
        return torch.backends.cpu.get_cpu_capability().startswith("AVX512")
    return "bf16" in flags


def _named(name: str, where: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"{where} must be 'auto' or one of {sorted(DTYPES)}, got {name!r}")
    return DTYPES[name]


def resolve_dtype_with_reason(name: str | torch.dtype = "auto", *, phase: str = "batched",
                              device: str | torch.device = "cpu") -> tuple[torch.dtype, str]:
    """(dtype, why) for ``name`` on ``device`` in ``phase``; see the module docstring for the rule."""
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {list(PHASES)}, got {phase!r}")
    if isinstance(name, torch.dtype):
        if name not in DTYPES.values():
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {name!r}")
        return name, "explicit"
    if not isinstance(name, str):
        raise ValueError(f"dtype must be a name or a torch.dtype, got {name!r}")
    if name != "auto":
        return _named(name, "dtype"), "explicit"
    forced = os.environ.get(ENV_DTYPE, "auto")
    if forced != "auto":
        return _named(forced, ENV_DTYPE), f"auto: forced by {ENV_DTYPE}={forced}"
    kind = torch.device(device).type
    if kind == "cuda":
        return torch.bfloat16, "auto: CUDA device"
    if kind != "cpu":
        return torch.float32, f"auto: {kind} device, float32"
    flags = ", ".join(cpu_bf16_flags()) or "none"
    seen = f"torch {torch.backends.cpu.get_cpu_capability()} kernels, bf16 flags: {flags}"
    if os.environ.get(ENV_FAKE_NO_BF16) == "1":
        seen += f", {ENV_FAKE_NO_BF16}=1"
    if cpu_has_native_bf16():
        return torch.bfloat16, f"auto: CPU has native bf16; {seen}"
    return torch.float32, f"auto: no native bf16 on this CPU; {seen}"


def resolve_dtype(name: str | torch.dtype = "auto", *, phase: str = "batched",
                  device: str | torch.device = "cpu") -> torch.dtype:
    """The dtype for ``name`` ("auto", "float32", "bfloat16", "float16" or a torch.dtype)."""
    return resolve_dtype_with_reason(name, phase=phase, device=device)[0]


AUTOCAST_MIN_HIDDEN = 256  # narrower drafters train faster in fp32 even on a bf16 CPU (casts dominate)


def train_autocast_bf16(precision: str, device: str | torch.device = "cpu", hidden_size: int | None = None) -> bool:
    """Whether a training step runs under bf16 autocast for ``precision`` ("auto", "fp32", "bf16").

    "auto" means a GPU that supports bf16, or a CPU with native bf16 (``cpu_has_native_bf16``) training a drafter
    at least ``AUTOCAST_MIN_HIDDEN`` wide (``hidden_size``; None: unknown, no autocast). Measured on a 2-core AMD
    EPYC with AVX512_BF16 (torch 2.13): a step of the tiny recipe's drafter (hidden 32) took 117 ms under
    bf16 autocast against 41-52 ms in fp32 (casts dominate such small matmuls); a step of the default feature
    drafter (hidden 576, 8 trajectories x 48 blocks, one thread) 1.44 s against 2.07 s, and its held-out expected
    streak after the default recipe's 600 steps was 1.09 (fp32: see docs/feature_drafter.md). Without native bf16
    (AVX2 only) bf16 is emulated and 5-7x slower: never there."""
    if precision not in ("auto", "fp32", "bf16"):
        raise ValueError(f"precision must be one of ['auto', 'bf16', 'fp32'], got {precision!r}")
    if precision != "auto":
        return precision == "bf16"
    if torch.device(device).type == "cuda":
        return torch.cuda.is_bf16_supported()
    return hidden_size is not None and hidden_size >= AUTOCAST_MIN_HIDDEN and cpu_has_native_bf16()


def dtype_name(dtype: torch.dtype) -> str:
    """"bfloat16" for torch.bfloat16: the name configs and records use."""
    return str(dtype).removeprefix("torch.")
