"""matplotlib figures through the state-sync codec (issue 31, items 3 and 7).

A figure is one tangle of objects (every artist knows its figure, transforms keep weak references
to their parents and restore them in ``__getstate__``/``__setstate__``); a standby once failed to
apply it (``'Affine2D' object has no attribute '_invalid'``) and the encoder's time grew with the
square of the number of axes (16 axes: 41 s; 64 subplots never finished). A figure is now synced
as one unit (docs/state-sync.md, section 2a, "Units").
"""

from __future__ import annotations

import io
import textwrap
import time
from collections.abc import Iterator

import pytest
from codec_pair import Pair

from notebookos.testing.optional import require_module

require_module("matplotlib", "`make install-test` installs it")

SETUP = "import matplotlib; matplotlib.use('agg'); import matplotlib.pyplot as plt; import numpy as np"


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


@pytest.fixture
def mpl_pair(pair: Pair) -> Iterator[Pair]:
    pair.run(SETUP)
    yield pair
    import matplotlib.pyplot as plt

    plt.close("all")


def test_subplots_figure_and_axes_keep_identity_on_the_standby(mpl_pair: Pair) -> None:
    update = mpl_pair.run("fig, ax = plt.subplots(2, 2)")
    assert len(update.entries) <= 4, [e.name for e in update.entries]  # fig, ax, the figure
    s = mpl_pair.standby
    fig, ax = s["fig"], s["ax"]
    assert fig is not mpl_pair.executor["fig"]
    assert ax.shape == (2, 2)
    for a in ax.flat:
        assert a.figure is fig
        assert a in fig.axes
    assert [fig.axes.index(a) for a in ax.flat] == [0, 1, 2, 3]
    assert _png(fig).startswith(b"\x89PNG")
    # The standby becomes the executor: a cell there changes the figure that `fig` names.
    exec("ax[0, 0].plot([1, 2, 3])", s)
    assert len(fig.axes[0].lines) == 1


def test_a_later_cell_updates_the_standby_figure_in_place(mpl_pair: Pair) -> None:
    mpl_pair.run("fig, ax = plt.subplots()")
    s = mpl_pair.standby
    fig, ax = s["fig"], s["ax"]
    mpl_pair.run("line, = ax.plot([1, 2, 3])")
    assert s["fig"] is fig  # the figure object is kept (refilled in place)
    assert s["ax"].figure is fig and s["ax"] in fig.axes
    assert s["line"] in s["ax"].lines and s["line"].figure is fig
    mpl_pair.run("ax.set_title('t')")
    assert s["ax"].get_title() == "t" and s["ax"] is fig.axes[0]
    assert s["line"] in s["ax"].lines
    exec("ax.plot([3, 2, 1])", s)
    assert len(fig.axes[0].lines) == 2
    assert _png(fig).startswith(b"\x89PNG")
    del ax


def test_an_axes_alone_brings_its_figure(mpl_pair: Pair) -> None:
    mpl_pair.run("ax = plt.figure().add_subplot()")
    mpl_pair.run("fig = ax.figure; lines = [ax.plot([0, 1])[0]]; ax.plot([1, 0])")
    s = mpl_pair.standby
    assert s["fig"] is s["ax"].figure and s["ax"] in s["fig"].axes
    assert len(s["ax"].lines) == 2 and s["lines"][0] is s["ax"].lines[0]


def test_imshow_and_text_in_many_subplots(mpl_pair: Pair) -> None:
    mpl_pair.run("""
        imgs = np.random.rand(16, 8, 8); fig = plt.figure(figsize=(6, 6))
        for i in range(16):
            ax = fig.add_subplot(4, 4, i + 1); ax.imshow(imgs[i]); ax.text(0, 7, str(i))
    """)
    s = mpl_pair.standby
    fig = s["fig"]
    assert len(fig.axes) == 16 and s["ax"] is fig.axes[-1]
    assert [a.texts[0].get_text() for a in fig.axes] == [str(i) for i in range(16)]
    assert _png(fig).startswith(b"\x89PNG")


def test_pyplot_does_not_collect_figures_on_the_standby(pair: Pair) -> None:
    """Both namespaces live in this process, so count what the standby's applies add to pyplot."""
    import matplotlib

    matplotlib.use("agg")
    import matplotlib.pyplot as plt

    plt.close("all")
    try:
        pair.run("import matplotlib.pyplot as plt")
        pair.run("fig, ax = plt.subplots()")
        assert len(plt.get_fignums()) == 2  # the executor's figure, and the standby's copy
        for i in range(5):
            pair.run(f"ax.plot([{i}, 1])")
        assert len(plt.get_fignums()) == 2
        # The executor closes its figure: the standby's copy leaves pyplot too.
        pair.run("plt.close(fig); ax.set_title('closed')")
        assert plt.get_fignums() == []
        pair.run("fig, ax = plt.subplots()")
        pair.run("fig = ax = None")
        assert len(plt.get_fignums()) == 1  # only the executor's: the standby dropped its copy
    finally:
        plt.close("all")


@pytest.mark.timeout(120)
def test_sync_time_of_many_axes_grows_about_linearly(pair: Pair) -> None:
    """64 subplots with an image and a text each: one figure pickle, not one per layer of
    shared objects (it never finished before; 16 axes took 41 s). Generous for a loaded VM."""
    pair.run(SETUP)
    try:
        start = time.perf_counter()
        pair.run("""
            imgs = np.random.rand(64, 8, 8); fig = plt.figure(figsize=(6, 6))
            for i in range(64):
                ax = fig.add_subplot(8, 8, i + 1); ax.imshow(imgs[i]); ax.text(0, 7, str(i))
        """)
        elapsed = time.perf_counter() - start
        assert len(pair.standby["fig"].axes) == 64
        assert elapsed < 20, f"64 subplots took {elapsed:.1f} s to run and sync"
        start = time.perf_counter()
        pair.run("fig2, axs = plt.subplots(4, 4)")
        assert time.perf_counter() - start < 8
    finally:
        import matplotlib.pyplot as plt

        plt.close("all")


def test_the_standby_becomes_executor_and_a_checkpoint_restores_the_figure(
    mpl_pair: Pair, file_store
) -> None:
    from notebookos.kernel.ast_effects import analyze_cell
    from notebookos.kernel.sync_codec import (
        StateApplier,
        StateEncoder,
        SyncUpdate,
        read_checkpoint,
        restore_namespace,
        write_checkpoint,
    )

    mpl_pair.run("fig, ax = plt.subplots(1, 2)\nline, = ax[0].plot([1, 2])")
    old_executor = mpl_pair.executor
    # Failover: the standby encodes with the state its applies built; the old executor applies.
    encoder = StateEncoder(mpl_pair.store, mpl_pair.kernel_id, state=mpl_pair.standby_state)
    with StateApplier(mpl_pair.store, state=mpl_pair.executor_state) as applier:
        cell = "ax[1].plot([3, 4]); line.set_color('red'); title = fig.suptitle('s')"
        exec(cell, mpl_pair.standby)
        update = SyncUpdate.from_bytes(
            encoder.encode(mpl_pair.standby, analyze_cell(cell)).to_bytes())
        applier.apply(old_executor, update)
    fig = old_executor["fig"]
    assert len(fig.axes[1].lines) == 1 and old_executor["ax"][1] is fig.axes[1]
    assert old_executor["line"] is fig.axes[0].lines[0]
    assert old_executor["line"].get_color() == "red"
    assert old_executor["title"] is fig._suptitle
    # A checkpoint of the new executor restores the same figure into a fresh replica.
    write_checkpoint(file_store, mpl_pair.kernel_id, encoder.snapshot_entries(), 2)
    fresh = {"__name__": "__main__", "__builtins__": __builtins__}
    assert restore_namespace(file_store, read_checkpoint(file_store, mpl_pair.kernel_id),
                             fresh) == []
    fig = fresh["fig"]
    assert [a.figure for a in fresh["ax"]] == [fig, fig] and list(fresh["ax"]) == fig.axes
    assert fresh["line"] is fig.axes[0].lines[0] and fresh["title"] is fig._suptitle
    assert _png(fig).startswith(b"\x89PNG")


def test_a_setstate_that_calls_into_another_shared_object_finds_it_filled(pair: Pair) -> None:
    """The general cause of the ``'Affine2D' ... '_invalid'`` failure: a standby fills shared
    objects as an unpickler would, each after the objects its contents refer to."""
    pair.run("""
        class Scale:
            def __init__(self):
                self.k = 2.0

        class Box:
            def __init__(self, scale):
                self.scale = scale
                self.size = 1.0

            def __setstate__(self, state):
                self.__dict__.update(state)
                self.size = self.scale.k  # calls into another object while being restored

        box = Box(Scale())
        scale = box.scale
        boxes = [box]
    """)
    s = pair.standby
    assert s["boxes"][0] is s["box"] and s["box"].scale is s["scale"]
    assert s["box"].size == 2.0
    pair.run("scale.k = 3.0; box.size = 0")
    assert s["box"].scale is s["scale"] and s["box"].size == 3.0


def test_a_cell_that_does_not_change_the_figure_resends_nothing_of_it(mpl_pair: Pair) -> None:
    """Pickling a figure advances its callback registries' id counters; the codec undoes that,
    or every cell touching a figure resent all of it (and every array beside it)."""
    mpl_pair.run("imgs = np.zeros((4, 4)); fig, ax = plt.subplots(); im = ax.imshow(imgs)")
    update = mpl_pair.run("t = ax.get_title(); n = len(fig.axes)")
    assert sorted(e.name for e in update.entries) == ["n", "t"]
    mpl_pair.run("u = ax.get_xlim()")  # autoscales, the first time: a change
    update = mpl_pair.run("u = ax.get_xlim(); v = ax.get_ylim()")
    assert sorted(e.name for e in update.entries) == ["v"]
    update = mpl_pair.run("ax.set_title('changed')")
    assert mpl_pair.standby["ax"].get_title() == "changed"


@pytest.mark.timeout(300)
def test_64_subplots_on_real_replicas(tmp_path) -> None:
    """The user-facing bug: the cell never answered on NotebookOS (0.5 s in plain IPython)."""
    from harness import ReplicaGroup

    group = ReplicaGroup(tmp_path, store_url=f"file://{tmp_path}/store")
    try:
        group.start()
        cell = SETUP + textwrap.dedent("""
            imgs = np.random.rand(64, 8, 8); fig = plt.figure(figsize=(6, 6))
            for i in range(64):
                ax = fig.add_subplot(8, 8, i + 1); ax.imshow(imgs[i]); ax.text(0, 7, str(i))
        """)
        first = group.execute(cell, target=1)
        assert first.reply(1)["content"]["status"] == "ok", first.reply(1)["content"]
        check = ("import io; fig.savefig(io.BytesIO(), format='png'); "
                 "print(len(fig.axes), ax is fig.axes[-1], ax.figure is fig)")
        result = group.execute(check, target=2)
        assert result.reply(2)["content"]["status"] == "ok", result.reply(2)["content"]
        assert result.stdout() == "64 True True\n"
        result = group.execute("ax.plot([1, 2]); print(len(fig.axes[-1].lines))", target=2)
        assert result.stdout() == "1\n", result.summary()
        result = group.execute("print(len(fig.axes[-1].lines))", target=3)
        assert result.stdout() == "1\n", result.summary()
    finally:
        group.stop()
