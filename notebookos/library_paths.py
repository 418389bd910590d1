"""Where the interpreter's libraries live, and whether a name is an installed library module.

Shared by the kernel (``module_warmup``: only library modules travel to the standbys) and the
Local Scheduler (``preload_learning``: only installed packages are imported by the fork server
that replicas are forked from, never a module of a notebook's folder). Pure file-system reads:
no import of the module it judges.
"""

from __future__ import annotations

import importlib.util
import os
import re
import site
import sys
import sysconfig

TOP_LEVEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def library_roots() -> tuple[str, ...]:
    """The folders of the standard library and of installed packages, each ending in a slash:
    the interpreter's own site-packages, every other site directory (``site``'s, the user's),
    and the folders their ``.pth`` files add (a virtual environment layered on another one's
    packages, a distribution's dist-packages): torch found through one of those is as much a
    library as torch in the venv's own site-packages."""
    paths = sysconfig.get_paths()
    folders = [paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")
               if paths.get(key)]
    site_dirs = [*folders, *_site_directories()]
    folders += site_dirs
    for site_dir in site_dirs:
        folders += pth_folders(site_dir)
    roots = {os.path.realpath(folder) for folder in folders if os.path.isdir(folder)}
    return tuple(sorted(root.rstrip(os.sep) + os.sep for root in roots))


def _site_directories() -> list[str]:
    folders = list(getattr(site, "getsitepackages", list)())
    if site.ENABLE_USER_SITE:
        folders.append(site.getusersitepackages())
    return folders


def pth_folders(site_dir: str) -> list[str]:
    """The folders that ``site`` adds to ``sys.path`` for the ``.pth`` files in ``site_dir``
    (one path a line, relative to ``site_dir``; comments and ``import`` lines skipped)."""
    try:
        names = sorted(name for name in os.listdir(site_dir) if name.endswith(".pth"))
    except OSError:
        return []
    folders = []
    for name in names:
        try:
            with open(os.path.join(site_dir, name), encoding="utf-8") as pth:
                lines = pth.read().splitlines()
        except (OSError, UnicodeDecodeError):
            continue
        for line in lines:
            line = line.strip()
            if line and not line.startswith(("#", "import ", "import\t")):
                folders.append(os.path.join(site_dir, line))
    return folders


def refusal(name: str, roots: tuple[str, ...] | None = None) -> str | None:
    """Why ``name`` is not an installed top-level library module (None when it is one): a
    dotted or malformed name, one not found, a built-in or namespace package, or one found
    outside the standard library and site-packages (a notebook's own ``mytrain.py`` in the
    working directory). Finding a top-level module's spec runs none of its code."""
    if not isinstance(name, str) or not TOP_LEVEL_NAME.match(name):
        return "not a top-level module name"
    if name in sys.builtin_module_names:
        return "a built-in module (nothing to import)"
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError) as exc:
        return f"cannot be found: {exc}"
    if spec is None:
        return "not installed"
    origin = spec.origin if isinstance(spec.origin, str) and os.path.isabs(spec.origin) else None
    if origin is None:
        return "not a module file (built in, frozen or a namespace package)"
    folder = os.path.realpath(os.path.dirname(origin)) + os.sep
    if not folder.startswith(roots if roots is not None else library_roots()):
        return f"{origin} is not under the standard library or site-packages"
    return None
