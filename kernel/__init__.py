"""The distributed kernel replica: an ipykernel subclass with Raft, executor election, state sync.

For notebook code: ``notebookos.kernel.assigned_gpus()`` gives the GPU device ids bound for the
running cell and ``notebookos.kernel.assigned_device()`` the torch device the notebook's state was
moved to (see docs/state-sync.md). They are loaded on first use, so importing this package stays
cheap.
"""

from __future__ import annotations

from typing import Any

from .inet_ntop_guard import keep_socket_inet_ntop
from .raft_crypto import keep_pysyncobj_off_cryptography

# before anything here imports pysyncobj: its encryptor module would load `cryptography` (9 MB
# of each replica's memory) for a password-derived Fernet that NotebookOS does not use
keep_pysyncobj_off_cryptography()
# ... and its Windows inet_ntop would replace the socket module's in the notebook's process
keep_socket_inet_ntop()

_USER_API = ("assigned_gpus", "assigned_device")


def __getattr__(name: str) -> Any:
    if name in _USER_API:
        from notebookos.kernel import gpu_binding

        return getattr(gpu_binding, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
