"""Which verifier a drafter was aligned to: a name, a version and a digest of its config and weight files.

The distillation job writes this record into the drafter's meta JSON and into every teacher trajectory; the registry
tags versions with its digest and refuses a pair whose digests differ. Standard library only.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from pathlib import Path

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt")


@dataclass(frozen=True)
class VerifierRecord:
    """Which verifier a drafter was aligned to; ``digest`` is sha256 over its config and weight files."""

    name: str
    version: str
    digest: str
    path: str

    def to_dict(self) -> dict:
        return asdict(self)


def verifier_record(path: str | Path, name: str | None = None, version: str = "unversioned") -> VerifierRecord:
    path = Path(path)
    files = sorted(f for f in path.iterdir() if f.name == "config.json" or f.suffix in WEIGHT_SUFFIXES)
    if not any(f.suffix in WEIGHT_SUFFIXES for f in files):
        raise ValueError(f"verifier.path must hold model weights ({', '.join(WEIGHT_SUFFIXES)}), got {str(path)!r}")
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode())
        with f.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return VerifierRecord(name=name or path.name, version=version, digest="sha256:" + h.hexdigest(), path=str(path))
