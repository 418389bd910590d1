"""``notebookos security``: make and inspect the cluster's TLS files and join token.

- ``init [DIR]``: a CA, a certificate for this machine and a join token in DIR (default
  ``<state_dir>/security``, what ``notebookos up`` uses); existing files are kept.
- ``issue DIR --out PREFIX [--name DNS] [--ip IP]``: one more certificate from DIR's CA (one per
  host of a deployment), written to PREFIX.pem and PREFIX-key.pem.
- ``rotate-token [--finish]``: put a new join token first in the token file, keeping the old one
  accepted; ``--finish`` then drops every token but the first.
- ``show``: which files this configuration uses, the certificate's names and expiry.

Tokens and keys are never printed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from notebookos.config import Config, ConfigError, load_config


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "security", help="make and inspect the cluster's TLS files and join token",
        description="Make and inspect the cluster's TLS files and join token (docs/security.md).",
    )
    parser.add_argument("--state-dir", help="the cluster's state directory (default from config)")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    init = actions.add_parser("init", help="create a CA, a certificate and a join token")
    init.add_argument("dir", nargs="?", help="where (default <state_dir>/security)")
    init.add_argument("--name", action="append", default=[],
                      help="a DNS name for the certificate (repeat); the server name, localhost "
                           "and this hostname are always in")
    init.add_argument("--ip", action="append", default=[], help="an IP address (repeat)")
    issue = actions.add_parser("issue", help="issue one more certificate from a CA directory")
    issue.add_argument("dir", help="directory holding ca.pem and ca-key.pem")
    issue.add_argument("--out", required=True, help="write OUT.pem and OUT-key.pem")
    issue.add_argument("--name", action="append", default=[], help="a DNS name (repeat)")
    issue.add_argument("--ip", action="append", default=[], help="an IP address (repeat)")
    rotate = actions.add_parser("rotate-token", help="start (or --finish) a join token rotation")
    rotate.add_argument("--finish", action="store_true",
                        help="keep only the newest token (after every host presents it)")
    actions.add_parser("show", help="the files in use, certificate names and expiry")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from notebookos.security import SecurityError

    try:
        config = load_config(args.config, overrides={"cluster.state_dir": args.state_dir})
        return {"init": _init, "issue": _issue, "rotate-token": _rotate,
                "show": _show}[args.action](config, args)
    except (ConfigError, SecurityError, ValueError) as exc:
        print(f"notebookos security {args.action}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"notebookos security {args.action}: {exc.strerror}: {exc.filename}",
              file=sys.stderr)
        return 1


def _init(config: Config, args: argparse.Namespace) -> int:
    from notebookos.security.files import SECURITY_DIR, create_credentials

    directory = Path(args.dir) if args.dir else config.state_path / SECURITY_DIR
    written = create_credentials(directory.absolute(), config.security.server_name,
                                 args.name, args.ip)
    for path in written:
        print(f"created {path}")
    if not written:
        print(f"{directory}: every file exists already (nothing changed)")
    if args.dir:
        d = directory.absolute()
        print("\nPoint every NotebookOS process at them (or mount this directory as its "
              "<state_dir>/security):")
        for name, file in (("CA_FILE", "ca.pem"), ("CERT_FILE", "node.pem"),
                           ("KEY_FILE", "node-key.pem"), ("JOIN_TOKEN_FILE", "join-token")):
            print(f"  NOTEBOOKOS_SECURITY_{name}={d / file}")
        print(f"Keep {d / 'ca-key.pem'} off the cluster's machines: it only issues certificates.")
    return 0


def _issue(config: Config, args: argparse.Namespace) -> int:
    from notebookos.security import pki
    from notebookos.security.files import CA_FILE, CA_KEY_FILE, default_names, write_private

    directory = Path(args.dir)
    ca = pki.PemPair((directory / CA_FILE).read_bytes(), (directory / CA_KEY_FILE).read_bytes())
    dns, ips = default_names(config.security.server_name)
    names = [config.security.server_name, *args.name] if args.name else dns
    pair = pki.issue(ca, f"notebookos {args.out.rsplit('/', 1)[-1]}", names,
                     args.ip or (ips if not args.name else []))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_private(out.with_name(out.name + "-key.pem"), pair.private_key)
    write_private(out.with_name(out.name + ".pem"), pair.certificate, 0o644)
    print(f"created {out}.pem and {out}-key.pem: {pki.describe(pair.certificate)}")
    return 0


def _rotate(config: Config, args: argparse.Namespace) -> int:
    from notebookos.security.files import credential_files, new_join_token, write_private

    if config.security.join_token:
        print("security.join_token is set: rotate it where it is set (the environment or the "
              "configuration file); this command edits security.join_token_file", file=sys.stderr)
        return 2
    path = credential_files(config).token
    lines = [t.strip() for t in path.read_text().splitlines() if t.strip()]
    if args.finish:
        write_private(path, (lines[0] + "\n").encode())
        print(f"{path}: only the newest token is accepted now ({len(lines) - 1} retired)")
        return 0
    write_private(path, "\n".join([new_join_token(), *lines]).encode() + b"\n")
    print(f"{path}: a new token is first (Local Schedulers reading this file present it); "
          f"{len(lines)} older token(s) still accepted. Give the new token to every Local "
          "Scheduler, then run `notebookos security rotate-token --finish`.")
    return 0


def _show(config: Config, args: argparse.Namespace) -> int:
    from notebookos.security import pki
    from notebookos.security.files import credential_files, load_tls

    files = credential_files(config)
    material = load_tls(config)
    print(f"CA:          {files.ca}")
    print(f"certificate: {files.cert}: {pki.describe(material.cert)}")
    print(f"key:         {files.key}")
    print("join token:  " + ("security.join_token (set; not shown)" if config.security.join_token
                             else f"{files.token} ({'present' if files.token.exists() else 'MISSING'}; not shown)"))
    print(f"server name: {config.security.server_name or '(the host of each address)'}")
    return 0
