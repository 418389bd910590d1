"""``--smoke`` for the benchmarks (benchmarks/*.py): the same code path with tiny arguments, in
seconds, so that a benchmark cannot rot unseen (tests/test_benchmarks_smoke.py runs the cheap
ones; docs/performance.md lists each one's smoke command). Its figures mean nothing."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

HELP = ("a few seconds with tiny arguments, to see that it still runs (CI); its figures mean "
        "nothing")


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None,
               **tiny: Any) -> argparse.Namespace:
    """``parser.parse_args(argv)`` with a ``--smoke`` flag that sets each of ``tiny``'s
    arguments (by their ``dest``) to its value."""
    parser.add_argument("--smoke", action="store_true", help=HELP)
    args = parser.parse_args(argv)
    if args.smoke:
        for dest, value in tiny.items():
            if not hasattr(args, dest):
                raise AttributeError(f"--smoke sets {dest!r}, which the parser does not have")
            setattr(args, dest, value)
    return args
