"""Which module-level names a notebook cell binds, deletes or may mutate, found from its AST.

The executor runs a cell, then replicates only the names the cell could have changed. This module
reads the cell's source (already transformed by IPython: ``shell.transform_cell(code)``, so magics
appear as ``get_ipython().run_line_magic(...)`` calls) and reports:

- ``bound``: names the cell may (re)bind at module level;
- ``deleted``: names the cell may unbind (``del x``; ``except ... as e`` targets, which Python
  deletes at the end of the handler);
- ``mutated``: module-level names the cell references in a way that may change the object in place
  (method calls, subscript or attribute stores, being passed to a call);
- ``called``: names called directly (``f(...)``): the encoder follows a called function's global
  references, because ``def train(): model.step()`` then ``train()`` mutates ``model``;
- ``imports``: the source of the cell's module-level import statements, replayable elsewhere;
- ``rescan``: the cell may bind names that cannot be seen statically (``from m import *``,
  ``exec``, ``globals()[...]``, most magics), so the whole namespace must be checked.

A name may appear in both ``bound`` and ``deleted`` (``x = 1; del x``, or a conditional ``del``);
the namespace after the cell decides. Everything here over-approximates: reporting a name that did
not change costs one hash comparison; missing one loses state. See docs/state-sync.md.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass, field

# Line/cell magics that cannot bind user names; any other magic makes the cell "rescan".
_HARMLESS_MAGICS = frozenset(
    {
        "matplotlib", "pip", "conda", "mamba", "load_ext", "reload_ext", "unload_ext", "config",
        "env", "cd", "pwd", "ls", "pinfo", "pinfo2", "psearch", "pdoc", "pdef", "psource", "pfile",
        "who", "who_ls", "whos", "lsmagic", "magic", "history", "hist", "xmode", "precision",
        "autoreload", "aimport", "autoawait", "page", "pprint", "colors", "doctest_mode", "html",
        "javascript", "js", "latex", "markdown", "svg", "bash", "sh", "script", "system", "sx",
        "writefile", "timeit", "debug", "pdb", "tb", "notebook", "automagic", "autocall",
    }
)
# Builtins whose call may bind arbitrary module-level names.
_RESCAN_CALLS = frozenset({"exec", "eval", "globals", "vars", "locals", "execfile"})

_FUNCTION_NODES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
_SCOPE_NODES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)


@dataclass(frozen=True)
class CellEffects:
    """What a cell may have done to the module-level namespace (see the module docstring)."""

    bound: frozenset[str]
    deleted: frozenset[str]
    mutated: frozenset[str]
    imports: tuple[str, ...]  # source of import statements, replayable on standbys
    called: frozenset[str] = field(default_factory=frozenset)
    rescan: bool = False

    @classmethod
    def empty(cls) -> CellEffects:
        return cls(frozenset(), frozenset(), frozenset(), ())

    def candidates(self) -> frozenset[str]:
        """Every name the cell may have changed (bound, deleted or mutated)."""
        return self.bound | self.deleted | self.mutated


def analyze_cell(source: str) -> CellEffects:
    """Return the effects of ``source`` (IPython-transformed cell code) on the module namespace.

    Source that does not parse (a SyntaxError, null bytes) has no effects: it cannot have run.
    """
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return CellEffects.empty()
    collector = _Collector()
    for statement in tree.body:
        collector.module_statement(statement)
    collector.add_what_defined_functions_use()
    collector.add_what_aliases_changed()
    return CellEffects(
        bound=frozenset(collector.bound),
        deleted=frozenset(collector.deleted),
        mutated=frozenset(collector.mutated),
        imports=tuple(collector.imports),
        called=frozenset(collector.called),
        rescan=collector.rescan,
    )


def root_name(node: ast.expr) -> str | None:
    """The name at the root of ``a``, ``a.b.c``, ``a[0].b``, ``(a)``; None for anything else."""
    while True:
        if isinstance(node, ast.Name):
            return node.id
        if isinstance(node, ast.Attribute | ast.Subscript | ast.Starred):
            node = node.value
        else:
            return None


def _alias_roots(value: ast.expr) -> Iterable[str]:
    """The names whose objects ``value`` may hand on as they are: its root (``b``, ``b['k']``,
    ``b.items``) or those of a display's items (``[b]``, ``(b, [])``, ``{'k': b}``)."""
    if isinstance(value, ast.Tuple | ast.List | ast.Set):
        for element in value.elts:
            yield from _alias_roots(element)
    elif isinstance(value, ast.Dict):
        for item in [*value.keys, *value.values]:
            if item is not None:
                yield from _alias_roots(item)
    else:
        root = root_name(value)
        if root is not None:
            yield root


def target_names(target: ast.expr) -> Iterable[ast.expr]:
    """Flatten tuple/list/starred targets into their leaves (Names, Attributes, Subscripts)."""
    if isinstance(target, ast.Tuple | ast.List):
        for element in target.elts:
            yield from target_names(element)
    elif isinstance(target, ast.Starred):
        yield from target_names(target.value)
    else:
        yield target


class _Collector:
    """Walks module-level code. Function and lambda bodies are skipped except for ``global``."""

    def __init__(self) -> None:
        self.bound: set[str] = set()
        self.deleted: set[str] = set()
        self.mutated: set[str] = set()
        self.called: set[str] = set()
        self.imports: list[str] = []
        self.rescan = False
        # Names loaded at module level (a function passed on, aliased, called), and the names
        # each function the cell defines uses, over every definition of that name in the cell
        self.loaded: set[str] = set()
        self.defined_uses: dict[str, set[str]] = {}
        # Names local to the comprehensions being walked (innermost last).
        self._comprehension_locals: list[set[str]] = []
        # `a = b`, `a = b['k']`, `a = [b]`, `for a in b`: name -> the roots whose objects it may
        # hold; and the names the cell augments (`a += [1]` changes a list in place)
        self.aliases: dict[str, set[str]] = {}
        self.augmented: set[str] = set()

    # ----------------------------------------------------------------- statements at module level

    def module_statement(self, node: ast.stmt) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            self.bound.add(node.name)
            self._function_header(node.decorator_list, node.args, node.returns)
            _GlobalScan(self).scan_scope(node)
            uses = _names_used_in(node)
            self.defined_uses.setdefault(node.name, set()).update(uses)
            if node.decorator_list:  # a decorator is given the function: it may call it now
                self.mutated |= uses
        elif isinstance(node, ast.ClassDef):
            self.bound.add(node.name)
            for expression in [*node.decorator_list, *node.bases, *node.keywords]:
                self.expression(expression)
            # A class body runs now, in its own scope: its calls may mutate globals, its bindings
            # stay in the class. Only `global` declarations in it reach the module.
            self._class_body(node.body)
            _GlobalScan(self).scan_scope(node)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            self._import(node)
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Lambda) \
                and all(isinstance(target, ast.Name) for target in node.targets):
            # `step = lambda x: seen.add(x)`: as a `def`, what it uses counts once it may run
            self._function_header([], node.value.args, None)
            for target in node.targets:
                self.bind_target(target)
                self.defined_uses.setdefault(target.id, set()).update(
                    _names_used_in(node.value))
        elif isinstance(node, ast.Assign):
            self.expression(node.value)
            for target in node.targets:
                self.bind_target(target)
                self._alias(target, node.value)
        elif isinstance(node, ast.AugAssign):
            self.expression(node.value)
            self.bind_target(node.target)
            if isinstance(node.target, ast.Name):
                self.augmented.add(node.target.id)
        elif isinstance(node, ast.AnnAssign):
            if node.value is not None:
                self.expression(node.value)
                self.bind_target(node.target)
            elif not isinstance(node.target, ast.Name):
                # `obj.x: int` evaluates obj but stores nothing.
                self.expression(node.target)
        elif isinstance(node, ast.Delete):
            for target in node.targets:
                self.delete_target(target)
        elif isinstance(node, ast.For | ast.AsyncFor):
            self.expression(node.iter)
            self.bind_target(node.target)
            self._alias(node.target, node.iter)
            self._block(node.body)
            self._block(node.orelse)
        elif isinstance(node, ast.With | ast.AsyncWith):
            for item in node.items:
                self.expression(item.context_expr)
                if item.optional_vars is not None:
                    self.bind_target(item.optional_vars)
            self._block(node.body)
        elif isinstance(node, ast.Try | getattr(ast, "TryStar", ast.Try)):
            self._block(node.body)
            for handler in node.handlers:
                if handler.type is not None:
                    self.expression(handler.type)
                if handler.name:
                    # Python runs `del name` when the handler ends.
                    self.deleted.add(handler.name)
                self._block(handler.body)
            self._block(node.orelse)
            self._block(node.finalbody)
        elif isinstance(node, ast.If | ast.While):
            self.expression(node.test)
            self._block(node.body)
            self._block(node.orelse)
        elif isinstance(node, ast.Match):
            self.expression(node.subject)
            for case in node.cases:
                self._pattern(case.pattern)
                if case.guard is not None:
                    self.expression(case.guard)
                self._block(case.body)
        elif isinstance(node, ast.Expr | ast.Return):
            if node.value is not None:
                self.expression(node.value)
        elif isinstance(node, ast.Raise):
            for expression in (node.exc, node.cause):
                if expression is not None:
                    self.expression(expression)
        elif isinstance(node, ast.Assert):
            self.expression(node.test)
            if node.msg is not None:
                self.expression(node.msg)
        elif node.__class__.__name__ == "TypeAlias":  # Python 3.12 `type X = ...`
            self.bind_target(node.name)  # type: ignore[attr-defined]
        # Pass, Break, Continue, Global and Nonlocal at module level change nothing.

    def _block(self, statements: list[ast.stmt]) -> None:
        for statement in statements:
            self.module_statement(statement)

    def _class_body(self, statements: list[ast.stmt]) -> None:
        """Walk a class body for mutations of globals without recording its bindings."""
        inner = _Collector()
        inner._block(statements)
        self.mutated |= inner.mutated
        self.called |= inner.called
        self.rescan |= inner.rescan
        self.loaded |= inner.loaded
        for name, uses in inner.defined_uses.items():  # a method the class body itself runs
            if name in inner.called or name in inner.loaded:
                self.mutated |= uses

    def add_what_defined_functions_use(self) -> None:
        """A function the cell defines and may have run (called, passed on, aliased) may have
        mutated what its body uses. The encoder follows a called name's function as the
        namespace holds it after the cell, which misses a definition the cell replaced (``def
        grow(): b.append(7)``, ``grow()``, ``def grow(): ...``) or deleted; so every
        definition's uses count (found by the property test of tests/kernel/test_shared_identity.py)."""
        for name, uses in self.defined_uses.items():
            if name in self.called or name in self.loaded:
                self.mutated |= uses

    def _alias(self, target: ast.expr, value: ast.expr) -> None:
        if self._comprehension_locals:
            return
        roots = set(_alias_roots(value))
        if roots:
            for leaf in target_names(target):
                if isinstance(leaf, ast.Name):
                    self.aliases.setdefault(leaf.id, set()).update(roots)

    def add_what_aliases_changed(self) -> None:
        """A name changed in place while it held another name's object changed that object too,
        though the cell may rebind the name afterwards and never mention the other one again
        (``a = b``, ``a += [1]``, ``a = []``: ``b`` changed; found by the property test of
        tests/kernel/test_shared_identity.py). The roots it was given count as mutated."""
        changed = (self.mutated | self.augmented) & self.aliases.keys()
        while changed:
            roots = set().union(*(self.aliases[name] for name in changed)) - self.mutated
            self.mutated |= roots
            changed = roots & self.aliases.keys()

    def _function_header(
        self, decorators: list[ast.expr], args: ast.arguments, returns: ast.expr | None
    ) -> None:
        """Decorators, defaults and annotations run at definition time, at module level."""
        for expression in [*decorators, *args.defaults, *(d for d in args.kw_defaults if d)]:
            self.expression(expression)
        if returns is not None:
            self.expression(returns)

    def _import(self, node: ast.Import | ast.ImportFrom) -> None:
        self.imports.append(ast.unparse(node))
        for alias in node.names:
            if alias.name == "*":
                self.rescan = True
            elif alias.asname:
                self.bound.add(alias.asname)
            elif isinstance(node, ast.Import):
                self.bound.add(alias.name.split(".", 1)[0])
            else:
                self.bound.add(alias.name)

    def _pattern(self, pattern: ast.pattern) -> None:
        for node in ast.walk(pattern):
            if isinstance(node, ast.MatchAs | ast.MatchStar) and node.name:
                self.bound.add(node.name)
            elif isinstance(node, ast.MatchMapping) and node.rest:
                self.bound.add(node.rest)

    # ------------------------------------------------------------------------------- targets

    def bind_target(self, target: ast.expr) -> None:
        for leaf in target_names(target):
            if isinstance(leaf, ast.Name):
                self._bind(leaf.id)
            else:
                self._store_into(leaf)

    def delete_target(self, target: ast.expr) -> None:
        for leaf in target_names(target):
            if isinstance(leaf, ast.Name):
                if not self._is_comprehension_local(leaf.id):
                    self.deleted.add(leaf.id)
            else:
                self._store_into(leaf)

    def _bind(self, name: str) -> None:
        if self._comprehension_locals:
            self._comprehension_locals[-1].add(name)
        else:
            self.bound.add(name)

    def _store_into(self, leaf: ast.expr) -> None:
        """``a.b = v``, ``a[k] = v``, ``del a[k]``: ``a`` is mutated; the index is evaluated."""
        self._mark_mutated(leaf)
        self.expression(leaf)

    def _mark_mutated(self, node: ast.expr) -> None:
        name = root_name(node)
        if name is not None and not self._is_comprehension_local(name):
            self.mutated.add(name)

    def _is_comprehension_local(self, name: str) -> bool:
        return any(name in scope for scope in self._comprehension_locals)

    # ---------------------------------------------------------------------------- expressions

    def expression(self, node: ast.AST) -> None:
        """Walk an expression evaluated at module level (or in a module-level comprehension)."""
        if isinstance(node, ast.Lambda):
            self._function_header([], node.args, None)
            # its body runs in its own scope, later or now (``(lambda: b.append(1))()``,
            # ``map(lambda x: seen.add(x), xs)``): what it uses may change
            self.mutated |= _names_used_in(node)
            return
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            self.loaded.add(node.id)
            return
        if isinstance(node, _COMPREHENSIONS):
            self._comprehension(node)
            return
        if isinstance(node, ast.NamedExpr):
            self.expression(node.value)
            # PEP 572: a walrus inside a comprehension binds in the enclosing (module) scope.
            if isinstance(node.target, ast.Name):
                self.bound.add(node.target.id)
            return
        if isinstance(node, ast.Call):
            self._call(node)
        for child in ast.iter_child_nodes(node):
            self.expression(child)

    def _call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name):
            if not self._is_comprehension_local(func.id):
                self.called.add(func.id)
            if func.id in _RESCAN_CALLS:
                self.rescan = True
        elif isinstance(func, ast.Attribute):
            # `lst.append(x)`, `model.train()`, `a.b.c()`: the root object may change.
            self._mark_mutated(func.value)
            if func.attr in ("run_line_magic", "run_cell_magic") and _is_get_ipython(func.value):
                self._magic(node)
        for argument in [*node.args, *(keyword.value for keyword in node.keywords)]:
            # A callee may mutate what it is given: `f(lst)`, `f(a.b)`, `f(*xs)`, `f(**opts)`.
            if isinstance(argument, ast.Name | ast.Attribute | ast.Subscript | ast.Starred):
                self._mark_mutated(argument)

    def _magic(self, node: ast.Call) -> None:
        first = node.args[0] if node.args else None
        name = first.value if isinstance(first, ast.Constant) else None
        if not isinstance(name, str) or name not in _HARMLESS_MAGICS:
            self.rescan = True

    def _comprehension(self, node: ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp):
        generators = node.generators
        # The first iterable is evaluated in the enclosing scope, before the comprehension's own.
        self.expression(generators[0].iter)
        self._comprehension_locals.append(set())
        try:
            for index, generator in enumerate(generators):
                if index:
                    self.expression(generator.iter)
                self.bind_target(generator.target)
                for condition in generator.ifs:
                    self.expression(condition)
            if isinstance(node, ast.DictComp):
                self.expression(node.key)
                self.expression(node.value)
            else:
                self.expression(node.elt)
        finally:
            self._comprehension_locals.pop()


def _names_used_in(function: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> set[str]:
    """Every name a function's body (nested functions included) loads: the globals it may
    mutate, over-approximated with its locals (a local that is also a global costs one
    comparison)."""
    roots = [function.body] if isinstance(function, ast.Lambda) else function.body
    a = function.args
    parameters = {arg.arg for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]
                  if arg is not None}
    return {node.id for root in roots for node in ast.walk(root)
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)} - parameters


def _is_get_ipython(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "get_ipython"
    )


class _GlobalScan:
    """Finds names that functions and classes declare ``global`` and then bind or delete.

    Each function or class body is its own scope; a ``global x`` there makes its bindings of ``x``
    module-level. Nested scopes are scanned with their own declarations.
    """

    def __init__(self, collector: _Collector) -> None:
        self.collector = collector

    def scan_scope(self, scope: ast.AST) -> None:
        body = [] if isinstance(scope, ast.Lambda) else scope.body  # type: ignore[attr-defined]
        declared: set[str] = set()
        own_nodes: list[ast.AST | _NameBinding] = []
        nested: list[ast.AST] = []
        stack: list[ast.AST] = list(reversed(body))
        while stack:
            node = stack.pop()
            if isinstance(node, _SCOPE_NODES):
                nested.append(node)
                # Decorators, defaults and bases are evaluated in the enclosing scope.
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    own_nodes.append(_NameBinding(node.name))
                continue
            if isinstance(node, ast.Global):
                declared.update(node.names)
            own_nodes.append(node)
            stack.extend(reversed(list(ast.iter_child_nodes(node))))
        if declared:
            for node in own_nodes:
                self._record(node, declared)
        for child in nested:
            self.scan_scope(child)

    def _record(self, node: ast.AST | _NameBinding, declared: set[str]) -> None:
        collector = self.collector
        if isinstance(node, _NameBinding):
            if node.name in declared:
                collector.bound.add(node.name)
        elif isinstance(node, ast.Name) and node.id in declared:
            if isinstance(node.ctx, ast.Store):
                collector.bound.add(node.id)
            elif isinstance(node.ctx, ast.Del):
                collector.deleted.add(node.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                bound = alias.asname or alias.name.split(".", 1)[0]
                if bound in declared:
                    collector.bound.add(bound)
        elif isinstance(node, ast.ExceptHandler) and node.name in declared:
            collector.deleted.add(node.name)
        elif isinstance(node, ast.MatchAs | ast.MatchStar) and node.name in declared:
            collector.bound.add(node.name)


@dataclass(frozen=True)
class _NameBinding:
    """A stand-in for ``def name``/``class name`` inside a scanned scope."""

    name: str
