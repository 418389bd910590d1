"""numpy views stay views on the standbys (issue 31; found by the notebook corpus,
PythonDataScienceHandbook 02.02, cells 29-34): ``x2_sub = x2[:2, :2]`` then, after a failover,
``x2_sub[0, 0] = 99`` on the new executor must change ``x2`` there too, as it does in plain
Python. Plain numpy in the same process is the oracle."""

from __future__ import annotations

import textwrap
from typing import Any

import numpy as np
import pytest
from codec_pair import Pair, new_namespace

from notebookos.kernel.ast_effects import analyze_cell
from notebookos.kernel.sync_codec import StateApplier, StateEncoder, SyncState, SyncUpdate


def _run_plain(code: str, namespace: dict[str, Any]) -> None:
    exec(compile(textwrap.dedent(code), "<cell>", "exec"), namespace)


def test_a_view_and_the_array_it_views_share_memory_on_the_standby(pair: Pair) -> None:
    pair.run("import numpy as np\nx2 = np.arange(12).reshape(3, 4)")
    pair.run("x2_sub = x2[:2, :2]")  # the view comes a cell after its array
    standby = pair.standby
    assert np.shares_memory(standby["x2"], standby["x2_sub"])
    _run_plain("x2_sub[0, 0] = 99", standby)  # as a former standby would run the next cell
    assert standby["x2"][0, 0] == 99


def test_views_of_every_shape_match_plain_numpy_and_share_its_memory(pair: Pair) -> None:
    cells = ["import numpy as np\na = np.arange(24, dtype=np.float32)",
             "rev = a[::-1]\ngrid = a.reshape(4, 6)\ncols = grid.T[1:, ::2]\n"
             "row = grid[2]\nbytes_view = a.view(np.uint8)[8:40]",
             "cols[0, 0] = -1.0\nrow[3] = 7.5"]
    plain = new_namespace()
    for cell in cells:
        pair.run(cell)
        _run_plain(cell, plain)
    names = ("a", "rev", "grid", "cols", "row", "bytes_view")
    for name in names:
        np.testing.assert_array_equal(pair.standby[name], plain[name], err_msg=name)
        assert pair.standby[name].dtype == plain[name].dtype
    for name in names[1:]:
        assert np.shares_memory(pair.standby["a"], pair.standby[name]), name
    write = "rev[0] = 1000.0\nbytes_view[0] = 255"
    _run_plain(write, plain)
    _run_plain(write, pair.standby)
    for name in names:
        np.testing.assert_array_equal(pair.standby[name], plain[name], err_msg=name)


def test_a_large_array_and_its_view(pair: Pair) -> None:
    pair.run("import numpy as np\nbig = np.zeros(1 << 19)\nhalf = big[: 1 << 18]")
    assert np.shares_memory(pair.standby["big"], pair.standby["half"])
    pair.run("half += 1")
    assert pair.standby["big"][:3].tolist() == [1.0, 1.0, 1.0]
    assert pair.standby["big"][-1] == 0.0
    _run_plain("half[0] = 5", pair.standby)
    assert pair.standby["big"][0] == 5


def test_views_stay_views_through_a_failover(pair: Pair, file_store: Any) -> None:
    """The standby becomes the executor and replicates to a third replica: still one memory."""
    pair.run("import numpy as np\nx2 = np.random.RandomState(0).randint(10, size=(3, 4))\n"
             "x2_sub = x2[:2, :2]")
    state = pair.standby_state
    encoder = StateEncoder(file_store, pair.kernel_id, 1 << 20, state=state)
    third = new_namespace()
    with StateApplier(file_store, state=SyncState()) as applier:
        cell = "x2_sub[0, 0] = 99"
        _run_plain(cell, pair.standby)
        update = SyncUpdate.from_bytes(encoder.encode(pair.standby, analyze_cell(cell))
                                       .to_bytes())
        applier.prefetch(update)
        applier.apply(third, update)
    assert third["x2"][0, 0] == 99 and third["x2_sub"][0, 0] == 99
    assert np.shares_memory(third["x2"], third["x2_sub"])


def test_a_read_only_view_stays_read_only(pair: Pair) -> None:
    pair.run("import numpy as np\nbase = np.arange(4.0)\nwide = np.broadcast_to(base, (3, 4))")
    wide = pair.standby["wide"]
    np.testing.assert_array_equal(wide, np.broadcast_to(np.arange(4.0), (3, 4)))
    assert not wide.flags.writeable
    _run_plain("base[1] = 9.0", pair.standby)
    assert pair.standby["wide"][2, 1] == 9.0


@pytest.mark.parametrize("code", [
    "f = np.asfortranarray(np.arange(12).reshape(3, 4))\ncol = f[:, 1]",  # not C-contiguous
    "alone = np.arange(10).reshape(2, 5)",  # a view no other name shares: copied as before
])
def test_arrays_that_are_not_kept_as_views_still_replicate_their_values(pair: Pair,
                                                                       code: str) -> None:
    plain = new_namespace()
    for cell in ("import numpy as np", code):
        pair.run(cell)
        _run_plain(cell, plain)
    for name, value in plain.items():
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(pair.standby[name], value, err_msg=name)


def test_a_view_deleted_leaves_its_array_replicated(pair: Pair) -> None:
    pair.run("import numpy as np\nx = np.arange(6)\nv = x[1:4]")
    pair.run("del v")
    pair.run("x[0] = 40")
    assert "v" not in pair.standby and pair.standby["x"][0] == 40
