"""The NotebookOS Jupyter Server extension.

Enabled for every server in the environment by ``jupyter_server_config.d/notebookos.json``. At
link time (before the server builds its web application) it makes kernel websockets use
``NoDelayWebsocketConnection`` (TCP_NODELAY; see ``websocket.py``), through the supported
``ServerApp.kernel_websocket_connection_class`` trait, unless the user configured a class of
their own or the server talks to a kernel gateway. At load time it adds the REST endpoints of
``handlers.py`` (``/api/notebookos/cluster``, ``/api/notebookos/kernels/<id>``,
``/api/notebookos/supervisor``).
"""

from __future__ import annotations

from typing import Any

from notebookos.provisioner.websocket import NoDelayWebsocketConnection


def _link_jupyter_server_extension(serverapp: Any) -> None:
    configured = "kernel_websocket_connection_class" in serverapp.config.get("ServerApp", {})
    gateway = getattr(getattr(serverapp, "gateway_config", None), "gateway_enabled", False)
    if configured or gateway:
        serverapp.log.info("NotebookOS: keeping the configured kernel websocket connection class")
        return
    serverapp.kernel_websocket_connection_class = NoDelayWebsocketConnection


def _load_jupyter_server_extension(serverapp: Any) -> None:
    from notebookos.provisioner.handlers import handlers

    web_app = serverapp.web_app
    web_app.add_handlers(".*$", handlers(web_app.settings["base_url"]))
    serverapp.log.info(
        "NotebookOS: kernel websockets use %s",
        serverapp.kernel_websocket_connection_class.__name__,
    )
