"""The install is split: the core (``pip install specdiff``: the decoder and the vLLM export) needs only torch,
safetensors, tokenizers, jinja2, pydantic, pyyaml and numpy; each adapter comes with an extra (pyproject.toml):
``hf`` (transformers models, the default verifier's GGUF conversion), ``train`` (specdiff.distill: Ray Data + Ray
Train), ``serve`` (specdiff.serving: Ray Serve), ``registry`` (specdiff.registry: MLflow), ``all`` (the platform).

A missing framework becomes one line naming the extra to install, at the adapter's door, instead of a bare
``No module named ...`` from deep inside it: ``missing_extra`` for a module-level import that failed, ``require``
before a function-level one. ``require`` only looks the modules up (``importlib.util.find_spec`` of a top-level
name imports nothing), so it costs nothing where they are installed.
"""

from __future__ import annotations

import importlib.util


def _message(extra: str, what: str, modules: list[str]) -> str:
    verb = "is" if len(modules) == 1 else "are"
    return (f"{what} needs {', '.join(modules)}, which {verb} not installed: pip install 'specdiff[{extra}]' "
            f"(from a checkout: pip install -e '.[{extra}]')")


def installed(module: str) -> bool:
    """A top-level module is importable as a regular package or module. A bare folder of that name on sys.path (a
    namespace package: ``/tmp/ray`` is Ray's temp dir, and ``python -c`` puts the working directory first) is not."""
    spec = importlib.util.find_spec(module)
    return spec is not None and spec.origin is not None


def missing_extra(extra: str, what: str, err: ModuleNotFoundError) -> ImportError:
    """The error for an adapter module whose framework import failed (``raise missing_extra(...) from err``)."""
    name = (err.name or "a module").split(".")[0]
    return ImportError(_message(extra, what, [name]), name=err.name)


def require(extra: str, what: str, *modules: str) -> None:
    """Raise ``ImportError`` naming ``pip install 'specdiff[extra]'`` if any of the top-level ``modules`` is not
    installed."""
    absent = [m for m in modules if not installed(m)]
    if absent:
        raise ImportError(_message(extra, what, absent), name=absent[0])
