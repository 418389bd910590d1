"""The front's shape (issue 32): its routing is the two handler tables of ``KernelFront``, and
every hook it calls on the service is declared on ``FrontHooks``."""

from __future__ import annotations

import re
from pathlib import Path

from notebookos.global_scheduler import front as front_module
from notebookos.global_scheduler.cell_front import CellFront
from notebookos.global_scheduler.front import KernelFront
from notebookos.global_scheduler.front_hooks import OPTIONAL_HOOKS, FrontHooks


def test_every_handler_in_the_tables_is_a_method() -> None:
    for cls in (KernelFront, CellFront):
        for name in [*cls.SOCKET_HANDLERS.values(), *cls.CLIENT_HANDLERS.values()]:
            assert callable(getattr(cls, name, None)), f"{cls.__name__}.{name}"


def test_every_hook_the_front_calls_is_declared_on_front_hooks() -> None:
    folder = Path(front_module.__file__).parent
    called: set[str] = set()
    for path in [*folder.glob("front*.py"), folder / "cell_front.py"]:
        text = path.read_text()
        called |= set(re.findall(r"self\.hooks\.(\w+)\(", text))
        called |= set(re.findall(r"call_optional\(self\.hooks, \"(\w+)\"", text))
    assert called, "no hook calls found"
    declared = {n for n in vars(FrontHooks) if not n.startswith("_")}
    assert called <= declared, called - declared
    assert set(OPTIONAL_HOOKS) <= declared
