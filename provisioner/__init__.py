"""The jupyter_client KernelProvisioner, kernelspecs and the Jupyter Server extension."""

from __future__ import annotations


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    """The Jupyter Server extension (enabled through jupyter_server_config.d)."""
    return [{"module": "notebookos.provisioner.extension"}]
