"""The committed JupyterLab extension build and the sources it was built from.

``provisioner/labextension/`` is the prebuilt extension (``make labextension`` rebuilds it from
``labextension/`` with npm); ``build-source.sha256`` in it is the hash of the sources at build
time, so a test can tell a stale build in milliseconds without npm.

    python -m notebookos.testing.labextension          # exit 1 when the build is stale
    python -m notebookos.testing.labextension --write  # record the sources' hash (after a build)
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ROOT / "labextension"
BUILD = ROOT / "provisioner" / "labextension"
HASH_FILE = BUILD / "build-source.sha256"
SOURCE_FILES = ("package.json", "package-lock.json", "tsconfig.json")
SOURCE_DIRS = ("src", "style")


def source_files() -> list[Path]:
    files = [SOURCES / name for name in SOURCE_FILES]
    for folder in SOURCE_DIRS:
        files += sorted(p for p in (SOURCES / folder).rglob("*") if p.is_file())
    return files


def source_hash() -> str:
    digest = hashlib.sha256()
    for path in source_files():
        digest.update(path.relative_to(SOURCES).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def recorded_hash() -> str:
    return HASH_FILE.read_text().strip() if HASH_FILE.is_file() else ""


def main(argv: list[str]) -> int:
    if "--write" in argv:
        HASH_FILE.write_text(source_hash() + "\n")
        return 0
    if recorded_hash() != source_hash():
        print("the committed JupyterLab extension build is older than labextension/: run "
              "`make labextension`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
