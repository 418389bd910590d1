"""The ``notebookos`` command.

Each subcommand lives in its own module of ``notebookos.commands`` that exposes
``register(subparsers)``; the module adds its parser and sets ``func`` (called with the parsed
namespace, returning an exit code). Modules are discovered, so adding a subcommand touches no
shared file. Components (schedulers, kernel) are imported lazily inside the
``func`` of the subcommand that starts them, which is the one exception the dependency rule allows.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence

from notebookos import __version__


def subcommand_modules() -> list[str]:
    import notebookos.commands as commands

    return sorted(
        f"{commands.__name__}.{info.name}"
        for info in pkgutil.iter_modules(commands.__path__)
        if not info.name.startswith("_")
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="notebookos",
        description="NotebookOS: a GPU-efficient Jupyter platform with Raft-replicated kernels.",
    )
    parser.add_argument("--version", action="version", version=f"notebookos {__version__}")
    parser.add_argument(
        "--config",
        metavar="PATH",
        help="TOML configuration file (default: $NOTEBOOKOS_CONFIG, else built-in defaults)",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in subcommand_modules():
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        return int(func(args) or 0)
    except BrokenPipeError:  # output piped into `head` and friends
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
