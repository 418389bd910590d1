"""State-sync codec: executor -> Raft record -> standby, through real stores (file, Redis, S3)."""

from __future__ import annotations

import io
import os
import pickle
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import numpy
import pytest
from codec_pair import HMAC_KEY, Pair, new_namespace
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from notebookos.kernel import rng_state
from notebookos.kernel.ast_effects import CellEffects, analyze_cell
from notebookos.kernel.sync_codec import (
    Checkpoint,
    RestoreSplit,
    StateApplier,
    StateEncoder,
    SyncApplyError,
    SyncEntry,
    SyncState,
    SyncUpdate,
    object_key,
    read_checkpoint,
    restore_namespace,
    write_checkpoint,
)
from notebookos.store import KeyNotFound, LargeObjectStore, open_store

try:
    import torch
except ImportError:  # torch is optional at run time: only the tests marked needs_torch need it
    torch = None


needs_torch = pytest.mark.usefixtures("torch_installed")


def names(update: SyncUpdate) -> dict[str, str]:
    return {entry.name: entry.kind for entry in update.entries}


# ------------------------------------------------------------------------ what gets synced

# (id, setup cell, cell, names whose values must then be equal on both sides)
SYNC_FORMS = [
    ("assign", "", "x = 1", ["x"]),
    ("unpack", "", "a, (b, *c) = 1, (2, 3, 4)", ["a", "b", "c"]),
    ("augmented", "n = 1", "n += 41", ["n"]),
    ("annotated", "", "y: int = 3", ["y"]),
    ("walrus_in_comprehension", "", "[(last := i) for i in range(5)]", ["last"]),
    ("for", "", "for i in range(3):\n    acc = i * 2", ["i", "acc"]),
    ("with", "import contextlib", "with contextlib.nullcontext(7) as seven:\n    pass", ["seven"]),
    ("import_as", "", "import json as js", ["js"]),
    ("from_import_function", "", "from math import sqrt", ["sqrt"]),
    ("global_in_function", "def bump():\n    global counter\n    counter = 10", "bump()",
     ["counter"]),
    ("match", "", "match [1, 2, 3]:\n    case [h, *t]:\n        pass", ["h", "t"]),
    ("list_append", "lst = []", "lst.append(1)", ["lst"]),
    ("dict_store", "d = {}", "d['k'] = 'v'", ["d"]),
    ("passed_to_function", "data = []\ndef fill(x):\n    x.extend([1, 2])", "fill(data)", ["data"]),
    ("mutated_through_called_function", "out = []\ndef step():\n    out.append(len(out))",
     "step()", ["out"]),
    ("function_passed_as_argument", "seen = []\ndef visit(v):\n    seen.append(v)",
     "list(map(visit, [1, 2]))", ["seen"]),
    ("star_import_rescan", "", "from string import *", ["ascii_letters", "digits"]),
    ("globals_store_rescan", "", "globals()['odd-name'] = 5", ["odd-name"]),
]


@pytest.mark.parametrize("setup, cell, expected", [r[1:] for r in SYNC_FORMS],
                         ids=[r[0] for r in SYNC_FORMS])
def test_binding_forms_reach_the_standby(pair: Pair, setup: str, cell: str,
                                         expected: list[str]) -> None:
    if setup:
        pair.run(setup)
    pair.run(cell)
    for name in expected:
        assert name in pair.standby, f"{name} was not replicated"
        assert pair.standby[name] == pair.executor[name], name


def test_unchanged_values_are_not_resent(pair: Pair) -> None:
    assert names(pair.run("x = 1\nlst = [1, 2]")) == {"x": "inline", "lst": "inline"}
    assert names(pair.run("x = 1\nlst.sort()")) == {}
    assert names(pair.run("lst.append(3)")) == {"lst": "inline"}
    assert pair.standby["lst"] == [1, 2, 3]


def test_deletion_and_except_target(pair: Pair) -> None:
    pair.run("x = 1\ny = 2\nerr = 'old'")
    update = pair.run("del x\ntry:\n    1 / 0\nexcept ZeroDivisionError as err:\n    pass")
    assert names(update) == {"x": "deleted", "err": "deleted"}
    assert "x" not in pair.standby and "err" not in pair.standby
    assert pair.standby["y"] == 2
    assert "x" not in pair.encoder.snapshot_entries()


def test_rebound_after_delete_in_same_cell_is_synced(pair: Pair) -> None:
    pair.run("x = 1")
    pair.run("del x\nx = 2")
    assert pair.standby["x"] == 2


def test_modules_are_reimported_not_pickled(pair: Pair) -> None:
    update = pair.run("import numpy as np\nfrom os import path\nimport xml.dom")
    entries = {e.name: e for e in update.entries}
    assert entries["np"].kind == "module" and entries["np"].module == "numpy"
    assert entries["path"].kind == "module" and entries["path"].module == os.path.__name__
    assert entries["xml"].module == "xml"
    assert pair.standby["np"] is numpy and pair.standby["path"] is os.path


def test_internal_names_are_never_synced(pair: Pair) -> None:
    pair.executor.update({"_": 1, "__": 2, "_i3": "x", "_7": 7, "In": [], "Out": {},
                          "_notebookos_state": 1, "get_ipython": print})
    update = pair.replicate(CellEffects(frozenset({"_", "_i3", "_7", "In", "_notebookos_state"}),
                                        frozenset(), frozenset(), (), rescan=True))
    assert names(update) == {}


def test_notebook_functions_and_classes_travel_by_value_and_see_live_globals(pair: Pair) -> None:
    pair.run("""
        scale = 2
        def double(v):
            return v * scale
        class Box:
            def __init__(self, v):
                self.v = v
            def doubled(self):
                return double(self.v)
        box = Box(21)
    """)
    assert pair.standby["box"].doubled() == 42
    assert isinstance(pair.standby["box"], pair.standby["Box"])
    pair.run("scale = 3")
    # The standby's function reads the standby's namespace, not a copy taken at sync time.
    assert pair.standby["double"](1) == 3
    assert pair.standby["double"].__globals__ is pair.standby


def test_threshold_decides_inline_or_pointer(file_store: LargeObjectStore) -> None:
    p = Pair(file_store, threshold_bytes=1000)
    try:
        update = p.run("small = 'a' * 10\nlarge = 'b' * 5000")
        entries = {e.name: e for e in update.entries}
        assert entries["small"].kind == "inline" and entries["small"].payload
        assert entries["large"].kind == "pointer" and entries["large"].payload is None
        assert entries["large"].store_key == object_key(p.kernel_id, entries["large"].store_key
                                                        .rsplit("/", 1)[1])
        assert file_store.exists(entries["large"].store_key)
        assert p.standby["large"] == "b" * 5000
    finally:
        p.close()


def test_unpicklable_value_warns_and_others_still_sync(pair: Pair) -> None:
    pair.run("import socket\nsock = 1")
    update = pair.run("sock = socket.socket()\nholder = {'s': sock}\nok = 5")
    try:
        assert pair.standby["ok"] == 5
        assert any("'holder'" in w for w in update.warnings), update.warnings
        assert any("'sock'" in w and "socket" in w for w in update.warnings), update.warnings
        # sock was synced as 1 before: the standby must not keep that stale value.
        assert names(update)["sock"] == "deleted" and "sock" not in pair.standby
        assert "holder" not in pair.standby
    finally:
        pair.executor["sock"].close()


def test_record_decoding_never_runs_code(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    record = b"NBSYNC\x01" + pickle.dumps({"v": 1, "e": [Evil()], "w": []})
    with pytest.raises(ValueError, match="malformed sync update"):
        SyncUpdate.from_bytes(record)
    assert not marker.exists()
    with pytest.raises(ValueError, match="bad magic"):
        SyncUpdate.from_bytes(b"garbage")
    with pytest.raises(ValueError, match="unknown kind"):
        SyncUpdate.from_bytes(SyncUpdate([SyncEntry("x", "weird", "d")]).to_bytes())


def test_corrupted_inline_payload_is_refused_naming_the_variable(pair: Pair) -> None:
    pair.run("x = 1")
    exec("x = 2\ny = 3", pair.executor)
    update = pair.encoder.encode(pair.executor, analyze_cell("x = 2\ny = 3"))
    bad_x = next(e for e in update.entries if e.name == "x")
    bad_x.payload = bad_x.payload[:-1] + b"\x00"
    with pytest.raises(SyncApplyError) as caught:
        pair.applier.apply(pair.standby, SyncUpdate.from_bytes(update.to_bytes()))
    assert set(caught.value.failures) == {"x"} and "digest" in caught.value.failures["x"]
    assert pair.standby["x"] == 1 and pair.standby["y"] == 3


def test_entries_of_an_earlier_replica_with_sha256_digests_still_apply(
        file_store: LargeObjectStore) -> None:
    """Replicas before BLAKE3 wrote bare SHA-256 hex digests (still in older checkpoints, and
    sent by an older peer): they are checked with SHA-256, and a wrong payload is still refused."""
    import hashlib

    pair = Pair(file_store, threshold_bytes=100)
    try:
        exec("small = [1, 2, 3]\nbig = list(range(1000))", pair.executor)
        update = pair.encoder.encode(pair.executor, analyze_cell("small = 1\nbig = 2"))
        record = SyncUpdate.from_bytes(update.to_bytes())
        kinds = {entry.name: entry.kind for entry in record.entries}
        assert kinds == {"small": "inline", "big": "pointer"}
        assert all(entry.digest.startswith("b3-") for entry in record.entries)
        for entry in record.entries:
            payload = entry.payload if entry.kind == "inline" else file_store.get(entry.store_key)
            entry.digest = hashlib.sha256(payload).hexdigest()
        pair.applier.apply(pair.standby, SyncUpdate.from_bytes(record.to_bytes()))
        assert pair.standby["small"] == [1, 2, 3] and pair.standby["big"] == list(range(1000))

        exec("small = [4]", pair.executor)
        update = pair.encoder.encode(pair.executor, analyze_cell("small = 1"))
        record = SyncUpdate.from_bytes(update.to_bytes())
        (entry,) = record.entries
        entry.digest = hashlib.sha256(entry.payload + b"tampered").hexdigest()
        with pytest.raises(SyncApplyError) as caught:
            pair.applier.apply(pair.standby, SyncUpdate.from_bytes(record.to_bytes()))
        assert "digest" in caught.value.failures["small"]
        assert pair.standby["small"] == [1, 2, 3]
    finally:
        pair.close()


@needs_torch
def test_tampered_store_object_is_refused(pair: Pair, file_store: LargeObjectStore,
                                          tmp_path: Path) -> None:
    pair.executor["torch"] = torch
    exec("weights = torch.arange(100000, dtype=torch.float32)", pair.executor)
    update = pair.encoder.encode(pair.executor, analyze_cell("weights = 1"))
    record = SyncUpdate.from_bytes(update.to_bytes())
    (entry,) = record.entries
    (tensor_key,) = entry.tensors.values()
    # Someone without the kernel key overwrites the object: the store's HMAC check refuses it.
    forger = open_store(f"file://{tmp_path / 'objects'}", b"not-the-kernel-key-000000000000")
    forger.put(tensor_key, b"evil bytes")
    with pytest.raises(SyncApplyError) as caught:
        pair.applier.apply(pair.standby, record)
    assert list(caught.value.failures) == ["weights"]
    assert "weights" not in pair.standby


# -------------------------------------------------------------------------------- torch state


@needs_torch
def test_model_and_optimizer_share_parameters_on_the_standby(pair: Pair) -> None:
    pair.run("""
        import torch
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        opt = torch.optim.Adam(model.parameters(), lr=0.1)
        first_weight = model[0].weight
    """)
    standby_params = list(pair.standby["model"].parameters())
    assert all(a is b for a, b in zip(standby_params, pair.standby["opt"].param_groups[0]["params"],
                                      strict=True))
    pair.run("""
        loss = model(torch.ones(4, 8)).sum()
        loss.backward()
    """)
    # opt.step() names only `opt`, yet changes the model's parameters in place: the entries that
    # hold those parameters are refreshed too, and the standby's parameter objects are updated in
    # place, so even an alias that no entry of this update names sees the new values.
    update = pair.run("opt.step()")
    assert names(update) == {"opt": "pointer", "model": "pointer", "first_weight": "pointer"}
    for mine, theirs in zip(pair.executor["model"].parameters(),
                            pair.standby["model"].parameters(), strict=True):
        assert torch.equal(mine, theirs)
    assert pair.standby["first_weight"] is pair.standby["model"][0].weight
    assert pair.standby["opt"].state_dict()["state"][0]["exp_avg"].abs().sum() > 0
    # The standby can carry on training with a consistent model/optimizer pair.
    model, opt = pair.standby["model"], pair.standby["opt"]
    before = model[0].weight.detach().clone()
    model(torch.ones(4, 8)).sum().backward()
    opt.step()
    assert not torch.equal(before, model[0].weight)


@needs_torch
def test_tensors_arrays_modules_always_go_to_the_store(pair: Pair) -> None:
    update = pair.run("""
        import torch, numpy
        t = torch.ones(3)
        arr = numpy.arange(4)
        lin = torch.nn.Linear(2, 2)
        mixed = {'w': torch.zeros(2), 'n': 1}
    """)
    kinds = names(update)
    assert kinds["t"] == kinds["arr"] == kinds["lin"] == "pointer"
    assert kinds["mixed"] == "inline"
    assert numpy.array_equal(pair.standby["arr"], numpy.arange(4))
    assert torch.equal(pair.standby["mixed"]["w"], torch.zeros(2))


@needs_torch
def test_large_tensor_alias_and_inplace_change(pair: Pair) -> None:
    pair.run("import torch\nbig = torch.randn(512, 512)\nalias = big")
    assert pair.standby["alias"] is pair.standby["big"]
    assert torch.equal(pair.standby["big"], pair.executor["big"])
    held = pair.standby["big"]
    assert names(pair.run("big.sum()")) == {}  # unchanged: nothing resent
    pair.run("big.mul_(2)")
    assert pair.standby["big"] is held and pair.standby["alias"] is held  # updated in place
    assert torch.equal(held, pair.executor["big"])


@needs_torch
def test_failover_encoder_continues_from_applied_state(pair: Pair,
                                                       file_store: LargeObjectStore) -> None:
    """The standby becomes executor: unchanged names are not resent; identity survives."""
    pair.run("import torch\nmodel = torch.nn.Linear(4, 4)\nopt = torch.optim.SGD(model.parameters())"
             "\nx = 1")
    new_executor = StateEncoder(file_store, pair.kernel_id, state=pair.standby_state)
    third_state = SyncState()
    third = new_namespace()
    with StateApplier(file_store, state=third_state) as applier:
        first = SyncUpdate(list(new_executor.snapshot_entries().values()))
        applier.apply(third, first)  # the third replica catches up from a snapshot
        exec("model(torch.ones(1, 4)).sum().backward()\nopt.step()\nx = 1", pair.standby)
        update = new_executor.encode(pair.standby, analyze_cell("opt.step()\nx = 1"))
        assert "x" not in names(update)
        applier.apply(third, SyncUpdate.from_bytes(update.to_bytes()))
    assert torch.equal(third["model"].weight, pair.standby["model"].weight)
    assert third["model"].weight is third["opt"].param_groups[0]["params"][0]


# -------------------------------------------------------------------------------- checkpoints


@needs_torch
def test_checkpoint_write_read_restore(pair: Pair, file_store: LargeObjectStore) -> None:
    with pytest.raises(KeyNotFound):
        read_checkpoint(file_store, pair.kernel_id)
    pair.run("""
        import torch, math
        model = torch.nn.Linear(3, 3)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        big = torch.randn(300, 300)
        text = 'hello'
        def area(r):
            return math.pi * r * r
    """)
    pair.run("del text")
    write_checkpoint(file_store, pair.kernel_id, pair.encoder.snapshot_entries(), 7)
    checkpoint = read_checkpoint(file_store, pair.kernel_id)
    assert isinstance(checkpoint, Checkpoint)
    assert checkpoint.execution_count == 7 and checkpoint.kernel_id == pair.kernel_id
    # and the random generators' states: the cell drew from torch's (kernel/rng_state.py)
    assert set(checkpoint.entries) == {"torch", "math", "model", "opt", "big", "area",
                                       rng_state.RNG_ROOT}

    rebuilt = new_namespace()
    assert restore_namespace(file_store, checkpoint, rebuilt) == []
    assert rebuilt["area"](1) == pytest.approx(3.14159, rel=1e-4)
    assert torch.equal(rebuilt["big"], pair.executor["big"])
    assert rebuilt["model"].weight is rebuilt["opt"].param_groups[0]["params"][0]
    assert torch.equal(rebuilt["model"].weight, pair.executor["model"].weight)


@needs_torch
def test_restore_reports_what_it_could_not_restore(pair: Pair,
                                                   file_store: LargeObjectStore) -> None:
    pair.run("import torch\nkeep = 1\nlost = torch.randn(200, 200)")
    entries = pair.encoder.snapshot_entries()
    (lost_key,) = entries["lost"].tensors.values()
    file_store.delete(lost_key)
    write_checkpoint(file_store, pair.kernel_id, entries, 2)
    rebuilt = new_namespace()
    failed = restore_namespace(file_store, read_checkpoint(file_store, pair.kernel_id), rebuilt)
    assert failed == ["lost"]
    assert rebuilt["keep"] == 1


def test_restore_tells_how_long_reading_and_applying_took(pair: Pair,
                                                          file_store: LargeObjectStore) -> None:
    """The split a wake reports (benchmarks/hibernate.py): until the last large object was
    fetched, then the decoding left after it."""
    pair.run("import numpy as np\nbig = np.arange(3_000_000)\nsmall = {'a': 1}")
    write_checkpoint(file_store, pair.kernel_id, pair.encoder.snapshot_entries(), 3)
    started = time.monotonic()
    split = RestoreSplit()
    rebuilt = new_namespace()
    assert restore_namespace(file_store, read_checkpoint(file_store, pair.kernel_id), rebuilt,
                             split=split, started=started) == []
    took = time.monotonic() - started
    assert int(rebuilt["big"].sum()) == int(numpy.arange(3_000_000).sum())
    assert split.read_s > 0 and split.apply_s >= 0
    assert split.read_s + split.apply_s <= took


# ----------------------------------------------------------------------- real remote stores


def _remote_round_trip(store: LargeObjectStore) -> None:
    p = Pair(store)
    try:
        p.run("""
            import torch
            torch.manual_seed(1)
            large = torch.randn(1024, 1024)  # 4 MiB
            model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 2))
            opt = torch.optim.Adam(model.parameters())
        """)
        assert torch.equal(p.standby["large"], p.executor["large"])
        p.run("model(torch.ones(2, 16)).sum().backward()\nopt.step()")
        for mine, theirs in zip(p.executor["model"].parameters(),
                                p.standby["model"].parameters(), strict=True):
            assert torch.equal(mine, theirs)
        write_checkpoint(store, p.kernel_id, p.encoder.snapshot_entries(), 2)
        rebuilt = new_namespace()
        assert restore_namespace(store, read_checkpoint(store, p.kernel_id), rebuilt) == []
        assert torch.equal(rebuilt["large"], p.executor["large"])
    finally:
        p.close()


@needs_torch
@pytest.mark.services
def test_round_trip_through_redis(redis_url: str) -> None:
    store = open_store(f"{redis_url}?prefix=nbos-test-{uuid.uuid4().hex[:8]}", HMAC_KEY)
    try:
        _remote_round_trip(store)
    finally:
        store.close()


@needs_torch
@pytest.mark.services
def test_round_trip_through_s3(s3_store_url: str) -> None:
    store = open_store(s3_store_url, HMAC_KEY)
    try:
        _remote_round_trip(store)
    finally:
        store.close()


# ------------------------------------------------------------------------ property: round trip

_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20),
    st.binary(max_size=20),
)
_values = st.recursive(
    _scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=5),
        st.tuples(children, children),
        st.dictionaries(st.text(max_size=8), children, max_size=5),
        st.frozensets(st.integers(), max_size=5),
    ),
    max_leaves=25,
)
_identifiers = st.from_regex(r"[a-z][a-z0-9]{0,6}", fullmatch=True)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(_identifiers, _values, min_size=1, max_size=6))
def test_random_builtin_values_round_trip(file_store: LargeObjectStore,
                                          values: dict[str, Any]) -> None:
    p = Pair(file_store, threshold_bytes=64)  # small threshold: both inline and pointer entries
    try:
        p.executor.update(values)
        p.replicate(CellEffects(frozenset(values), frozenset(), frozenset(), ()))
        for name, value in values.items():
            assert p.standby[name] == value
        assert p.replicate(CellEffects(frozenset(values), frozenset(), frozenset(), ())).entries \
            == []
    finally:
        p.close()


def test_encode_buffer_helpers_accept_memoryview_records(pair: Pair) -> None:
    update = pair.run("x = [1, 2]")
    assert SyncUpdate.from_bytes(memoryview(update.to_bytes())).entries[0].name == "x"
    assert SyncUpdate.from_bytes(bytearray(io.BytesIO(update.to_bytes()).getvalue())).entries


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_record_bytes_are_rejected_cleanly(tail: bytes) -> None:
    for data in (tail, b"NBSYNC\x01" + tail):
        try:
            SyncUpdate.from_bytes(data)
        except ValueError:
            pass


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.sampled_from(["v", "e", "w"]),
                       st.one_of(st.integers(), st.lists(st.dictionaries(
                           st.sampled_from(list("nkdpszmt")),
                           st.one_of(st.none(), st.integers(), st.text(max_size=5),
                                     st.binary(max_size=5), st.dictionaries(st.text(max_size=3),
                                                                            st.integers())),
                       ), max_size=3), st.text(max_size=5))))
def test_structurally_wrong_records_are_rejected_cleanly(plain: dict) -> None:
    try:
        update = SyncUpdate.from_bytes(b"NBSYNC\x01" + pickle.dumps(plain))
    except ValueError:
        return
    for entry in update.entries:  # whatever decodes is well-formed
        entry.validate()


@needs_torch
def test_prefetch_never_waits_for_an_apply_in_progress(pair: Pair) -> None:
    import threading
    import time

    exec("import torch\nbig = torch.randn(256, 256)", pair.executor)
    update = SyncUpdate.from_bytes(
        pair.encoder.encode(pair.executor, analyze_cell("import torch\nbig = 1")).to_bytes())
    held, release = threading.Event(), threading.Event()

    def busy_apply() -> None:  # stands for a long apply holding the replica's sync state
        with pair.standby_state.lock:
            held.set()
            release.wait(10)

    worker = threading.Thread(target=busy_apply)
    worker.start()
    try:
        assert held.wait(5)
        started = time.monotonic()
        pair.applier.prefetch(update)
        assert time.monotonic() - started < 1.0
    finally:
        release.set()
        worker.join()
    pair.applier.apply(pair.standby, update)
    assert torch.equal(pair.standby["big"], pair.executor["big"])


def test_with_a_real_ipython_shell(file_store: LargeObjectStore) -> None:
    """The executor is a real IPython shell: magics, output caching, history variables."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    encoder = StateEncoder(file_store, "ipython-kernel")
    standby: dict[str, Any] = new_namespace()
    cells = [
        "x = 20", "x", "%time y = x + 1", "import numpy as np", "arr = np.arange(3)",
        "def f():\n    return y * 2", "files = !echo hi", "del x", "arr += 1",
    ]
    with StateApplier(file_store) as applier:
        for cell in cells:
            assert shell.run_cell(cell).success, cell
            effects = analyze_cell(shell.transform_cell(cell))
            update = SyncUpdate.from_bytes(encoder.encode(shell.user_ns, effects).to_bytes())
            assert update.warnings == [], update.warnings
            applier.prefetch(update)
            applier.apply(standby, update)
    try:
        assert standby["y"] == 21 and standby["f"]() == 42
        assert standby["np"] is numpy and list(standby["arr"]) == [1, 2, 3]
        assert list(standby["files"]) == ["hi"]
        assert "x" not in standby
        leaked = {"_", "__", "_i1", "_2", "In", "Out", "_oh", "_ih", "_dh", "get_ipython", "exit"}
        assert not leaked & set(standby)
    finally:
        for name in ("y", "np", "arr", "f", "files"):
            shell.user_ns.pop(name, None)


@needs_torch
def test_failed_upload_is_retried_by_the_next_encode(tmp_path: Path) -> None:
    from notebookos.store import StoreError
    from notebookos.store.file_store import FileStore

    class FlakyStore(FileStore):
        """A real file store whose writes fail while `down` is set (a store outage)."""

        down = False

        def put(self, key, value):
            if self.down:
                raise StoreError("file", key, "injected outage")
            return super().put(key, value)

    store = FlakyStore(tmp_path / "flaky", HMAC_KEY)
    p = Pair(store)
    try:
        exec("import torch\nbig = torch.randn(300, 300)", p.executor)
        store.down = True
        with pytest.raises(StoreError):
            p.encoder.encode(p.executor, analyze_cell("big = 1"))
        assert "big" not in p.encoder.snapshot_entries()
        store.down = False
        p.replicate(analyze_cell("big = 1"))  # same tensor, unchanged: must be uploaded now
        assert torch.equal(p.standby["big"], p.executor["big"])
    finally:
        p.close()


@needs_torch
def test_nothing_is_resent_when_nothing_changed(pair: Pair) -> None:
    """Serialisation is stable: re-checking unchanged values of every common sort sends nothing."""
    cell = """
        import functools, torch, numpy as np
        g = 1
        def f(a=1):
            return a + g
        class C:
            def m(self):
                return f()
        class Slotted:
            __slots__ = ("a",)
        obj = C()
        slotted = Slotted()
        slotted.a = 3
        model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
        opt = torch.optim.Adam(model.parameters())
        model(torch.randn(4, 3)).sum().backward()
        opt.step()
        words = {"alpha", "beta", "gamma", "delta"}
        arr = np.ones(10)
        lam = lambda x: x + g
        part = functools.partial(f, 2)
    """
    # Encode only: in this single-process test an apply would let cloudpickle's class tracker
    # update the executor's own class object (replicas are separate processes in a kernel).
    code = textwrap.dedent(cell)
    exec(code, pair.executor)
    first = pair.encoder.encode(pair.executor, analyze_cell(code))
    # 15 names, f as a shared object (part holds the same function: part.func is f), and the
    # random generators' states (torch's drew the model's initial weights)
    assert len(first.entries) == 17 and first.warnings == []
    every_name = frozenset(e.name for e in first.entries if not e.name.startswith("\0"))
    assert len(every_name) == 15
    again = pair.encoder.encode(pair.executor,
                                CellEffects(every_name, frozenset(), frozenset(), ()))
    assert again.entries == []
    pair.applier.apply(pair.standby, first)
    assert pair.standby["obj"].m() == 2 and pair.standby["part"]() == 3
    assert pair.standby["part"].func is pair.standby["f"]


def test_applying_an_update_where_it_was_made_keeps_the_objects(pair: Pair) -> None:
    """The executor applying its own committed update (or a replay) must not swap its objects."""
    exec("shared = [1]\nalias = shared\nconfig = {'lr': 0.1}", pair.executor)
    update = pair.encoder.encode(pair.executor, analyze_cell("shared = alias = config = 1"))
    own = StateApplier(pair.store, state=pair.executor_state)
    try:
        before = dict(pair.executor)
        own.apply(pair.executor, SyncUpdate.from_bytes(update.to_bytes()))
        assert all(pair.executor[k] is before[k] for k in before)
        pair.executor["shared"].append(2)
        assert pair.executor["alias"] == [1, 2]
    finally:
        own.close()
    replay = SyncUpdate.from_bytes(update.to_bytes())
    pair.applier.apply(pair.standby, replay)
    first = pair.standby["config"]
    pair.applier.apply(pair.standby, replay)
    assert pair.standby["config"] is first


def test_large_numpy_arrays_are_shared_objects(pair: Pair) -> None:
    update = pair.run("""
        import numpy as np
        X = np.arange(40000, dtype=np.float64).reshape(200, 200)  # 320 KB: its own store object
        data = {"X": X, "n": 1}
        labels = np.array(["a", None] * 20000, dtype=object)  # object arrays stay pickled
    """)
    assert pair.standby["data"]["X"] is pair.standby["X"]
    assert numpy.array_equal(pair.standby["X"], pair.executor["X"])
    assert list(pair.standby["labels"][:2]) == ["a", None]
    assert len({key for e in update.entries for key in e.tensors.values()}) == 1  # stored once
    held = pair.standby["X"]
    small = pair.run("data['n'] = 2")  # X unchanged: the resent dict is small, X is not re-stored
    assert small.entries[0].size < 1000 and pair.standby["data"]["X"] is held
    pair.run("X *= 2")
    assert pair.standby["X"] is held and pair.standby["data"]["X"] is held  # updated in place
    assert numpy.array_equal(held, pair.executor["X"])


def test_codec_never_imports_torch_or_numpy_itself(tmp_path: Path) -> None:
    import subprocess
    import sys

    code = textwrap.dedent(f"""
        import sys
        from notebookos.store import open_store
        from notebookos.kernel.ast_effects import analyze_cell
        from notebookos.kernel.sync_codec import StateApplier, StateEncoder, SyncUpdate
        store = open_store("file://{tmp_path}/objects", b"k" * 32)
        ns, standby = {{"__name__": "__main__"}}, {{"__name__": "__main__"}}
        exec("x = [1, 2]\\ndef f():\\n    return x", ns)
        update = StateEncoder(store, "k").encode(ns, analyze_cell("x = 1\\ndef f(): pass"))
        StateApplier(store).apply(standby, SyncUpdate.from_bytes(update.to_bytes()))
        assert standby["f"]() == [1, 2]
        assert "torch" not in sys.modules and "numpy" not in sys.modules, "imported"
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr


@needs_torch
def test_checkpoint_restores_the_same_state_whatever_the_entry_order(
        pair: Pair, file_store: LargeObjectStore) -> None:
    pair.run("""
        import torch
        model = torch.nn.Linear(4, 4)
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
    """)
    pair.run("model(torch.ones(2, 4)).sum().backward()")
    pair.run("opt.step()")  # changes model's parameters without naming model
    entries = pair.encoder.snapshot_entries()
    for order in (sorted(entries), sorted(entries, reverse=True)):
        write_checkpoint(file_store, pair.kernel_id, {n: entries[n] for n in order}, 3)
        rebuilt = new_namespace()
        assert restore_namespace(file_store, read_checkpoint(file_store, pair.kernel_id),
                                 rebuilt) == []
        assert torch.equal(rebuilt["model"].weight, pair.executor["model"].weight), order
        assert rebuilt["model"].weight is rebuilt["opt"].param_groups[0]["params"][0]


@needs_torch
def test_prefetch_of_an_update_the_replica_made_fetches_nothing(pair: Pair) -> None:
    exec("import torch\nbig = torch.randn(300, 300)", pair.executor)
    update = pair.encoder.encode(pair.executor, analyze_cell("import torch\nbig = 1"))
    own = StateApplier(pair.store, state=pair.executor_state)
    try:
        assert own._keys_needed(update) == []
        own.prefetch(update)
        own.apply(pair.executor, update)
    finally:
        own.close()
    assert pair.applier._keys_needed(update)  # a standby does need the objects
    pair.applier.prefetch(update)
    pair.applier.discard(update)
    assert pair.applier._fetches == {}


@needs_torch
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "int64", "bool", "complex64"])
def test_large_tensors_of_every_dtype_round_trip(pair: Pair, dtype: str) -> None:
    pair.run(f"""
        import torch
        base = torch.randn(300, 300)
        t = (base > 0 if "{dtype}" == "bool" else base.to(torch.{dtype})).t()  # non-contiguous
        p = torch.nn.Parameter(torch.randn(200, 200))
    """)
    assert pair.standby["t"].dtype == pair.executor["t"].dtype
    assert torch.equal(pair.standby["t"], pair.executor["t"])
    assert isinstance(pair.standby["p"], torch.nn.Parameter) and pair.standby["p"].requires_grad


@needs_torch
def test_malformed_raw_tensor_is_refused() -> None:
    from notebookos.kernel import raw_tensor, sync_codec

    blob = b"".join(sync_codec._serialise_extracted(torch.randn(200, 200)))
    assert blob.startswith(raw_tensor.MAGIC)
    with pytest.raises(ValueError, match="header says"):
        sync_codec._deserialise_tensor(blob[:-4])


@needs_torch
def test_a_standby_loads_a_large_tensor_in_the_memory_it_fetched_it_into(pair: Pair) -> None:
    """No copy after the fetch: the standby's tensor lives in the fetched blob's memory (its
    storage starts with the blob's aligned header), and is an ordinary tensor: writable,
    resizable, and not shared with a second name whose tensor had the same bytes."""
    pair.run("""
        import torch
        a = torch.arange(100000, dtype=torch.float32)
        b = torch.arange(100000, dtype=torch.float32)
    """)
    a, b = pair.standby["a"], pair.standby["b"]
    assert torch.equal(a, pair.executor["a"]) and torch.equal(b, pair.executor["b"])
    assert a.storage_offset() > 0 and a.untyped_storage().nbytes() == a.nbytes + \
        a.storage_offset() * a.element_size()
    assert a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()
    a[0] = -1
    assert b[0] == 0
    a.resize_(200000)  # a replica's tensors behave like the executor's
    assert a.shape == (200000,)


@needs_torch
def test_raw_tensor_blobs_without_alignment_still_load(tmp_path: Path) -> None:
    """Blobs written before the header was padded (elements at any offset) load from bytes and
    from a fetched buffer alike, copied once."""
    from notebookos.kernel import raw_tensor

    tensor = torch.arange(50000, dtype=torch.float64).reshape(100, 500)
    header = pickle.dumps({"v": 1, "dtype": "float64", "shape": [100, 500],
                           "requires_grad": False, "parameter": False}, protocol=5)
    if (len(raw_tensor.MAGIC) + 4 + len(header)) % 8 == 0:
        header += b"\0"  # make sure the elements are misaligned
    blob = raw_tensor.MAGIC + raw_tensor.HEADER_LENGTH.pack(len(header)) + header + \
        tensor.numpy().tobytes()
    store = open_store(f"file://{tmp_path / 'objects'}", HMAC_KEY)
    store.put("k/objects/old", blob)
    fetched = raw_tensor.fetch_into_tensor(torch, store, "k/objects/old")
    for source in (blob, fetched):
        loaded = raw_tensor.load(torch, source)
        assert torch.equal(loaded, tensor) and loaded.storage_offset() == 0
    store.close()


@needs_torch
def test_syncing_a_large_tensor_leaves_the_users_tensor_resizable(pair: Pair) -> None:
    """The executor serialises a large tensor from a view of its memory; taking that view with
    ``.numpy()`` marked the tensor's storage unresizable for good, so ``x.resize_()`` failed
    in the notebook after the cell that made ``x`` (never in a plain kernel)."""
    pair.run("""
        import torch
        x = torch.ones(100000)
    """)
    pair.run("x.resize_(200000)")
    assert pair.executor["x"].shape == (200000,) and pair.standby["x"].shape == (200000,)


@needs_torch
def test_a_standby_loads_large_arrays_in_their_fetched_memory_unshared(pair: Pair) -> None:
    """With torch loaded, a large numpy array's blob is fetched into a tensor's memory too and
    the array is that memory: equal, writable, its order kept, never shared between two names
    whose arrays had the same bytes."""
    pair.run("""
        import numpy
        a = numpy.arange(100000.0)
        b = numpy.arange(100000.0)
        f = numpy.asfortranarray(numpy.arange(60000, dtype=numpy.int32).reshape(200, 300))
    """)
    a, b, f = pair.standby["a"], pair.standby["b"], pair.standby["f"]
    assert numpy.array_equal(a, pair.executor["a"]) and numpy.array_equal(f, pair.executor["f"])
    assert f.flags.f_contiguous and a.flags.writeable and not numpy.shares_memory(a, b)
    a[0] = -1
    assert b[0] == 0


@needs_torch
def test_a_prefetch_waits_for_a_torch_import_under_way(tmp_path: Path) -> None:
    """A standby's apply thread imports torch for an update that holds torch objects while its
    prefetch thread fetches the update's tensors: the prefetch must not use the half-imported
    module sys.modules already holds (torch.empty crashed the process with SIGSEGV)."""
    import subprocess
    import sys

    program = textwrap.dedent(f"""
        import sys, threading
        from notebookos.kernel.sync_codec import StateApplier
        from notebookos.store import open_store
        store = open_store("file://{tmp_path / 'objects'}", {HMAC_KEY!r})
        store.put("k/objects/x", bytes(1000))
        applier = StateApplier(store)
        threading.Thread(target=__import__, args=("torch",)).start()
        while "torch" not in sys.modules:
            pass
        buffer = applier._get("k/objects/x", True)
        print(type(buffer).__name__, buffer.numel())
    """)
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.split() == ["Tensor", "1000"], (
        done.returncode, done.stdout, done.stderr[-2000:])


def test_a_large_objects_digest_is_the_same_on_every_core_as_on_one():
    """Large objects are hashed on every core (``PARALLEL_DIGEST_BYTES``): the digest names the
    object in the store and in older checkpoints, so it must be BLAKE3's one-thread digest."""
    import blake3

    from notebookos.kernel import sync_codec

    data = numpy.random.default_rng(1).integers(0, 255, 3 * sync_codec.PARALLEL_DIGEST_BYTES,
                                                dtype=numpy.uint8)
    parts = [memoryview(data)[:12345], b"header", memoryview(data)[12345:]]
    one = blake3.blake3(max_threads=1)
    for part in parts:
        one.update(part)
    assert sync_codec._digest(*parts) == sync_codec.DIGEST_PREFIX + one.hexdigest()
    assert sync_codec._digest(b"small") == (sync_codec.DIGEST_PREFIX
                                           + blake3.blake3(b"small").hexdigest())
