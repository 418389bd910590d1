"""A kernel websocket connection with Nagle's algorithm off.

Stock Jupyter Server leaves Nagle's algorithm on for kernel websockets. A cell's first message
(``status: busy``) goes out at once, and every small frame after it then waits for the client's
delayed ACK (40 ms on Linux), so a trivial cell costs ~48 ms over the websocket against ~6 ms over
ZMQ. Setting TCP_NODELAY on the server side of the websocket removes that wait for every kernel the
server hosts. It is installed through the supported extension point,
``ServerApp.kernel_websocket_connection_class`` (see jupyter-config/), with no patching.
"""

from __future__ import annotations

import asyncio

from jupyter_server.services.kernels.connection.channels import ZMQChannelsWebsocketConnection


class NoDelayWebsocketConnection(ZMQChannelsWebsocketConnection):
    """``ZMQChannelsWebsocketConnection`` that sets TCP_NODELAY on its websocket."""

    def connect(self) -> asyncio.Future[None] | None:
        handler = self.websocket_handler
        if handler is not None and getattr(handler, "ws_connection", None) is not None:
            handler.set_nodelay(True)
        return super().connect()
