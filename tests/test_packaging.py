"""The install split (pyproject.toml): every third-party module that the package, its jobs and its Serve apps import,
at module level or inside a function, is declared by the core or by an extra of the part that imports it. So the
core installs alone (no Ray, no MLflow, no transformers), and an import nobody declared fails here, not on a user's
machine that happens to lack what this one has."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+ (the project's virtualenvs)

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = REPO / "pyproject.toml"
CORE = "core"

# What each part may import beyond the core: the longest matching prefix of a module's dotted name wins.
HOME: dict[str, tuple[str, ...]] = {
    "specdiff": ("hf",),  # the core; transformers only inside functions that load Hugging Face models
    "specdiff.prompts": ("hf", "train"),  # HumanEval's code set, read by the jobs that train and bench
    "specdiff.distill": ("train",),
    "specdiff.distill.tracking": ("train", "registry"),  # tracking.backend=mlflow
    "specdiff.distill.teacher_vllm": ("train", "vllm-cpu"),
    "specdiff.serving": ("serve",),
    "specdiff.serving.vllm_app": ("serve", "vllm-cpu"),  # Ray Serve LLM runs vLLM
    "specdiff.registry": ("registry",),
    "specdiff.lifecycle": ("train", "registry"),  # re-alignment, the evaluation handed to the registry
    "specdiff.lifecycle.build": ("train", "registry"),  # the default drafter's recipe: distill, then register
    "specdiff.cli": ("hf",),  # argparse, and the decode path's imports (generate: the core and transformers)
    "specdiff.cli.build": ("train", "registry"),
    "specdiff.cli.bench": ("all",),  # bench rows of every kind, MLflow logging
    "specdiff.cli.distill": ("train",),
    "specdiff.cli.registry": ("registry", "train"),
    "specdiff.cli.realign": ("train", "registry"),
    "specdiff.cli.ui": ("registry",),
    "specdiff.vllm.plugin": ("vllm-cpu",),  # loaded by vLLM, inside vLLM's virtualenv
    "jobs": ("all",),
    "jobs.bench_vllm": ("all", "vllm-cpu"),
    "serve_apps": ("all",),
}
SOURCES = {"specdiff": REPO / "platform" / "specdiff", "jobs": REPO / "jobs", "serve_apps": REPO / "serve_apps"}
# import name -> the distributions that provide it (default: the name, "_" spelled "-")
DISTRIBUTIONS = {"yaml": {"pyyaml"}, "vllm": {"vllm", "vllm-cpu"}}
# a Ray module -> the Ray extra that installs what it needs
RAY_EXTRAS = {"ray.serve": "serve", "ray.train": "train", "ray.data": "data", "ray.job_submission": "default"}


def parse_requirement(text: str) -> tuple[str, set[str]]:
    """'ray[serve,data]>=2.40' -> ('ray', {'serve', 'data'}) (names normalized)."""
    match = re.match(r"\s*([A-Za-z0-9._-]+)\s*(?:\[([^\]]*)\])?", text)
    assert match, text
    name = re.sub(r"[-_.]+", "-", match.group(1)).lower()
    return name, {e.strip() for e in (match.group(2) or "").split(",") if e.strip()}


def declared(project: dict) -> dict[str, dict[str, set[str]]]:
    """extra (or 'core') -> {distribution: its extras}, self-references (specdiff[hf]) expanded."""
    raw = {CORE: project.get("dependencies", []), **project.get("optional-dependencies", {})}
    name = project["name"]

    def expand(extra: str, seen: frozenset) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for req in raw[extra]:
            dist, extras = parse_requirement(req)
            if dist == name:
                for sub in extras - seen:
                    for d, e in expand(sub, seen | {sub}).items():
                        out.setdefault(d, set()).update(e)
            else:
                out.setdefault(dist, set()).update(extras)
        return out

    core = expand(CORE, frozenset({CORE}))
    result = {CORE: core}
    for extra in raw:
        if extra != CORE:
            merged = {d: set(e) for d, e in core.items()}  # every extra installs the core too
            for d, e in expand(extra, frozenset({extra})).items():
                merged.setdefault(d, set()).update(e)
            result[extra] = merged
    return result


def third_party_imports(path: Path, local: set[str]) -> list[tuple[str, int]]:
    """(dotted module, line) of every absolute import in the file, function bodies included, minus the standard
    library, the project itself and modules beside it."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for dotted in names:
            top = dotted.split(".")[0]
            if top in sys.stdlib_module_names or top in local or top == "specdiff":
                continue
            found.append((dotted, node.lineno))
    return found


def home(module: str) -> tuple[str, ...]:
    best = max((p for p in HOME if module == p or module.startswith(p + ".")), key=len)
    return HOME[best]


def unsatisfied(dotted: str, allowed: dict[str, set[str]]) -> str | None:
    """Why ``dotted`` is not covered by the ``allowed`` distributions, or None."""
    top = dotted.split(".")[0]
    dists = DISTRIBUTIONS.get(top, {top.replace("_", "-").lower()})
    hits = [d for d in dists if d in allowed]
    if not hits:
        return f"{' or '.join(sorted(dists))} is not declared"
    ray_extra = next((e for m, e in RAY_EXTRAS.items() if dotted == m or dotted.startswith(m + ".")), None)
    if top == "ray" and ray_extra and ray_extra not in allowed["ray"]:
        return f"it needs ray[{ray_extra}], declared: ray[{','.join(sorted(allowed['ray']))}]"
    return None


def problems(project: dict) -> list[str]:
    deps = declared(project)
    out = []
    for root, folder in SOURCES.items():
        local = {p.stem for p in folder.glob("*.py")} if root != "specdiff" else set()
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            module = ".".join([root, *parts])
            extras = home(module)
            missing_extras = [e for e in extras if e not in deps]
            assert not missing_extras, f"HOME names extras pyproject.toml lacks: {missing_extras}"
            allowed: dict[str, set[str]] = {}
            for extra in (CORE, *extras):
                for d, e in deps[extra].items():
                    allowed.setdefault(d, set()).update(e)
            for dotted, line in third_party_imports(path, local):
                why = unsatisfied(dotted, allowed)
                if why:
                    where = path.relative_to(REPO)
                    out.append(f"{where}:{line} imports {dotted}: {why} in {' + '.join((CORE, *extras))}")
    return out


@pytest.fixture(scope="module")
def project() -> dict:
    return tomllib.loads(PYPROJECT.read_text())["project"]


def test_every_import_is_declared_by_the_part_that_imports_it(project):
    assert problems(project) == []


def test_the_core_is_torch_and_small_libraries(project):
    core = {parse_requirement(r)[0] for r in project["dependencies"]}
    assert core == {"torch", "safetensors", "tokenizers", "jinja2", "pydantic", "pyyaml", "numpy"}
    torch = next(r for r in project["dependencies"] if r.startswith("torch"))
    assert ">=2.4" in torch and "<2.15" in torch  # admits the CPU wheel 2.13.0 on disk


def test_all_is_the_platform_without_vllm(project):
    deps = declared(project)
    for extra in ("hf", "train", "serve", "registry"):
        assert deps[extra].keys() <= deps["all"].keys(), extra
    assert not {"vllm", "vllm-cpu"} & deps["all"].keys()


@pytest.mark.parametrize("drop", ["tqdm", "tokenizers", "mlflow", "ray[serve]"])
def test_the_check_fails_when_a_dependency_is_dropped(project, drop):
    """The check can fail: without one declared requirement (or one Ray extra), it names the import left bare."""
    name, extras = parse_requirement(drop)
    edited = {**project, "dependencies": list(project["dependencies"]),
              "optional-dependencies": {k: list(v) for k, v in project["optional-dependencies"].items()}}
    for reqs in [edited["dependencies"], *edited["optional-dependencies"].values()]:
        for i, req in enumerate(reqs):
            dist, have = parse_requirement(req)
            if dist == name:
                if extras:  # drop only that Ray extra
                    kept = sorted(have - extras)
                    reqs[i] = f"{dist}[{','.join(kept)}]" if kept else dist
                else:
                    reqs[i] = "placeholder-not-a-dependency"
    found = problems(edited)
    assert found, f"dropping {drop} went unnoticed"
    top = {"tokenizers": "tokenizers", "tqdm": "tqdm", "mlflow": "mlflow", "ray[serve]": "ray.serve"}[drop]
    assert any(f"imports {top}" in p for p in found), found


@pytest.mark.parametrize("call", ["build_small_drafter", "from_pretrained", "drafter_from_verifier", "load_drafter"])
def test_hugging_face_drafters_name_the_extra_in_a_core_only_install(call, monkeypatch, tmp_path):
    """Where transformers is not installed (the core alone), the drafters that need it say which extra to install
    instead of failing with a bare ``No module named 'transformers'``."""
    import specdiff.runtime.extras as extras
    from specdiff.models import drafter

    real = extras.installed
    monkeypatch.setattr(extras, "installed", lambda m: m != "transformers" and real(m))
    (tmp_path / drafter.DRAFTER_META).write_text("{}")
    calls = {"build_small_drafter": lambda: drafter.build_small_drafter(vocab_size=8),
             "from_pretrained": lambda: drafter.HFDiffusionDrafter.from_pretrained(tmp_path),
             "drafter_from_verifier": lambda: drafter.drafter_from_verifier(object()),
             "load_drafter": lambda: drafter.load_drafter(tmp_path)}
    with pytest.raises(ImportError, match=r"needs transformers, which is not installed: pip install 'specdiff\[hf\]'"):
        calls[call]()
