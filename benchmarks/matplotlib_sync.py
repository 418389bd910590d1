"""State sync of matplotlib figures, in process (issue 31, items 3 and 7):

    python benchmarks/matplotlib_sync.py [subplots|imshow] [--axes 4,8,16,64] [--repeat 3]

For each number of axes, a fresh executor/standby pair (``StateEncoder`` and ``StateApplier`` on
a file store, as a replica uses them) runs the cell on the executor, then times
``StateEncoder.encode`` and the standby's decode + ``apply`` of its update; best of ``--repeat``.

- ``subplots``: ``fig, ax = plt.subplots(rows, cols)``;
- ``imshow``: ``add_subplot`` + ``imshow`` of an 8x8 image + ``text``, once per axes.

docs/state-sync.md (section 5, "matplotlib figures") has the figures before and after.
"""

from __future__ import annotations

import argparse
import tempfile
import textwrap
import time
import uuid

from notebookos.kernel.ast_effects import analyze_cell
from notebookos.kernel.sync_codec import StateApplier, StateEncoder, SyncState, SyncUpdate
from notebookos.store import open_store
from notebookos.testing import smoke

CELLS = {
    "subplots": "fig, ax = plt.subplots({rows}, {cols})",
    "imshow": """
        imgs = np.random.rand({n}, 8, 8); fig = plt.figure(figsize=(6, 6))
        for i in range({n}):
            ax = fig.add_subplot({rows}, {cols}, i + 1); ax.imshow(imgs[i]); ax.text(0, 7, str(i))
    """,
}
SETUP = "import matplotlib; matplotlib.use('agg'); import matplotlib.pyplot as plt; import numpy as np"


def _shape(n: int) -> tuple[int, int]:
    rows = int(n ** 0.5)
    while n % rows:
        rows -= 1
    return rows, n // rows


def once(kind: str, n: int) -> tuple[float, float]:
    """(encode seconds, decode + apply seconds) of one cell drawing ``n`` axes."""
    import matplotlib.pyplot as plt

    with tempfile.TemporaryDirectory() as root:
        store = open_store(f"file://{root}/objects", b"benchmark-key-0123456789abcdef!!")
        kernel_id = f"k-{uuid.uuid4().hex[:8]}"
        encoder = StateEncoder(store, kernel_id, state=SyncState())
        applier = StateApplier(store, state=SyncState())
        executor: dict = {"__name__": "__main__", "__builtins__": __builtins__}
        standby: dict = {"__name__": "__main__", "__builtins__": __builtins__}
        try:
            rows, cols = _shape(n)
            for code in (SETUP, textwrap.dedent(CELLS[kind].format(n=n, rows=rows, cols=cols))):
                exec(compile(code, "<cell>", "exec"), executor)  # noqa: S102 - the benchmark's cell
                start = time.perf_counter()
                update = encoder.encode(executor, analyze_cell(code))
                encoded = time.perf_counter()
                decoded = SyncUpdate.from_bytes(update.to_bytes())
                applier.prefetch(decoded)
                applier.apply(standby, decoded)
                applied = time.perf_counter()
            assert len(standby["fig"].axes) == n
            return encoded - start, applied - encoded
        finally:
            applier.close()
            store.close()
            plt.close("all")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=sorted(CELLS), nargs="?", default="imshow")
    parser.add_argument("--axes", default="4,8,16,64")
    parser.add_argument("--repeat", type=int, default=3)
    args = smoke.parse_args(parser, axes="4", repeat=1)
    for n in map(int, args.axes.split(",")):
        runs = [once(args.kind, n) for _ in range(args.repeat)]
        encode = min(run[0] for run in runs)
        apply = min(run[1] for run in runs)
        print(f"{args.kind:8s} {n:3d} axes: encode {encode:.3f} s  apply {apply:.3f} s  "
              f"total {encode + apply:.3f} s", flush=True)


if __name__ == "__main__":
    main()
