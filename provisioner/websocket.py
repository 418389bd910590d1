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
