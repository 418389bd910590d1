"""Keep ``socket.inet_ntop`` working in a process that imports pysyncobj.

``pysyncobj.win_inet_pton`` (imported by its TCP transport) replaces ``socket.inet_ntop`` on every
platform with a Windows-only version, so after it any call fails with ``TypeError: not_windows()
takes 0 positional arguments``: in a replica that is the notebook's own process, so user code
(``socket.inet_ntop``, ``psutil.net_connections``) broke. Off Windows a stand-in module takes its
place before pysyncobj is imported; pysyncobj only imports it for that side effect.
"""

from __future__ import annotations

import os
import sys
import types


def keep_socket_inet_ntop() -> None:
    """Stand in for ``pysyncobj.win_inet_pton`` off Windows (nothing happens on Windows, or if
    pysyncobj's own module was imported already)."""
    if os.name == "nt" or "pysyncobj.win_inet_pton" in sys.modules:
        return
    sys.modules["pysyncobj.win_inet_pton"] = types.ModuleType(
        "pysyncobj.win_inet_pton", "NotebookOS: the platform's inet_pton and inet_ntop are kept")
