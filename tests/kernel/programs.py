"""Random notebook programs for the differential tests of state sync against plain Python.

A program is a list of cells over a few names: bindings, aliases (also into containers and
attributes), in-place mutations, rebinding, deletion, functions (``global``, mutation through a
called function) and class instances. ``CANON_SOURCE`` defines ``_notebookos_canon()``, which
renders the namespace so that two namespaces render the same exactly when they hold equal values
*and* the same objects are shared between the same places (``#3=[...]`` labels a mutable object
the first time, ``#3`` every later time). Run it in plain Python and in a replica and compare.
"""

from __future__ import annotations

import textwrap

from hypothesis import strategies as st

NAMES = ("a", "b", "c", "d")

SETUP = textwrap.dedent("""
    class Box:
        def __init__(self):
            self.items = []
""")

# {n}: the name changed; {m}: another name (possibly the same)
TEMPLATES = (
    "{n} = []",
    "{n} = {{'k': [], 'v': 0}}",
    "{n} = set()",
    "{n} = Box()",
    "{n} = [{m}]",
    "{n} = ({m}, [])",
    "{n} = {m}",
    "{n} = {m}['k']",
    "{n} = {m}.items",
    "{n} = {m}[0]",
    "{n}.append({m})",
    "{n}.append(len({n}))",
    "{n}['k'] = {m}",
    "{n}['k'].append(1)",
    "{n}.items.append({m})",
    "{n}.x = {m}",
    "{n}.add(len({n}))",
    "{n} += [1]",
    "{n} = {n} + [1]",
    "{n}.clear()",
    "{n}.pop()",
    "del {n}",
    "def grow():\n    {n}.append(7)\ngrow()",
    "def rebind():\n    global {n}\n    {n} = [{m}]\nrebind()",
    "def make(box={m}):\n    def get():\n        return box\n    return get\n{n} = make()",
    "{n} = {m}()",
)


def _guarded(statement: str) -> str:
    """Run the statement; a statement that does not fit the current types does nothing."""
    return "try:\n" + textwrap.indent(statement, "    ") + "\nexcept Exception:\n    pass"


@st.composite
def statements(draw: st.DrawFn) -> str:
    template = draw(st.sampled_from(TEMPLATES))
    return _guarded(template.format(n=draw(st.sampled_from(NAMES)),
                                    m=draw(st.sampled_from(NAMES))))


def cells(max_cells: int = 6, max_statements: int = 3) -> st.SearchStrategy[list[str]]:
    cell = st.lists(statements(), min_size=1, max_size=max_statements).map("\n".join)
    return st.lists(cell, min_size=1, max_size=max_cells)


CANON_SOURCE = textwrap.dedent("""
    def _notebookos_canon(namespace):
        import types
        labels = {}
        def walk(obj):
            if obj is None or isinstance(obj, (bool, int, float, str, bytes)):
                return repr(obj)
            if isinstance(obj, type):
                return "<class " + obj.__qualname__ + ">"
            if isinstance(obj, (types.BuiltinMethodType, types.MethodType)):
                return "<method " + obj.__name__ + " of " + walk(obj.__self__) + ">"
            if isinstance(obj, tuple):
                return "(" + ",".join(walk(x) for x in obj) + ")"
            if id(obj) in labels:
                return "#" + str(labels[id(obj)])
            labels[id(obj)] = len(labels)
            label = "#" + str(labels[id(obj)]) + "="
            if isinstance(obj, list):
                return label + "[" + ",".join(walk(x) for x in obj) + "]"
            if isinstance(obj, dict):
                return label + "{" + ",".join(walk(k) + ":" + walk(v) for k, v in obj.items()) + "}"
            if isinstance(obj, set):
                return label + "set(" + ",".join(sorted(walk(x) for x in obj)) + ")"
            if isinstance(obj, types.FunctionType):
                cells = [c.cell_contents for c in obj.__closure__ or ()]
                return (label + "<fn " + obj.__name__ + " closure=" + walk(tuple(cells))
                        + " defaults=" + walk(obj.__defaults__) + ">")
            if hasattr(obj, "__dict__"):
                attrs = sorted(vars(obj).items())
                return (label + type(obj).__name__ + "("
                        + ",".join(k + "=" + walk(v) for k, v in attrs) + ")")
            return label + repr(obj)
        names = sorted(n for n in namespace
                       if n in ("a", "b", "c", "d", "grow", "rebind", "make"))
        return "; ".join(n + ": " + walk(namespace[n]) for n in names)
""")


def canon(namespace: dict) -> str:
    """``_notebookos_canon`` run here, on a namespace of this process."""
    scope: dict = {}
    exec(CANON_SOURCE, scope)
    return scope["_notebookos_canon"](namespace)
