"""The distillation recipes shipped with the package (package data, so a wheel can build the default drafter).

A recipe is a distillation config (``specdiff.distill.config``) in YAML. Its relative paths (``artifacts/...``) are
resolved against the working directory of the run, as for any config file; the build sets them to its work folder.
``specdiff.distill.load_config`` takes a recipe's name (``tiny``, ``smollm2-feature.yaml``) wherever it takes a file.

    from specdiff.recipes import read_recipe
    read_recipe("smollm2-feature")["train"]["steps"]
"""

from __future__ import annotations

from importlib import resources

import yaml

SUFFIX = ".yaml"


def recipe_names() -> list[str]:
    """The shipped recipes' names, without ``.yaml``."""
    return sorted(p.name.removesuffix(SUFFIX) for p in resources.files(__name__).iterdir() if p.name.endswith(SUFFIX))


def is_recipe(name: str) -> bool:
    """Whether ``name`` (with or without ``.yaml``, no folder) names a shipped recipe."""
    return "/" not in str(name) and str(name).removesuffix(SUFFIX) in recipe_names()


def recipe_text(name: str) -> str:
    """The YAML text of the recipe ``name``; a ValueError lists the recipes when there is no such one."""
    if not is_recipe(name):
        raise ValueError(f"no recipe named {name!r}; the package ships {recipe_names()}")
    return resources.files(__name__).joinpath(str(name).removesuffix(SUFFIX) + SUFFIX).read_text()


def read_recipe(name: str) -> dict:
    """The recipe ``name`` as a mapping (the YAML as written: no defaults filled in, no validation)."""
    return yaml.safe_load(recipe_text(name)) or {}


__all__ = ["is_recipe", "read_recipe", "recipe_names", "recipe_text"]
