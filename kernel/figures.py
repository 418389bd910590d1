"""pyplot on a standby after it applies another replica's state (issue 31, item 5).

A pyplot figure pickled while pyplot still held it (open on the executor after its cell: the
inline backend's ``close_figures`` off, or a backend that keeps figures) registers itself with
pyplot again when it is unpickled (matplotlib's ``Figure.__setstate__``, ``restore_to_pylab``),
and while pyplot is interactive (``%matplotlib inline``) the inline backend queues it for drawing
(``show._draw_called``, ``show._to_draw``). On the executor that draw was done at the end of the
cell that made the figure (``flush_figures``, an IPython ``post_execute`` hook). A standby
applies the update outside any cell, so nothing consumed it: the first cell the standby ran as
executor after a failover displayed the earlier cell's figure again, under its own output.

``PyplotSettle`` puts the inline backend's queue back to what it was before the apply: the
figure stays registered with pyplot (as on the executor, which held it), and is drawn again only
when a cell draws it. A figure the executor had closed was pickled without pyplot, and
unpickles without it, here too.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

log = logging.getLogger(__name__)

INLINE = "matplotlib_inline.backend_inline"


def _inline_show() -> Any:
    module = sys.modules.get(INLINE)
    return getattr(module, "show", None) if module is not None else None


class PyplotSettle:
    """Taken before a standby applies state (on the kernel's thread); ``settle()`` after."""

    def __init__(self) -> None:
        show = _inline_show()
        self.draw_called = bool(getattr(show, "_draw_called", False))
        self.to_draw = list(getattr(show, "_to_draw", None) or [])

    def settle(self) -> bool:
        """Forget the draws the apply queued; returns whether it had queued any."""
        show = _inline_show()  # the apply may have imported the backend
        if show is None:
            return False
        try:
            queued = [f for f in (getattr(show, "_to_draw", None) or [])
                      if not any(f is g for g in self.to_draw)]
            changed = bool(queued) or getattr(show, "_draw_called", False) != self.draw_called
            show._draw_called = self.draw_called
            show._to_draw = list(self.to_draw)
        except Exception:  # noqa: BLE001 - never let pyplot stop a standby applying state
            log.warning("could not reset the inline backend's draws after applying state",
                        exc_info=True)
            return False
        if changed:
            log.debug("forgot %d figure draw(s) queued by applying state", len(queued))
        return changed
