"""Object identity across names: the table of shared objects every replica resolves the same way.

Each synced name is pickled on its own, so an object held by two names (``alias = d['k']``) would
become two copies on a standby. This module keeps identity without giving an id to every value:

- every synced *root* (a name, or a shared object, see below) records the objects its pickle holds
  inline (``IdentityTable.register``: the pickler's memo, a C-level copy);
- when a root being encoded holds inline an object another root holds too (``held_elsewhere``),
  that object is *shared*: it gets a token (``share``), becomes a root of its own
  (``object_root(token)``, synced as a separate entry), and both roots are pickled again with
  the object pre-loaded in the pickler's memo, so the pickle refers to it by memo index and the
  token list travels with the payload;
- a standby keeps token -> object (``adopt``); an update to a shared object's contents is applied
  *in place* (``make_shell`` / ``fill``), so every holder of it sees the change.

A *unit* (a matplotlib figure, ``_UNIT_CLASSES``) is a shared object synced whole: nothing inside it
gets a token; other roots refer to an object inside it by the unit's token and the object's memo
index in the unit's pickle (``unit_ref`` / ``resolve_ref``).

Only the roots a cell touched are pickled (and the shared objects they reach); untouched names are
neither pickled nor hashed. Immutable values (numbers, strings, tuples, frozensets) and classes are
never given tokens (their identity is not observable through mutation; notebook classes keep theirs
through cloudpickle's class tracker); tensors and large arrays have their own table in sync_codec.
See docs/state-sync.md, "Shared objects".
"""

from __future__ import annotations

import collections
import copyreg
import sys
import types
from collections.abc import Callable, Iterable
from typing import Any

OBJECT_ROOT_PREFIX = "\x00obj:"  # entries of shared objects; never a name a notebook binds

# Never tracked nor shared: immutable values (identity unobservable) and objects pickled by name.
_UNTRACKED: frozenset[type] = frozenset({
    int, float, complex, str, bytes, bool, type(None), tuple, frozenset, range, slice,
    type(Ellipsis), type(NotImplemented), types.CodeType, types.CellType, types.ModuleType,
    types.BuiltinFunctionType, types.MethodType, types.MethodWrapperType,
    types.WrapperDescriptorType, types.MappingProxyType,
})
# Objects whose contents are reset before an update is applied in place (``fill``).
_CLEARABLE = (list, dict, set, bytearray, collections.deque)


def object_root(token: str) -> str:
    """The entry name under which a shared object's contents are synced."""
    return OBJECT_ROOT_PREFIX + token


def is_object_root(root: str) -> bool:
    return root.startswith(OBJECT_ROOT_PREFIX)


def token_of_root(root: str) -> str:
    if not is_object_root(root):
        raise ValueError(f"{root!r} is not a shared object's entry")
    return root[len(OBJECT_ROOT_PREFIX):]


def untracked_type(kind: type) -> bool:
    """Values of this type are never shared (immutable, or pickled by reference)."""
    return kind in _UNTRACKED or issubclass(kind, type)


# Units: objects synced as one whole, whose insides keep their identity as part of it (a name
# holding an object inside a unit refers to it by the unit's token and its index in the unit's
# pickle). A matplotlib figure is one tangle of thousands of objects -- every artist knows its
# figure, transforms keep weak references to their parents and turn them into strong ones in
# ``__getstate__`` -- that matplotlib pickles and restores only as a whole (``Figure.__setstate__``
# calls into its transforms); sharing its parts one by one gave a token to ~60 objects per axes and
# took one more pickle of the figure per layer of them. See docs/state-sync.md, "Units".
_UNIT_CLASSES = (("matplotlib.figure", "Figure"),)


def unit_types() -> tuple[type, ...]:
    """The unit classes whose modules are loaded (none: no unit can exist, nothing to check)."""
    found = []
    for module_name, name in _UNIT_CLASSES:
        module = sys.modules.get(module_name)
        cls = getattr(module, name, None) if module is not None else None
        if isinstance(cls, type):
            found.append(cls)
    return tuple(found)


def is_unit(obj: Any) -> bool:
    kinds = unit_types()
    return bool(kinds) and isinstance(obj, kinds)


def rewinding_type() -> type | None:
    """The class ``rewinding_reduce`` handles, when its module is loaded."""
    cbook = sys.modules.get("matplotlib.cbook")
    registry = getattr(cbook, "CallbackRegistry", None) if cbook is not None else None
    return registry if isinstance(registry, type) else None


def rewinding_reduce(obj: Any) -> tuple | None:
    """The reduction of an object whose ``__getstate__`` changes it, with the change undone; None
    for any other object. matplotlib's ``CallbackRegistry.__getstate__`` advances its id counter
    (``next(self._cid_gen)``), so a figure never pickled the same twice: every cell that touched
    one resent all of it, unchanged. The counter is set back to the value that went into the
    state (the next ``connect`` gets the id it would have got)."""
    registry = rewinding_type()
    if registry is None or type(obj) is not registry:
        return None
    reduced = obj.__reduce_ex__(5)
    state = reduced[2] if isinstance(reduced, tuple) and len(reduced) > 2 else None
    if isinstance(state, dict) and isinstance(state.get("_cid_gen"), int):
        import itertools

        obj._cid_gen = itertools.count(state["_cid_gen"])
    return reduced


def _pyplot_figures() -> Any:
    """matplotlib's table of the figures pyplot manages, when pyplot has been used."""
    helpers = sys.modules.get("matplotlib._pylab_helpers")
    return getattr(helpers, "Gcf", None)


def _managed_by_pyplot(figure: Any) -> bool:
    gcf = _pyplot_figures()
    manager = getattr(getattr(figure, "canvas", None), "manager", None)
    return gcf is not None and manager is not None and manager in gcf.figs.values()


def release_unit(obj: Any) -> None:
    """A standby dropped a unit (no synced name reaches it any more): a figure leaves pyplot, as
    the executor's did or will (its copy must not pile up in the standby's pyplot)."""
    if is_unit(obj) and _managed_by_pyplot(obj):
        _pyplot_figures().destroy_fig(obj)


def _refill_unit(obj: Any, state: Any, setstate: Callable[[Any], Any]) -> None:
    """Refill a standby's existing figure in place. ``Figure.__setstate__`` gives it a new canvas,
    and one more pyplot manager when the executor's figure is managed by pyplot: keep the one it
    has, and close it when the executor's is not managed any more (``plt.close(fig)``)."""
    managed = _managed_by_pyplot(obj)
    restore = isinstance(state, dict) and bool(state.get("_restore_to_pylab"))
    if managed and restore:
        state = {k: v for k, v in state.items() if k != "_restore_to_pylab"}
        canvas = obj.canvas
        setstate(state)
        obj.set_canvas(canvas)
        return
    setstate(state)
    if managed:
        _pyplot_figures().destroy_fig(obj)


Held = dict[int, tuple[int, Any]]  # a pickle memo: id(object) -> (memo index, object)


class IdentityTable:
    """Shared objects (token -> object) and which root holds which object inline.

    A root's inline objects are the memo of the pickler that serialised it (or of the unpickler
    that loaded it): collecting them costs one C-level dict copy, no Python call per object. They
    are kept (strong references: plain lists and dicts cannot be weakly referenced) until that
    root is encoded again or deleted; a shared object until no root references it (the encoder
    then deletes its entry). Not thread-safe: callers hold the ``SyncState`` lock.
    """

    def __init__(self, token_prefix: str) -> None:
        self._prefix = token_prefix
        self._counter = 0
        self.shared: dict[str, Any] = {}  # token -> object
        self._token_by_id: dict[int, str] = {}  # valid: the table keeps the objects alive
        self._held: dict[str, Held] = {}  # root -> the objects its payload holds inline
        self._owner: dict[int, str] = {}  # id -> a root holding it (checked against _held)
        self._stale = 0  # _owner entries that may no longer be held
        self.refs: dict[str, frozenset[str]] = {}  # root -> tokens its payload references
        self._referrers: dict[str, set[str]] = {}  # token -> roots referencing it
        self._orphans: set[str] = set()  # tokens that may have lost their last referrer
        self.units: set[str] = set()  # tokens of shared objects that are units (is_unit)
        self._interior: dict[int, str] = {}  # id -> a unit root holding it (checked on use)
        self._versions: dict[str, str] = {}  # unit token -> digest of its entry (refs name it)
        self._by_index: dict[str, dict[int, Any]] = {}  # unit root -> memo index -> object

    # ---- tokens
    def token_by_id(self) -> dict[int, str]:
        """id(object) -> token, for the pickler (read-only use)."""
        return self._token_by_id

    def interior_by_id(self) -> dict[int, str]:
        """id(object) -> a unit root that may hold it, for the pickler (read-only use; check
        with ``unit_ref``)."""
        return self._interior

    def token_for(self, obj: Any) -> str | None:
        token = self._token_by_id.get(id(obj))
        return token if token is not None and self.shared.get(token) is obj else None

    def share(self, obj: Any) -> str:
        """Give ``obj`` a new token (the executor, when a second root reaches it)."""
        self._counter += 1
        token = f"{self._prefix}.o{self._counter}"
        self.adopt(token, obj)
        return token

    def adopt(self, token: str, obj: Any) -> None:
        """Record ``token`` -> ``obj`` (a standby, for a token made by another replica)."""
        old = self.shared.get(token)
        if old is not None:
            self._token_by_id.pop(id(old), None)
        self.shared[token] = obj
        self._token_by_id[id(obj)] = token
        self._orphans.add(token)  # until a root registers a reference to it
        if is_unit(obj):
            self.units.add(token)

    def drop(self, token: str) -> None:
        """Forget a shared object no root references any more."""
        obj = self.shared.pop(token, None)
        if obj is not None and self._token_by_id.get(id(obj)) == token:
            del self._token_by_id[id(obj)]
        self._referrers.pop(token, None)
        self._orphans.discard(token)
        self.units.discard(token)
        self._versions.pop(token, None)
        self.unregister(object_root(token))

    # ---- units
    def unit_ref(self, obj: Any, root: str, untracked: Callable[[type], bool]) -> str | None:
        """How ``root``'s pickle refers to ``obj`` when it is a unit (``token``) or an object
        inside another root's unit (``token#index#version``: its memo index in the unit's
        pickle, and the unit's entry digest, so that the reference changes whenever the unit's
        contents do); None otherwise."""
        key = id(obj)
        token = self._token_by_id.get(key)
        if token is not None:
            return token if token in self.units and self.shared.get(token) is obj else None
        owner = self._interior.get(key)
        if owner is None or owner == root:
            return None
        held = self._held.get(owner)
        found = held.get(key) if held is not None else None
        if found is None or found[1] is not obj or untracked(type(obj)):
            return None
        token = token_of_root(owner)
        return f"{token}#{found[0]}#{self._versions.get(token, '')}"

    def resolve_ref(self, ref: str) -> Any:
        """The object a ``unit_ref`` names on this replica."""
        token, inside, rest = ref.partition("#")
        obj = self.shared.get(token)
        if obj is None or token not in self.units:
            raise ValueError(f"unit {token} is not available on this replica")
        if not inside:
            return obj
        index, _, version = rest.partition("#")
        if version != self._versions.get(token, ""):
            raise ValueError(f"unit {token} is not at the version {ref!r} refers to")
        root = object_root(token)
        table = self._by_index.get(root)
        if table is None:
            table = self._by_index[root] = {i: o for i, o in self._held.get(root, {}).values()}
        try:
            return table[int(index)]
        except (KeyError, ValueError):
            raise ValueError(f"unit {token} holds no object {index!r}") from None

    # ---- roots
    def owner_of(self, obj: Any) -> str | None:
        """A root (other than as a shared object) that holds ``obj`` inline, if any."""
        key = id(obj)
        root = self._owner.get(key)
        if root is None or key in self._token_by_id:
            return None
        held = self._held.get(root, {}).get(key)
        return root if held is not None and held[1] is obj else None

    def held_elsewhere(
        self, root: str, held: Held, untracked: Callable[[type], bool] = untracked_type
    ) -> list[tuple[int, Any, str]]:
        """``(memo index, object, other root)`` for each object ``held`` by ``root`` that another
        root holds inline too, in pickling order (a container before what it holds).

        Set operations on the ids first: only objects new to ``root`` are looked at (one it held
        already was checked when the later of the two roots was encoded)."""
        before = self._held.get(root, {})
        shared = self._token_by_id
        found = []
        for key in held.keys() & self._owner.keys():  # iterates the smaller of the two
            if key in before or key in shared:
                continue
            index, obj = held[key]
            if untracked(type(obj)):
                continue
            owner = self.owner_of(obj)
            if owner is not None and owner != root:
                found.append((index, obj, owner))
        found.sort(key=lambda item: item[0])
        return found

    def register(self, root: str, held: Held, refs: Iterable[str], version: str = "") -> None:
        """``root`` now holds ``held`` objects inline and references the tokens ``refs``;
        ``version``: a unit's entry digest."""
        self.unregister(root)
        self._held[root] = held
        self._owner.update(dict.fromkeys(held, root))
        if is_object_root(root) and token_of_root(root) in self.units:
            self._interior.update(dict.fromkeys(held, root))
            self._versions[token_of_root(root)] = version[-12:]
        frozen = frozenset(refs)
        if is_object_root(root):  # referring to itself does not keep it alive
            frozen -= {token_of_root(root)}
        self.refs[root] = frozen
        for token in frozen:
            self._referrers.setdefault(token, set()).add(root)
            self._orphans.discard(token)
        if self._stale > 2 * len(self._owner) + 100_000:
            self._rebuild_owners()

    def unregister(self, root: str) -> None:
        held = self._held.pop(root, None)
        if held is not None:
            self._stale += len(held)
        self._by_index.pop(root, None)
        for token in self.refs.pop(root, ()):
            referrers = self._referrers.get(token)
            if referrers is not None:
                referrers.discard(root)
                if not referrers:
                    self._orphans.add(token)

    def is_unit_root(self, root: str) -> bool:
        return is_object_root(root) and token_of_root(root) in self.units

    def _rebuild_owners(self) -> None:
        owners: dict[int, str] = {}
        interior: dict[int, str] = {}
        for root, held in self._held.items():
            owners.update(dict.fromkeys(held, root))
            if self.is_unit_root(root):
                interior.update(dict.fromkeys(held, root))
        self._owner = owners
        self._interior = interior
        self._stale = 0

    def referrers(self, token: str) -> frozenset[str]:
        return frozenset(self._referrers.get(token, ()))

    def take_orphans(self) -> list[str]:
        """Tokens that no root references (their objects can be dropped)."""
        orphans = sorted(t for t in self._orphans
                         if t in self.shared and not self._referrers.get(t))
        self._orphans.clear()
        return orphans


# ------------------------------------------------------------------- shells and in-place fills


def _content_free(value: Any) -> bool:
    """True when ``value`` (a reduction's constructor arguments) holds no mutable contents."""
    if isinstance(value, tuple):
        return all(_content_free(item) for item in value)
    return (
        type(value) in (int, float, complex, str, bytes, bool, type(None))
        or isinstance(value, type | types.FunctionType | types.BuiltinFunctionType
                      | types.CodeType | types.CellType)
        or type(value).__name__ == "_NamespaceRef"
    )


def reduction(obj: Any, reducer_override: Callable[[Any], Any]) -> tuple[tuple, tuple] | None:
    """``(shell, fill)`` for a shareable object, None when it cannot be shared.

    ``shell`` = ``(constructor, args)`` makes an empty object of the right type; ``fill`` =
    ``(kind, state, listitems, dictitems, setter)`` sets its contents (``fill_object``). An object
    whose constructor arguments carry its contents (``Counter``, custom ``__reduce__``) cannot be
    updated in place and is not shared: each name that holds it keeps its own copy.
    """
    kind = type(obj)
    if untracked_type(kind):
        return None
    if kind is set:
        return (set, ()), ("set", None, tuple(obj), None, None)
    if kind is bytearray:
        return (bytearray, ()), ("bytes", bytes(obj), None, None, None)
    try:
        reduced = reducer_override(obj)
        if reduced is NotImplemented:
            reducer = copyreg.dispatch_table.get(kind)
            reduced = reducer(obj) if reducer is not None else obj.__reduce_ex__(5)
    except Exception:  # noqa: BLE001 - cannot be reduced: not shareable
        return None
    if not isinstance(reduced, tuple) or not 2 <= len(reduced) <= 6:
        return None  # a string: pickled by reference (a singleton)
    constructor, args, *rest = reduced
    rest += [None] * (4 - len(rest))
    state, listitems, dictitems, setter = rest
    if not callable(constructor) or not isinstance(args, tuple) or not _content_free(args):
        return None
    return (
        (constructor, args),
        ("reduce", state, None if listitems is None else tuple(listitems),
         None if dictitems is None else tuple(dictitems), setter),
    )


def make_shell(shell: Any) -> Any:
    """A new, empty object from a ``(constructor, args)`` pair."""
    if not isinstance(shell, tuple) or len(shell) != 2 or not callable(shell[0]):
        raise ValueError("malformed shared object shell")
    constructor, args = shell
    return constructor(*args)


def fill_object(obj: Any, fill: Any, *, existing: bool) -> None:
    """Give ``obj`` the contents ``fill``; an ``existing`` object is cleared first (in place)."""
    if not isinstance(fill, tuple) or len(fill) != 5:
        raise ValueError("malformed shared object contents")
    kind, state, listitems, dictitems, setter = fill
    if existing and isinstance(obj, _CLEARABLE):
        if isinstance(obj, list | bytearray):
            del obj[:]
        else:
            obj.clear()
    if kind == "set":
        obj.update(listitems)
        return
    if kind == "bytes":
        obj[:] = state
        return
    if kind != "reduce":
        raise ValueError(f"unknown shared object kind {kind!r}")
    if listitems:
        if isinstance(obj, list):
            obj.extend(listitems)
        else:
            for item in listitems:
                obj.append(item)
    if dictitems:
        for key, value in dictitems:
            obj[key] = value
    if setter is not None:
        setter(obj, state)
        return
    setstate = getattr(obj, "__setstate__", None)
    if setstate is not None and getattr(type(obj), "__setstate__", None) is not None \
            and state is not None:
        if existing and is_unit(obj):
            _refill_unit(obj, state, setstate)
        else:
            setstate(state)
        return
    slots = None
    if isinstance(state, tuple) and len(state) == 2:
        state, slots = state
    if existing and hasattr(obj, "__dict__") and not isinstance(obj, type):
        obj.__dict__.clear()
    if state:
        obj.__dict__.update(state)
    if slots:
        for name, value in slots.items():
            setattr(obj, name, value)
