"""The package is the product: a wheel built from this tree, installed in a fresh virtualenv outside the checkout,
runs the ``specdiff`` command and imports the Serve app's builder, with the working directory outside the checkout
too. The virtualenv borrows this environment's dependencies (torch, transformers, the default model's package)
through a ``.pth`` line, so the test runs offline; specdiff itself must come from the wheel, which the test checks."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from specdiff.cli import COMMANDS

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def build_wheel(out: Path) -> Path:
    """``pip wheel --no-deps --no-build-isolation`` (offline: setuptools from this environment) of a copy of what the
    wheel is made of, so the build leaves nothing in the checkout."""
    src = out / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "platform", src / "platform", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(out / "dist"), str(src)], check=True, timeout=300)
    (wheel,) = (out / "dist").glob("specdiff-*.whl")
    return wheel


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("wheel")
    assert REPO not in root.parents
    wheel = build_wheel(root)
    env_dir = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(env_dir)], check=True, timeout=300)  # pip from ensurepip
    python = env_dir / "bin" / "python"
    # --no-deps: the dependencies come from this environment (below); the console script is the venv's own.
    subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)], check=True,
                   timeout=300, env=clean_env(), cwd=root)
    purelib = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    # After the install (pip would otherwise see this environment's specdiff): this environment's site-packages as
    # a plain path, after the venv's own. Its .pth files are not run, so an editable install of the checkout in it
    # stays out of the new environment's path.
    here = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (purelib / "zz_borrowed_dependencies.pth").write_text("".join(f"{p}\n" for p in sorted(here)))
    return env_dir


def clean_env(**extra) -> dict:
    """This process's environment without anything that points Python at the checkout."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    return {**env, "HF_HUB_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0", **extra}


def run(venv: Path, cwd: Path, *cmd: str, timeout: int = 300, **env) -> subprocess.CompletedProcess:
    exe = venv / "bin" / cmd[0]
    return subprocess.run([str(exe), *cmd[1:]], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=clean_env(PATH=f"{venv / 'bin'}:{os.environ['PATH']}", **env))


def test_the_installed_package_is_the_wheels(venv, tmp_path):
    out = run(venv, tmp_path, "python", "-c", "import specdiff, specdiff.recipes as r; print(specdiff.__file__); "
              "print(r.recipe_names())")
    assert out.returncode == 0, out.stderr
    where, recipes = out.stdout.splitlines()
    assert Path(where).is_relative_to(venv) and not Path(where).is_relative_to(REPO), where
    assert recipes == "['smollm2-feature', 'smollm2-mdm', 'smollm2-streak', 'tiny']"  # package data


def test_specdiff_help_lists_every_subcommand(venv, tmp_path):
    out = run(venv, tmp_path, "specdiff", "--help")
    assert out.returncode == 0, out.stderr
    for name in COMMANDS:
        assert f"    {name}" in out.stdout, name
    module = run(venv, tmp_path, "python", "-m", "specdiff", "distill", "--help")
    assert module.returncode == 0 and "usage: specdiff distill" in module.stdout


def test_generate_untrained_runs_from_the_wheel(venv, tmp_path, specdiff_home):
    out = run(venv, tmp_path, "specdiff", "generate", "--untrained", "--max-new-tokens", "8", timeout=600,
              SPECDIFF_HOME=str(specdiff_home))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "drafter: untrained feature drafter" in out.stdout
    assert "speculative: 8 tokens" in out.stdout and "identical to plain greedy decoding: yes" in out.stdout


def test_the_serve_builder_imports_from_the_wheel(venv, tmp_path):
    out = run(venv, tmp_path, "python", "-c", "import specdiff.serving.app as a; from specdiff.serving.app import "
              "build_app; print(a.__file__)")
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()).is_relative_to(venv)
