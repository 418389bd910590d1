"""Packaging: the remapped component folders import from editable and normal installs, and the
dependency rule of DESIGN section 2 holds in the code."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PACKAGE_DIR = PYPROJECT["tool"]["setuptools"]["package-dir"]
COMPONENTS = ("kernel", "provisioner", "global_scheduler", "local_scheduler")


def _package_folders() -> dict[str, Path]:
    """Every folder holding an __init__.py under the five roots, by its import name."""
    found = {}
    for import_root, folder in PACKAGE_DIR.items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            rel = init.parent.relative_to(base)
            name = ".".join((import_root, *rel.parts)) if rel.parts else import_root
            found[name] = init.parent
    return found


def test_every_package_folder_is_listed_in_pyproject() -> None:
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    missing = sorted(set(_package_folders()) - listed)
    assert not missing, f"add these to [tool.setuptools] packages in pyproject.toml: {missing}"
    stale = sorted(listed - set(_package_folders()))
    assert not stale, f"listed in pyproject.toml but no such package folder: {stale}"


def test_console_script_help() -> None:
    out = subprocess.run([str(Path(sys.executable).parent / "notebookos"), "--help"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "usage: notebookos" in out.stdout


def _imports_of(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _module_level_imports_of(path: Path) -> set[str]:
    """Imports executed at import time (not inside functions): what the rule is about."""
    tree = ast.parse(path.read_text(), str(path))
    names = set()
    for node in tree.body:
        for sub in ast.walk(node):
            if isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef):
                break
            if isinstance(sub, ast.Import):
                names.update(alias.name for alias in sub.names)
            elif isinstance(sub, ast.ImportFrom) and sub.module and sub.level == 0:
                names.add(sub.module)
    return names


def test_core_does_not_import_components() -> None:
    """The core imports no component, except lazily inside CLI subcommands that start them."""
    offenders = []
    for path in (ROOT / "notebookos").rglob("*.py"):
        in_cli = "commands" in path.relative_to(ROOT).parts or path.name == "cli.py"
        imports = _module_level_imports_of(path) if in_cli else _imports_of(path)
        for name in imports:
            if any(name == f"notebookos.{c}" or name.startswith(f"notebookos.{c}.")
                   for c in COMPONENTS):
                offenders.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not offenders, offenders


@pytest.mark.parametrize("component", COMPONENTS)
def test_components_do_not_import_each_other(component: str) -> None:
    offenders = []
    for path in (ROOT / component).rglob("*.py"):
        for name in _imports_of(path):
            for other in COMPONENTS:
                if other != component and (name == f"notebookos.{other}"
                                           or name.startswith(f"notebookos.{other}.")):
                    offenders.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not offenders, offenders


def test_policies_are_pure() -> None:
    """Policies get no sockets, threads, asyncio or clock reads (DESIGN section 2)."""
    banned = {"socket", "threading", "asyncio", "time", "zmq", "grpc", "subprocess", "random"}
    offenders = []
    for path in (ROOT / "notebookos" / "policies").rglob("*.py"):
        for name in _imports_of(path):
            if name.split(".")[0] in banned:
                offenders.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not offenders, offenders


@pytest.mark.slow
def test_normal_install_imports_every_component(tmp_path: Path) -> None:
    """A non-editable wheel install puts the remapped folders under notebookos.*."""
    target = tmp_path / "site"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-q",
         "--target", str(target), str(ROOT)],
        capture_output=True, text=True, timeout=300,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    probe = (
        "import notebookos, notebookos.kernel, notebookos.provisioner, "
        "notebookos.global_scheduler, notebookos.local_scheduler, notebookos.store, "
        "notebookos.proto; print(notebookos.kernel.__file__)"
    )
    out = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(target)!r}); {probe}"],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith(str(target))
