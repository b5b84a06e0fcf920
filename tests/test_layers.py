"""The import ladder (docs/architecture.md), checked two ways.

1. Statically, over every import of every module (``tests/ladder.py`` reads them with ``ast``: module level, inside
   functions and classes, ``importlib.import_module("literal")``): no import climbs a rung, no adapter imports
   another, no part imports a framework it must not use, and there is no import circle.
2. Dynamically: each rung, imported alone in a fresh interpreter, loads nothing from the rungs above it or from
   frameworks it must not need (this also catches what a rung loads transitively).

A module that starts importing Ray, MLflow or the training package where it should not fails here, not in a user's
replica. Two synthetic packages show that the static check fails where it should.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ladder import circles, climbs, foreign, import_graph, module_files, rung_of

REPO = Path(__file__).resolve().parents[1]
PLATFORM = REPO / "platform"
TREES = {"specdiff": PLATFORM / "specdiff", "jobs": REPO / "jobs", "serve_apps": REPO / "serve_apps"}

# The rungs, bottom first; a module may import its own rung and the ones below. Longest prefix wins; the bare
# "specdiff" is the package's own __init__ (a facade over core and models) and must match nothing else.
RUNGS = {
    "specdiff.runtime": 0,  # beside every rung: install checks, Ray token look-up, allocator, machine cache, atomic writes
    "specdiff.prompts": 0,  # beside every rung: prompt sources, plain Python over files every machine has
    "specdiff.recipes": 0,  # beside every rung: the distillation recipes the package ships (YAML, read as data)
    "specdiff.core": 1,  # pure torch: engine, rounds, policy, selection, acceptance, tree, stats, objectives
    "specdiff.models": 2,  # verifier, drafters, tokenizer, transformers adapter, sources, dtypes, kernels
    "specdiff": 2,
    "specdiff.lineage": 3,  # plain records: verifier record, held-out spec, evaluation result
    "specdiff.distill": 4,  # adapters, one framework each
    "specdiff.registry": 4,
    "specdiff.serving": 4,
    "specdiff.vllm": 4,
    "specdiff.lifecycle": 5,  # evaluate -> register -> promote, re-align, the build
    "specdiff.cli": 6,  # entry points: argparse and builders
    "specdiff.__main__": 6,
    "jobs": 6,
    "serve_apps": 6,
}
ADAPTERS = frozenset({"specdiff.distill", "specdiff.registry", "specdiff.serving", "specdiff.vllm"})

# Frameworks each part may import anywhere in its code (function bodies included): (may, may not), longest prefix
# wins; entry points (jobs, serve_apps, the CLI) may import all.
FRAMEWORKS = ("ray", "mlflow", "fastapi", "vllm", "transformers", "peft")
NONE: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
ALLOWED = {
    "specdiff.runtime": NONE,
    "specdiff.prompts": NONE,
    "specdiff.recipes": NONE,
    "specdiff.core": NONE,
    "specdiff": (("transformers",), ()),
    "specdiff.models": (("transformers",), ()),
    "specdiff.lineage": NONE,
    "specdiff.distill": (("ray", "transformers", "peft", "vllm", "mlflow"), ("ray.serve",)),
    "specdiff.registry": (("mlflow", "transformers"), ()),
    "specdiff.serving": (("ray", "fastapi", "transformers"), ("ray.train", "ray.data")),
    "specdiff.vllm": (("vllm", "transformers"), ()),
    "specdiff.lifecycle": (("ray", "mlflow"), ("ray.serve",)),
    "specdiff.cli": (FRAMEWORKS, ()),  # entry points: each subcommand imports what it runs
    "specdiff.__main__": (FRAMEWORKS, ()),
}

# Climbs that are known and owned elsewhere (the files are being changed by others): each must still exist, so an
# entry is deleted when its import is fixed. Anything else that climbs fails.
KNOWN = {
    ("specdiff.serving.models", "specdiff.registry"):
        "serving resolves models:/ URIs through the registry itself; the app builder should hand it the pair",
    ("specdiff.serving.vllm_app", "specdiff.vllm.export"):
        "the Ray Serve LLM app writes the drafter in vLLM's layout before it starts vLLM",
}


@pytest.fixture(scope="module")
def graph():
    return import_graph(TREES)


def test_every_module_has_a_rung():
    modules = [m for tree, root in TREES.items() for m in module_files(root, tree)]
    unplaced = [m for m in modules if (rung_of(m, RUNGS) or ("specdiff",))[0] == "specdiff" and m != "specdiff"]
    assert unplaced == [], f"place these modules on a rung (RUNGS here, and docs/architecture.md): {unplaced}"


def test_no_import_climbs_a_rung(graph):
    found = climbs(graph, RUNGS, ADAPTERS)
    unknown = [str(c) for c in found if (c.imp.source, c.imp.target) not in KNOWN]
    assert unknown == [], "imports that climb the ladder (function-level ones included):\n" + "\n".join(unknown)
    stale = sorted(set(KNOWN) - {(c.imp.source, c.imp.target) for c in found})
    assert stale == [], f"fixed: delete these from KNOWN: {stale}"


def test_no_part_imports_a_framework_it_must_not_use(graph):
    assert [str(c) for c in foreign(graph, ALLOWED, FRAMEWORKS)] == []


def test_no_import_circles(graph):
    modules = {m for tree, root in TREES.items() for m in module_files(root, tree)}
    assert circles(graph, modules) == []


def test_the_registry_imports_neither_the_training_package_nor_ray(graph):
    """The case that used to slip through: imports inside the registry's functions."""
    from_registry = {i.target for i in graph if i.source.startswith("specdiff.registry")}
    assert not {t for t in from_registry if t.startswith(("specdiff.distill", "specdiff.lifecycle", "ray"))}


# -- the checker can fail ------------------------------------------------------------------------------------------


def write_package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root / "pkg"


SYNTHETIC_RUNGS = {"pkg.low": 0, "pkg.high": 1, "pkg.ad1": 1, "pkg.ad2": 1}


def test_a_function_level_import_that_climbs_is_reported(tmp_path):
    pkg = write_package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/low/__init__.py": "",
        "pkg/low/a.py": """
            import json


            def helper():
                from pkg.high import b  # climbs, but only when called

                return b
        """,
        "pkg/low/lazy.py": """
            import importlib


            def load():
                return importlib.import_module("pkg.high.b")
        """,
        "pkg/low/relative.py": """
            class Holder:
                def get(self):
                    from ..high.b import VALUE

                    return VALUE
        """,
        "pkg/low/uses_ray.py": """
            def submit():
                import ray.serve
        """,
        "pkg/high/__init__.py": "",
        "pkg/high/b.py": "from pkg.low import a\nVALUE = 1\n",
        "pkg/ad1/__init__.py": "",
        "pkg/ad1/x.py": "def f():\n    from pkg.ad2 import y\n",
        "pkg/ad2/__init__.py": "",
        "pkg/ad2/y.py": "",
    })
    graph = import_graph({"pkg": pkg})
    adapters = frozenset({"pkg.ad1", "pkg.ad2"})
    found = {(c.imp.source, c.imp.target, c.imp.nested) for c in climbs(graph, SYNTHETIC_RUNGS, adapters)}
    assert found == {
        ("pkg.low.a", "pkg.high.b", True),
        ("pkg.low.lazy", "pkg.high.b", True),
        ("pkg.low.relative", "pkg.high.b", True),
        ("pkg.ad1.x", "pkg.ad2.y", True),
    }
    assert ("pkg.high.b", "pkg.low.a") in {(i.source, i.target) for i in graph}  # downward: seen, not reported
    bad = foreign(graph, {"pkg.low": NONE, "pkg.high": (("ray",), ("ray.serve",))}, FRAMEWORKS)
    assert [(c.imp.source, c.imp.target) for c in bad] == [("pkg.low.uses_ray", "ray.serve")]


def test_an_import_circle_is_reported_even_when_it_closes_inside_a_function(tmp_path):
    pkg = write_package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/c.py": "from pkg import d\n",
        "pkg/d.py": "from pkg.e import thing\n",
        "pkg/e.py": "def thing():\n    import pkg.c\n",  # closes the circle at call time
        "pkg/f.py": "from pkg import c\n",  # imports into the circle, is not part of it
        "pkg/g.py": "import pkg.g\n",  # imports itself
    })
    graph = import_graph({"pkg": pkg})
    assert circles(graph) == [["pkg.c", "pkg.d", "pkg.e"], ["pkg.g"]]
    (pkg / "e.py").write_text("def thing():\n    pass\n")
    assert circles(import_graph({"pkg": pkg})) == [["pkg.g"]]


# -- each rung alone, in a fresh interpreter -------------------------------------------------------------------------

LOADED_FRAMEWORKS = ["ray", "mlflow", "fastapi", "vllm", "transformers"]
ABOVE_CORE = ["specdiff.distill", "specdiff.serving", "specdiff.registry", "specdiff.lifecycle"]

LADDER = {
    # core: pure torch (transformers only when a model is loaded, lazily)
    "specdiff": LOADED_FRAMEWORKS + ABOVE_CORE,
    "specdiff.core.engine": LOADED_FRAMEWORKS + ABOVE_CORE,
    "specdiff.core.policy": LOADED_FRAMEWORKS + ABOVE_CORE,
    "specdiff.models.feature_drafter": LOADED_FRAMEWORKS + ABOVE_CORE,
    "specdiff.vllm.export": LOADED_FRAMEWORKS + ABOVE_CORE,
    "specdiff.vllm.plugin": LOADED_FRAMEWORKS + ABOVE_CORE,  # vLLM's entry point: imports vLLM only when vLLM calls it
    "specdiff.models.llama": LOADED_FRAMEWORKS + ABOVE_CORE,  # the lean verifier forward and tokenizer: never transformers
    "specdiff.models.tokenizer": LOADED_FRAMEWORKS + ABOVE_CORE,
    "specdiff.core.text": LOADED_FRAMEWORKS + ABOVE_CORE,
    # lineage records: plain data (importing them runs specdiff/__init__, hence torch and the core, all the same)
    "specdiff.lineage.verifier": LOADED_FRAMEWORKS + ABOVE_CORE,
    "specdiff.lineage.evaluation": LOADED_FRAMEWORKS + ABOVE_CORE,
    # the adapters' install checks and Ray token look-up: standard library only, importable from every rung
    "specdiff.runtime.extras": LOADED_FRAMEWORKS + ABOVE_CORE,
    "specdiff.runtime.ray_auth": LOADED_FRAMEWORKS + ABOVE_CORE,
    # prompt sources: plain Python over files every machine has (the self-written ones live in specdiff.distill)
    "specdiff.prompts": LOADED_FRAMEWORKS + ABOVE_CORE,
    "specdiff.prompts.corpus": LOADED_FRAMEWORKS + ABOVE_CORE,
    "specdiff.prompts.word_problems": LOADED_FRAMEWORKS + ABOVE_CORE,
    # adapters: each on its framework, none on another adapter or the lifecycle
    "specdiff.registry": ["ray", "vllm", "specdiff.distill", "specdiff.serving", "specdiff.lifecycle"],
    "specdiff.distill.teacher": ["ray", "mlflow", "fastapi", "vllm", "specdiff.serving", "specdiff.registry",
                                 "specdiff.lifecycle"],
    "specdiff.distill.evaluate": ["ray", "mlflow", "fastapi", "vllm", "specdiff.serving", "specdiff.registry",
                                  "specdiff.lifecycle"],
    "specdiff.serving.servers": ["ray", "mlflow", "vllm", "specdiff.distill", "specdiff.registry",
                                 "specdiff.lifecycle"],
    "specdiff.serving.app": ["mlflow", "vllm", "ray.train", "ray.data", "specdiff.distill", "specdiff.registry",
                             "specdiff.lifecycle"],
    "specdiff.serving.vllm_app": ["ray", "mlflow", "vllm", "specdiff.distill", "specdiff.registry",
                                  "specdiff.lifecycle"],
    # lifecycle: may use the training adapter and the registry, never the serving one
    "specdiff.lifecycle.realign": ["ray.serve", "vllm", "specdiff.serving"],
    "specdiff.lifecycle.evaluate": ["ray.serve", "vllm", "specdiff.serving"],
}


@pytest.fixture(scope="module")
def imports() -> dict[str, subprocess.CompletedProcess]:
    """Every rung imported in its own fresh interpreter, all at once (each start-up is mostly waiting on imports)."""
    procs = {}
    for module, forbidden in LADDER.items():
        code = f"import sys, json; import {module}; print(json.dumps([m for m in {forbidden!r} if m in sys.modules]))"
        procs[module] = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         text=True, env={"PYTHONPATH": str(PLATFORM), "PATH": "/usr/bin:/bin"})
    out = {}
    for module, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=300)
        out[module] = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    return out


@pytest.mark.parametrize("module", sorted(LADDER))
def test_rung_loads_nothing_above_it(imports, module):
    done = imports[module]
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert loaded == [], f"importing {module} loaded {loaded}"
