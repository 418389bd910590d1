"""Optional packages in tests: a test that needs one (torch) skips where it is absent, and
fails instead under NOTEBOOKOS_REQUIRE_SERVICES=1 (CI: `make test` tolerates a failed torch
install, so a skip there would hide that every torch test went unrun)."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest

REQUIRE_ENV = "NOTEBOOKOS_REQUIRE_SERVICES"


def require_module(name: str, why: str = "") -> ModuleType:
    """Import ``name``; when it is missing, skip (module level too), or fail under
    NOTEBOOKOS_REQUIRE_SERVICES=1."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        reason = f"`{name}` is not installed ({why or exc})"
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"required package missing ({REQUIRE_ENV}=1): {reason}",
                        pytrace=False)
        pytest.skip(reason, allow_module_level=True)


def require_torch() -> ModuleType:
    """``torch``, which `make install-test` installs (the CPU build)."""
    return require_module("torch", "`make install-test` installs the CPU build")
