"""``notebookos config``: show the effective configuration, check it, or print its docs."""

from __future__ import annotations

import argparse
import json
import sys

from notebookos.config import SECRET_MASK, ConfigError, load_config, render_markdown, settings


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "config", help="show, check or document the configuration",
        description="Show, check or document the configuration (see docs/configuration.md).",
    )
    parser.add_argument("action", choices=("show", "check", "docs"), nargs="?", default="show",
                        help="show (default): print the effective settings; check: validate only; "
                             "docs: print docs/configuration.md")
    parser.add_argument("--json", action="store_true", help="print JSON instead of TOML")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.action == "docs":
        sys.stdout.write(render_markdown())
        return 0
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"notebookos: {exc}", file=sys.stderr)
        return 2
    if args.action == "check":
        print("configuration is valid")
        return 0
    doc = config.to_dict()
    for info in settings():  # tokens are never printed
        if info.secret and doc[info.section][info.name]:
            doc[info.section][info.name] = SECRET_MASK
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    section = None
    for info in settings():
        if info.section != section:
            section = info.section
            print(f"{'' if section == settings()[0].section else chr(10)}[{section}]")
        print(f"{info.name} = {_toml_value(doc[info.section][info.name])}")
    return 0


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return str(value)
