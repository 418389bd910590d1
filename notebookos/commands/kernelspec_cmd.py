"""``notebookos kernelspec install|remove``: the NotebookOS kernelspecs (1, 0, 2, 4, 8 GPUs)."""

from __future__ import annotations

import argparse
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "kernelspec", help="install or remove the NotebookOS kernelspecs",
        description="Install or remove the kernelspecs notebookos (1 GPU) and notebookos-0gpu, "
                    "-2gpu, -4gpu, -8gpu, which start distributed kernels through the Global "
                    "Scheduler.",
    )
    parser.add_argument("action", choices=("install", "remove"))
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="install for the current user")
    where.add_argument("--sys-prefix", action="store_true",
                       help=f"install into this Python's prefix ({sys.prefix})")
    where.add_argument("--prefix", help="install under this prefix")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from notebookos.provisioner.kernelspecs import install_kernelspecs, remove_kernelspecs

    if args.action == "remove":
        for path in remove_kernelspecs():
            print(f"removed {path}")
        return 0
    prefix = sys.prefix if args.sys_prefix else args.prefix
    for path in install_kernelspecs(user=args.user, prefix=prefix):
        print(f"installed {path}")
    return 0
