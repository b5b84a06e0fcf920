"""``specdiff``: the platform's one command (also ``python -m specdiff``).

    specdiff generate --prompt "Write a function that checks whether a number is prime."
    specdiff build                                  # the default drafter (the first `generate` builds it too)
    specdiff distill --config tiny                  # one distillation run (a shipped recipe or a YAML file)
    specdiff bench --drafter default --untrained --quick
    specdiff export-vllm DRAFTER_DIR OUT_DIR
    specdiff registry show --family smollm2
    specdiff realign --family tiny --config tiny --address http://127.0.0.1:8265
    specdiff ui                                     # MLflow's UI over the project's store

Every subcommand lives in its own module here with ``add_parser`` (argparse only: ``--help`` imports no framework)
and ``run(parser, args) -> exit status``. Exit status 2 is bad input (argparse's usage errors included).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time

STARTED = time.perf_counter()  # `generate` counts its first token's latency from here

COMMANDS = {  # name -> module in specdiff.cli
    "generate": "generate",
    "build": "build",
    "distill": "distill",
    "bench": "bench",
    "export-vllm": "export_vllm",
    "registry": "registry",
    "realign": "realign",
    "ui": "ui",
}


def parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The top-level parser and each subcommand's."""
    top = argparse.ArgumentParser(prog="specdiff", description="Speculative decoding with diffusion drafters: "
                                  "decode, align a drafter to a verifier, bench, export to vLLM, keep a registry.",
                                  epilog="`specdiff COMMAND --help` shows a command's flags.")
    # dest "cli_command": a subcommand with commands of its own (registry) keeps "command" for them
    sub = top.add_subparsers(dest="cli_command", metavar="COMMAND", required=True)
    subs = {}
    for name, module in COMMANDS.items():
        mod = importlib.import_module(f"specdiff.cli.{module}")
        subs[name] = mod.add_parser(sub, name)
    return top, subs


def main(argv: list[str] | None = None) -> int:
    top, subs = parser()
    args, extra = top.parse_known_args(argv)
    if extra:  # argparse leaves a subcommand's unknown flags to the top parser: name them with the command's usage
        subs[args.cli_command].error(f"unrecognized arguments: {' '.join(extra)}")
    module = importlib.import_module(f"specdiff.cli.{COMMANDS[args.cli_command]}")
    return module.run(subs[args.cli_command], args)


def entry() -> None:
    """The console script."""
    sys.exit(main())
