"""The one vocabulary of flags the subcommands share, with one set of defaults (``specdiff <command> --help``).

Each subcommand adds the groups it uses; a flag means the same thing, with the same default, wherever it appears.
Nothing here imports torch or a framework: ``--help`` and usage errors answer at once.
"""

from __future__ import annotations

import argparse

DEFAULT_VERIFIER = "smollm2-135m-instruct"  # specdiff.models.sources.DEFAULT_VERIFIER (checked by the tests)
DEFAULT_DRAFTER = "default"
UNTRAINED = "untrained"
DTYPES = ("auto", "float32", "bfloat16")
DEVICES = ("auto", "cpu", "cuda")


def add_model_flags(p: argparse.ArgumentParser, *, drafter: bool = True, repeat_drafter: bool = False) -> None:
    """``--verifier``, ``--drafter`` (and its old spelling ``--untrained``), ``--dtype``, ``--device``."""
    g = p.add_argument_group("models (shared by the subcommands)")
    add_verifier_flag(g)
    if drafter:
        what = ("a drafter folder (written by `specdiff distill` / `specdiff build`), 'default' (the default drafter "
                "of the embedded verifier, built on first use) or 'untrained' (unaligned layers of the default "
                "recipe's shape: no build)")
        if repeat_drafter:
            g.add_argument("--drafter", action="append", default=[], metavar="[NAME=]DRAFTER",
                           help=f"a drafter to compare, repeatable: {what}; NAME= labels its row")
        else:
            g.add_argument("--drafter", default=DEFAULT_DRAFTER, metavar="DRAFTER",
                           help=f"{what} (default: %(default)s)")
        g.add_argument("--untrained", action="store_true", help="the same as --drafter untrained")
    g.add_argument("--dtype", default="auto", choices=DTYPES, help="weights and compute of every model (auto: "
                   "bfloat16 on a GPU or a CPU with native bf16, else float32; default: %(default)s)")
    g.add_argument("--device", default="auto", choices=DEVICES, help="where the models run (auto: cuda when a GPU "
                   "is visible, else cpu; default: %(default)s)")


DECODE_FLAGS = ("gamma", "num_candidates", "max_new_tokens", "temperature", "seed")


def add_verifier_flag(g) -> None:
    """``--verifier`` alone (a command that takes no drafter flag)."""
    g.add_argument("--verifier", default=DEFAULT_VERIFIER, help="the verifier: the embedded default, a local Hugging "
                   "Face folder or a Hugging Face model id (default: %(default)s)")


def add_decode_flags(p: argparse.ArgumentParser, *, only: tuple[str, ...] = DECODE_FLAGS) -> None:
    """``--gamma``, ``--num-candidates`` (adaptive unless given), ``--max-new-tokens``, ``--temperature``,
    ``--seed`` (or ``only`` those named: a command whose own flags sweep the others)."""
    g = p.add_argument_group("decoding (shared by the subcommands)")

    def add(name: str, *flags: str, **options) -> None:
        if name in only:
            g.add_argument(*flags, **options)

    add("gamma", "--gamma", type=positive_int, default=None, help="window: drafted positions per round (default: "
        "adaptive, chosen round by round)")
    add("num_candidates", "--num-candidates", "-k", "--k", dest="num_candidates", type=positive_int, default=None,
        metavar="K", help="candidates per round, self-selected by expected streak (default: adaptive)")
    add("max_new_tokens", "--max-new-tokens", type=positive_int, default=128,
        help="tokens to generate at most (default: %(default)s)")
    add("temperature", "--temperature", type=non_negative_float, default=0.0,
        help="the verifier's sampling temperature (0: greedy; default: %(default)s)")
    add("seed", "--seed", type=int, default=0, help="seed of every random draw (default: %(default)s)")


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def non_negative_float(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def drafter_choice(args: argparse.Namespace) -> str:
    """'untrained', 'default' or a folder, with ``--untrained`` folded in."""
    return UNTRAINED if getattr(args, "untrained", False) else args.drafter


def resolve_device(p: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """'cpu' or 'cuda' for ``--device``; a usage error (exit 2) for cuda without CUDA, before anything loads."""
    import torch

    cuda = torch.cuda.is_available()
    if args.device == "cuda" and not cuda:
        p.error("--device cuda: no CUDA device is available here (torch.cuda.is_available() is False; this torch "
                f"is {torch.__version__}); use --device cpu")
    return "cuda" if args.device == "cuda" or (args.device == "auto" and cuda) else "cpu"
