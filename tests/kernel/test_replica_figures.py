"""A pyplot figure made on one replica is not displayed again by the next executor (issue 31,
item 5): a standby that applies the figure gets it registered with pyplot and a pending inline
draw (kernel/figures.py), which its first cell as executor used to flush into that cell's
output. Three real replica processes; the next cell is sent to another replica."""

from __future__ import annotations

import pytest
from harness import ReplicaGroup

pytest.importorskip("matplotlib_inline")

pytestmark = pytest.mark.timeout(120)

# The executor keeps the figure registered with pyplot after the cell (the inline backend's
# ``close_figures`` off: figures stay open across cells), so it is pickled as a pyplot figure.
FIGURE = ("%matplotlib inline\n%config InlineBackend.close_figures = False\n"
          "import matplotlib.pyplot as plt\n"
          "fig = plt.figure(figsize=(2, 2))\n_ = plt.plot([1, 2])")




def _displays(result) -> list[dict]:  # noqa: ANN001
    return [m for m in result.iopub if m["msg_type"] == "display_data"]


def test_the_next_executor_does_not_display_an_earlier_cells_figure_again(group: ReplicaGroup):
    made = group.execute(FIGURE, target=1, timeout=60)
    assert made.executor() == 1, made.summary()
    assert len(_displays(made)) == 1, [m["msg_type"] for m in made.iopub]
    moved = group.execute("print(type(fig).__name__)", target=2, timeout=60)
    assert moved.executor() == 2, moved.summary()
    assert _displays(moved) == [], "the figure of the earlier cell was displayed again"
    assert moved.stdout() == "Figure\n", moved.stdout()
    shown = group.execute("from IPython.display import display\ndisplay(fig)", target=2,
                          timeout=60)
    assert len(_displays(shown)) == 1
