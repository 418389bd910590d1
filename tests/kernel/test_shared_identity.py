"""Object identity across names survives replication (issue 20): the codec, through a file store.

The codec-level differential test runs random programs (tests/kernel/programs.py) in plain
Python and in three replicas joined by the codec, with the executor replaced between cells; the
end-to-end one, on real replica processes, is tests/kernel/test_identity_differential.py.
"""

from __future__ import annotations

import os
import textwrap
from typing import Any

import pytest
from codec_pair import HMAC_KEY, Pair, new_namespace
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from programs import SETUP, canon, cells

from notebookos.kernel.ast_effects import analyze_cell
from notebookos.kernel.checkpoint_log import CheckpointLog
from notebookos.kernel.shared_objects import is_object_root, token_of_root
from notebookos.kernel.sync_codec import (
    StateApplier,
    StateEncoder,
    SyncState,
    SyncUpdate,
    read_checkpoint,
    restore_namespace,
    write_checkpoint,
)
from notebookos.store import LargeObjectStore, open_store


def sent(update: SyncUpdate) -> set[str]:
    """The names an update carries (shared objects as "<object>")."""
    return {"<object>" if is_object_root(e.name) else e.name for e in update.entries}


def test_alias_into_a_container_stays_the_same_object(pair: Pair) -> None:
    pair.run("d = {'k': []}\nalias = d['k']\nalias.append('x')")
    standby = pair.standby
    assert standby["alias"] is standby["d"]["k"] and standby["d"] == {"k": ["x"]}
    update = pair.run("alias.append('y')")
    assert sent(update) == {"<object>"}  # neither d nor alias: only the shared list's contents
    assert standby["d"] == {"k": ["x", "y"]} and standby["alias"] is standby["d"]["k"]


def test_sharing_with_a_name_the_cell_does_not_touch(pair: Pair) -> None:
    pair.run("cfg = {'optim': {'lr': 0.1}, 'data': list(range(5))}")
    pair.run("opt_cfg = cfg['optim']")  # cfg is only read: the table says it holds the dict
    assert pair.standby["opt_cfg"] is pair.standby["cfg"]["optim"]
    update = pair.run("opt_cfg['lr'] = 0.01")
    assert sent(update) == {"<object>"}
    assert pair.standby["cfg"]["optim"] == {"lr": 0.01}


def test_mutated_then_rebound_while_another_name_holds_the_old_object(pair: Pair) -> None:
    pair.run("a = [1]\nb = a")
    pair.run("a.append(2)")
    pair.run("a = [9]")
    pair.run("b.append(3)")
    assert pair.standby["a"] == [9] and pair.standby["b"] == [1, 2, 3]
    pair.run("a.append(b)")
    assert pair.standby["a"][1] is pair.standby["b"]


def test_cycles_functions_instances_and_class_attributes(pair: Pair) -> None:
    pair.run(textwrap.dedent("""
        x = []
        y = [x]
        x.append(y)
        def f():
            return 1
        g = f
        class K:
            registry = []
        k = K()
        k.tags = {'t'}
        tags = k.tags
        reg = K.registry
    """))
    s = pair.standby
    assert s["x"][0] is s["y"] and s["y"][0] is s["x"]
    assert s["g"] is s["f"] and s["tags"] is s["k"].tags
    pair.run("tags.add('u')\nx.append(1)")
    assert s["k"].tags == {"t", "u"} and s["y"][0][-1] == 1


def test_immutable_holders_keep_their_mutable_contents_shared(pair: Pair) -> None:
    pair.run("inner = []\npair_ = (inner, 1)")
    assert pair.standby["pair_"][0] is pair.standby["inner"]


def test_a_shared_object_is_deleted_with_its_last_holder(pair: Pair) -> None:
    pair.run("a = {'v': []}\nb = a")
    assert sent(pair.run("del a")) == {"a"}
    update = pair.run("del b")
    assert sent(update) == {"b", "<object>"}
    assert all(e.kind == "deleted" for e in update.entries)
    assert pair.executor_state.identity.shared == {}
    assert pair.standby_state.identity.shared == {}


def test_new_executor_after_failover_keeps_finding_shares(pair: Pair,
                                                          file_store: LargeObjectStore) -> None:
    pair.run("d = {'k': [], 'j': []}\nalias = d['k']")
    # the standby becomes the executor; the old executor is now the one that applies
    encoder = StateEncoder(file_store, pair.kernel_id, state=pair.standby_state)
    applier = StateApplier(file_store, state=pair.executor_state)
    try:
        for code in ("other = d['j']", "alias.append(1)\nother.append(2)"):
            exec(code, pair.standby)
            update = SyncUpdate.from_bytes(
                encoder.encode(pair.standby, analyze_cell(code)).to_bytes())
            applier.apply(pair.executor, update)
        old = pair.executor
        assert old["other"] is old["d"]["j"] and old["alias"] is old["d"]["k"]
        assert old["d"] == {"k": [1], "j": [2]}
    finally:
        applier.close()


def test_checkpoint_restores_shared_objects(pair: Pair, file_store: LargeObjectStore) -> None:
    pair.run("rows = [[1], [2]]\nfirst = rows[0]\nx = [first, first]")
    write_checkpoint(file_store, pair.kernel_id, pair.encoder.snapshot_entries(), 3)
    fresh = new_namespace()
    assert restore_namespace(file_store, read_checkpoint(file_store, pair.kernel_id), fresh,
                             state=SyncState()) == []
    assert fresh["first"] is fresh["rows"][0] is fresh["x"][0] is fresh["x"][1]


class Pickled:
    """Counts how often a value is pickled (a user value, not the codec)."""

    count = 0

    def __reduce__(self) -> tuple[Any, tuple]:
        Pickled.count += 1
        return (Pickled, ())


def test_untouched_names_are_not_pickled(pair: Pair) -> None:
    setup = ("import test_shared_identity as m\n"
             + "\n".join(f"v{i} = {{'p': m.Pickled(), 'l': [{i}]}}" for i in range(2000))
             + "\nshared = v1['l']")
    pair.run(setup)
    Pickled.count = 0
    update = pair.run("v7['l'].append(1)\ntouched = 1")
    assert Pickled.count == 1 and sent(update) == {"v7", "touched"}
    update = pair.run("shared.append(2)")
    assert Pickled.count == 1 and sent(update) == {"<object>"}
    assert pair.standby["v7"]["l"] == [7, 1] and pair.standby["v1"]["l"] == [1, 2]


def test_bad_shared_object_entry_fails_cleanly_and_keeps_the_old_value(pair: Pair) -> None:
    pair.run("a = [1]\nb = a")
    exec("a.append(2)", pair.executor)
    update = pair.encoder.encode(pair.executor, analyze_cell("a.append(2)"))
    (entry,) = update.entries
    entry.payload = entry.payload[:-3] + b"zzz"
    with pytest.raises(Exception) as raised:
        pair.applier.apply(pair.standby, update)
    assert entry.name in str(raised.value) and "digest" in str(raised.value)
    assert pair.standby["b"] == [1] and pair.standby["a"] is pair.standby["b"]


class Group:
    """Three replicas joined by the codec; the executor can be killed and replaced by one
    restored from the store's checkpoint (as the replica does)."""

    def __init__(self, store: LargeObjectStore) -> None:
        self.store = store
        self.kernel_id = "k-diff"
        self.replicas = [self._new() for _ in range(3)]
        self.executor = 0
        self.cells = 0

    def _new(self) -> dict[str, Any]:
        state = SyncState()
        return {"ns": new_namespace(), "state": state,
                "encoder": StateEncoder(self.store, self.kernel_id, state=state),
                "applier": StateApplier(self.store, state=state),
                "log": CheckpointLog(self.store, self.kernel_id, max_segments=4)}

    def run(self, code: str) -> None:
        executor = self.replicas[self.executor]
        exec(compile(code, "<cell>", "exec"), executor["ns"])
        record = executor["encoder"].encode(executor["ns"], analyze_cell(code)).to_bytes()
        for replica in self.replicas:
            update = SyncUpdate.from_bytes(record)
            replica["applier"].prefetch(update)
            replica["applier"].apply(replica["ns"], update)
        self.cells += 1
        executor["log"].write(executor["state"], self.cells)  # segments, as the replica does

    def fail_over(self) -> None:
        """Kill the executor; the next replica executes; a replacement restores the checkpoint."""
        dead = self.replicas.pop(self.executor)
        dead["applier"].close()
        fresh = self._new()
        failed = restore_namespace(self.store, read_checkpoint(self.store, self.kernel_id),
                                   fresh["ns"], state=fresh["state"])
        assert failed == []
        self.replicas.append(fresh)
        self.executor = 0

    def close(self) -> None:
        for replica in self.replicas:
            replica["applier"].close()


EXAMPLES = int(os.environ.get("NOTEBOOKOS_DIFF_EXAMPLES", "60"))


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(program=cells(), failovers=st.lists(st.booleans(), min_size=6, max_size=6))
@example(  # found by this test: the grow() that ran was replaced by the end of the cell
    program=["try:\n    b = []\nexcept Exception:\n    pass",
             "try:\n    def grow():\n        b.append(7)\n    grow()\nexcept Exception:\n"
             "    pass\ntry:\n    def grow():\n        a.append(7)\n    grow()\n"
             "except Exception:\n    pass"],
    failovers=[False] * 6)
@example(  # found by this test: a new shared list was filled twice on the standbys (its items
    # doubled) when the function holding it came first in the update; the entries' order varied
    # from run to run, see test_a_new_shared_object_is_filled_once_whatever_the_entry_order
    program=["try:\n    d = Box()\nexcept Exception:\n    pass",
             "try:\n    c = [d]\nexcept Exception:\n    pass\ntry:\n    def make(box=c):\n"
             "        def get():\n            return box\n        return get\n    d = make()\n"
             "except Exception:\n    pass\ntry:\n    def make(box=d):\n        def get():\n"
             "            return box\n        return get\n    c = make()\n"
             "except Exception:\n    pass",
             "try:\n    c = d[0]\nexcept Exception:\n    pass\ntry:\n    a = d()\n"
             "except Exception:\n    pass",
             "try:\n    d = Box()\nexcept Exception:\n    pass",
             "try:\n    d = Box()\nexcept Exception:\n    pass",
             "try:\n    d = Box()\nexcept Exception:\n    pass"],
    failovers=[True, True, True, False, True, False])
@example(  # found by this test: b's list changed through an alias the cell then rebound
    program=["try:\n    b = []\nexcept Exception:\n    pass",
             "try:\n    a = b\nexcept Exception:\n    pass\ntry:\n    a += [1]\n"
             "except Exception:\n    pass\ntry:\n    a = []\nexcept Exception:\n    pass"],
    failovers=[False] * 6)
def test_random_programs_match_plain_python_across_failovers(
    tmp_path_factory: pytest.TempPathFactory, program: list[str], failovers: list[bool]
) -> None:
    store = open_store(f"file://{tmp_path_factory.mktemp('diff')}", HMAC_KEY)
    group = Group(store)
    plain = new_namespace()
    try:
        for code in [SETUP, *program]:
            exec(compile(code, "<cell>", "exec"), plain)
            group.run(code)
            expected = canon(plain)
            for index, replica in enumerate(group.replicas):
                assert canon(replica["ns"]) == expected, (
                    f"replica {index} (executor {group.executor}) after:\n{code}")
            if code is not SETUP and failovers[program.index(code) % len(failovers)]:
                group.fail_over()
    finally:
        group.close()
        store.close()


def test_a_new_shared_object_is_filled_once_whatever_the_entry_order(
    pair: Pair, file_store: LargeObjectStore,
) -> None:
    """Found by the differential test: the standby filled shared objects each after those its
    contents refer to, but an object already filled as another's dependency was filled again
    when its own entry came later in the update, and a new list (extended, not cleared) held its
    items twice. The encoder's entry order varies (set iteration), so it is fixed here: the
    object that refers to the other first."""
    code = "inner = [1]\nouter = [inner]\nalias = outer"
    exec(code, pair.executor)
    update = SyncUpdate.from_bytes(
        pair.encoder.encode(pair.executor, analyze_cell(code)).to_bytes())
    objects = [e for e in update.entries if is_object_root(e.name)]
    assert len(objects) == 2  # outer's list and inner's list, one referring to the other
    holder = pair.executor_state.identity.token_for(pair.executor["outer"])
    assert holder is not None
    objects.sort(key=lambda e: token_of_root(e.name) != holder)  # the referrer first
    update.entries = [e for e in update.entries if not is_object_root(e.name)] + objects
    fresh = new_namespace()
    applier = StateApplier(file_store, state=SyncState())
    try:
        applier.apply(fresh, update)
    finally:
        applier.close()
    assert fresh["inner"] == [1] and fresh["outer"] == [[1]]
    assert fresh["outer"][0] is fresh["inner"] and fresh["alias"] is fresh["outer"]


def test_a_shared_object_changed_then_left_by_the_name_is_still_synced(pair: Pair) -> None:
    """Found by the differential test: b mutates the list a holds too, then b is rebound in the
    same cell; a is not touched, but the list's new contents must reach the standby."""
    pair.run("a = []\nb = a")
    pair.run("b.append(b)\nb = []")
    assert pair.standby["a"][0] is pair.standby["a"] and pair.standby["b"] == []
    pair.run("c = [1]\nd = c")
    pair.run("d.append(2)\ndel d")
    assert pair.standby["c"] == [1, 2]


def test_an_alias_changed_then_rebound_in_one_cell_syncs_the_object(pair: Pair) -> None:
    """Found by the differential test: ``a`` held ``b``'s list only during the cell, was changed
    in place through it and rebound; ``b`` is not named as changed, but its list changed."""
    pair.run("b = []")
    pair.run("a = b\na += [1]\na = []")
    assert pair.standby["b"] == [1] and pair.standby["a"] == []
    pair.run("c = [b]\nc[0].append(2)\nc = None")
    assert pair.standby["b"] == [1, 2]


def test_a_shared_object_that_cannot_be_serialised_warns_and_keeps_its_identity(
    pair: Pair,
) -> None:
    pair.run("a = {'v': 1}\nb = a")
    update = pair.run("import threading\nb['lock'] = threading.Lock()")
    assert any("the object shared by a, b could not be serialised" in w for w in update.warnings)
    assert pair.standby["a"] == {"v": 1} and pair.standby["a"] is pair.standby["b"]
    pair.run("del b['lock']\nb['v'] = 2")  # serialisable again: updated in place
    assert pair.standby["a"] == {"v": 2} and pair.standby["a"] is pair.standby["b"]


def test_large_arrays_inside_a_shared_object_keep_both_identities(pair: Pair) -> None:
    pair.run("import numpy as np\nX = np.ones(100_000)\ndata = {'X': X, 'meta': []}\nview = data")
    s = pair.standby
    assert s["view"] is s["data"] and s["data"]["X"] is s["X"]
    update = pair.run("X += 1\nview['meta'].append(1)")
    assert s["data"]["X"] is s["X"] and float(s["view"]["X"][0]) == 2.0
    assert s["data"]["meta"] == [1] and "data" not in sent(update)
