"""The kernel websocket connection Jupyter Server uses for NotebookOS kernels.

Two things differ from stock ``ZMQChannelsWebsocketConnection``, both installed through the
supported extension point, ``ServerApp.kernel_websocket_connection_class`` (see
jupyter-config/), with no patching:

- Nagle's algorithm is off. Stock Jupyter Server leaves it on for kernel websockets. A cell's
  first message (``status: busy``) goes out at once, and every small frame after it then waits
  for the client's delayed ACK (40 ms on Linux), so a trivial cell costs ~48 ms over the
  websocket against ~6 ms over ZMQ.
- An execute_request that the kernel's Global Scheduler may have lost (it died before routing
  it) is sent again once the shell connection comes back, and a second reply to one request is
  dropped (provisioner/resend.py says why and how).
- An execute_request sent while that connection is down (the Global Scheduler died and
  ``notebookos up`` is restarting it) waits for it, and its output gets a note on stderr that
  says so, with when the scheduler is tried again where ``notebookos up``'s state file says.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from jupyter_server.services.kernels.connection.base import (
    deserialize_binary_message,
    deserialize_msg_from_ws_v1,
)
from jupyter_server.services.kernels.connection.channels import ZMQChannelsWebsocketConnection

from .resend import ShellResender


def scheduler_restart_words() -> str:
    """`` (notebookos up is restarting it, retry in 8 s, attempt 4)`` from the supervisor's
    state file, or ``""`` where it says nothing about the Global Scheduler."""
    from notebookos.commands.status_cmd import supervisor_document
    from notebookos.config import load_config

    config = load_config()
    gs = config.global_scheduler
    doc = supervisor_document(config.state_path, f"{gs.host}:{gs.grpc_port}")
    entry = next((d for d in (doc or {}).get("daemons", [])
                  if d.get("name") == "global-scheduler"), None)
    if entry is None:
        return ""
    if entry.get("retry_in_s") is not None:
        return (f" (notebookos up is restarting it, retry in {entry['retry_in_s']:.0f} s, "
                f"attempt {entry.get('attempt', 0)})")
    if entry.get("state") == "starting":
        return " (notebookos up is starting it again)"
    return ""

WS_V1 = "v1.kernel.websocket.jupyter.org"


class NoDelayWebsocketConnection(ZMQChannelsWebsocketConnection):
    """``ZMQChannelsWebsocketConnection`` with TCP_NODELAY and execute requests resent."""

    def connect(self) -> asyncio.Future[None] | None:
        handler = self.websocket_handler
        if handler is not None and getattr(handler, "ws_connection", None) is not None:
            handler.set_nodelay(True)
        connected = super().connect()
        shell = self.channels.get("shell")
        if connected is not None and shell is not None and not shell.closed():
            ShellResender.of(shell, self.session, self.log)
        return connected

    def _resender(self) -> ShellResender | None:
        shell = self.channels.get("shell") if self.channels else None
        return getattr(shell, ShellResender.ATTRIBUTE, None)

    def handle_incoming_message(self, incoming_msg: str) -> None:
        super().handle_incoming_message(incoming_msg)
        resender = self._resender()
        if resender is None:
            return
        try:
            if self.subprotocol == WS_V1:
                channel, msg_list = deserialize_msg_from_ws_v1(incoming_msg)
                if channel != "shell":
                    return
                header = self.session.unpack(msg_list[0])
                request: Any = msg_list
            else:
                msg = (deserialize_binary_message(incoming_msg)
                       if isinstance(incoming_msg, bytes) else json.loads(incoming_msg))
                if msg.pop("channel", "shell") != "shell":
                    return
                header, request = msg["header"], msg
        except (ValueError, KeyError, TypeError, IndexError):
            return  # super() already said what was wrong with it
        if header.get("msg_type") == "execute_request":
            resender.executes.sent(str(header.get("msg_id", "")), request)
            if resender.dropped:
                self._note_waiting(resender, header)

    def _note_waiting(self, resender: ShellResender, header: dict) -> None:
        """Tell the cell of ``header`` (on its stderr) that it waits for the Global Scheduler."""
        msg_id = str(header.get("msg_id", ""))
        kernel_name = str(getattr(self.kernel_manager, "kernel_name", "") or "")
        if not kernel_name.startswith("notebookos") or msg_id in resender.noted:
            return
        resender.noted.add(msg_id)
        when = ""
        try:
            when = scheduler_restart_words()
        except Exception as exc:  # noqa: BLE001 - the note goes out without the schedule
            self.log.debug("NotebookOS: no supervisor state for the note: %s", exc)
        note = (f"NotebookOS: the scheduler is not reachable{when}; this cell waits and runs "
                "once it is back\n")
        msg = self.session.msg("stream", {"name": "stderr", "text": note}, parent=header)
        try:
            super().handle_outgoing_message("iopub", self.session.serialize(msg))
        except (KeyError, ValueError, TypeError) as exc:  # no iopub stream (yet)
            self.log.debug("NotebookOS: could not note the waiting cell: %s", exc)

    def handle_outgoing_message(self, stream: Any, outgoing_msg: list[Any]) -> None:
        channel = stream if isinstance(stream, str) else getattr(stream, "channel", None)
        resender = self._resender()
        if channel == "shell" and resender is not None:
            try:
                _, parts = self.session.feed_identities(outgoing_msg)
                header = self.session.unpack(bytes(parts[1]))
                parent = self.session.unpack(bytes(parts[2])) if header.get("msg_type") == \
                    "execute_reply" else None
            except (ValueError, KeyError, TypeError, IndexError):
                parent = None
            if parent is not None and not resender.executes.reply(str(parent.get("msg_id"))):
                self.log.info("dropped a second execute_reply to %s (its request was resent)",
                              parent.get("msg_id"))
                return
        super().handle_outgoing_message(stream, outgoing_msg)

    def on_kernel_restarted(self) -> None:
        resender = self._resender()
        if resender is not None:
            resender.executes.clear()
        super().on_kernel_restarted()
