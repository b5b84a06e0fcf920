"""``specdiff registry``: the drafter–verifier registry from the command line (MLflow; see docs/registry.md).

    specdiff registry register-verifier --family tiny artifacts/tiny/verifier
    specdiff registry register-drafter --family tiny --verifier-version 1 --config tiny \\
        artifacts/tiny-drafter                      # evaluated on the config's held-out prompts, then promoted
    specdiff registry show --family tiny

The store is --tracking-uri, else MLFLOW_TRACKING_URI, else the embedded sqlite store under $SPECDIFF_HOME.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path



FAMILY_HELP = "verifier family: registered models specdiff-verifier-FAMILY and specdiff-drafter-FAMILY"


def add_parser(sub, name: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help='the drafter-verifier registry (MLflow): register, promote, show', description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tracking-uri", default=None, help="MLflow store (default: MLFLOW_TRACKING_URI or embedded)")
    sub = p.add_subparsers(dest="command", required=True)
    v = sub.add_parser("register-verifier", help="a new version of specdiff-verifier-FAMILY from a model folder")
    v.add_argument("--family", required=True, help=FAMILY_HELP)
    v.add_argument("path", help="Hugging Face model folder (the embedded default: smollm2-135m-instruct)")
    v.add_argument("--source", default=None, help="recorded source (path or hub id); default: the folder")
    d = sub.add_parser("register-drafter", help="a new version of specdiff-drafter-FAMILY from a drafter folder")
    d.add_argument("--family", required=True, help=FAMILY_HELP)
    d.add_argument("--verifier-version", required=True, help="the verifier version it was distilled against")
    d.add_argument("--config", required=True, help="its distillation config: held-out test and lineage digests")
    d.add_argument("path", help="a folder written by the distillation job (specdiff_drafter.json)")
    d.add_argument("--no-promote", action="store_true", help="register only; do not try the production alias")
    pr = sub.add_parser("promote", help="point production at a drafter version (tau-guarded unless --force)")
    pr.add_argument("--family", required=True, help=FAMILY_HELP)
    pr.add_argument("--version", required=True, help="the drafter version to point production at")
    pr.add_argument("--config", required=True, help="distillation config whose held-out test decides")
    pr.add_argument("--force", action="store_true", help="skip the tau guard (production only if at least as good)")
    s = sub.add_parser("show", help="verifier and drafter versions, lineage, tau and aliases")
    s.add_argument("--family", required=True, help=FAMILY_HELP)
    return p


def run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from specdiff.distill import load_config
    from specdiff.lineage.evaluation import HeldoutSpec
    from specdiff.models.sources import resolve_model_path
    from specdiff.lifecycle.evaluate import Registry
    from specdiff.registry import DRAFTER_PREFIX, VERIFIER_PREFIX, config_digests

    try:
        reg = Registry(args.tracking_uri)
        if args.command == "register-verifier":
            source = args.source or (str(Path(args.path).resolve()) if Path(args.path).exists() else args.path)
            mv = reg.register_verifier(args.family, resolve_model_path(args.path), source=source)
            print(f"registered {mv.name}/{mv.version} digest {mv.tags['specdiff.digest']}")
        elif args.command == "register-drafter":
            cfg = load_config(args.config)
            verifier = reg.get(f"models:/{VERIFIER_PREFIX}{args.family}/{args.verifier_version}")
            cfg_digest, data_digest = config_digests(cfg.model_dump(mode="json"))
            spec = HeldoutSpec.from_config(cfg)
            mv = reg.register_drafter(args.family, args.path, verifier, spec, config_digest=cfg_digest,
                                      data_digest=data_digest)
            print(f"registered {mv.name}/{mv.version}: tau {mv.tags['specdiff.eval.tau']}")
            if not args.no_promote:
                print(reg.promote(args.family, mv, spec)[1])
        elif args.command == "promote":
            spec = HeldoutSpec.from_config(load_config(args.config))
            mv = reg.get(f"models:/{DRAFTER_PREFIX}{args.family}/{args.version}")
            ok, reason = reg.promote(args.family, mv, spec, force=args.force)
            print(reason)
            return 0 if ok else 1
        else:
            show(reg, args.family)
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


def show(reg, family: str) -> None:
    from specdiff.registry import DRAFTER_PREFIX, PRODUCTION, VERIFIER_PREFIX

    production = reg.production(family)
    for v in reg.versions(VERIFIER_PREFIX + family):
        t = v.tags
        print(f"{v.name}/{v.version} digest {t.get('specdiff.digest', '?')[:19]} source {t.get('specdiff.source')} "
              f"realign {t.get('specdiff.lifecycle.realign.status', '-')}")
    try:
        drafters = reg.versions(DRAFTER_PREFIX + family)
    except ValueError:
        drafters = []  # no drafter registered yet
    for d in drafters:
        t = d.tags
        mark = f" [{PRODUCTION}]" if production is not None and str(production.version) == str(d.version) else ""
        print(f"{d.name}/{d.version}{mark} -> verifier v{t.get('specdiff.models.verifier.version')} "
              f"tau {t.get('specdiff.eval.tau')} {t.get('specdiff.promotion', '')}")

