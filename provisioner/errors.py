"""What a refused kernel start tells the user: the Global Scheduler's reason and what to do.

Jupyter Server turns a ``tornado.web.HTTPError`` raised while starting a kernel into an HTTP error
whose JSON body carries ``message`` and ``reason`` (``APIHandler.write_error``); any other
exception becomes ``{"message": "Unhandled error", "reason": null}``, which is all JupyterLab's
"Error Starting Kernel" dialog would show. ``KernelStartRefused`` is that HTTPError and also a
RuntimeError (what the provisioner raised before, and what jupyter_client callers catch).
"""

from __future__ import annotations

import grpc
from tornado import web

# gRPC status -> (HTTP status, short reason, what the user can do).
_ADVICE: dict[grpc.StatusCode, tuple[int, str, str]] = {
    grpc.StatusCode.RESOURCE_EXHAUSTED: (
        503, "NotebookOS cluster has no room for this kernel",
        "Shut down notebooks you no longer use, pick a kernel that asks for fewer GPUs, or try "
        "again later; the cluster's operator can add hosts or raise its limits "
        "(cluster.max_subscription_ratio; the Global Scheduler's open-file limit or "
        "global_scheduler.max_kernels when the scheduler itself is full)."),
    grpc.StatusCode.UNAVAILABLE: (
        503, "NotebookOS Global Scheduler unavailable",
        "Check that the cluster is running (`notebookos status`) and try again."),
    grpc.StatusCode.DEADLINE_EXCEEDED: (
        504, "NotebookOS kernel start timed out",
        "The cluster may be busy starting other kernels: try again; `notebookos status` shows "
        "its hosts."),
    grpc.StatusCode.INVALID_ARGUMENT: (
        400, "NotebookOS refused the kernel's request",
        "Check the kernelspec's resource request."),
    grpc.StatusCode.ALREADY_EXISTS: (
        409, "NotebookOS kernel already exists", "Start a new kernel."),
}
_DEFAULT = (500, "NotebookOS could not start the kernel",
            "The Global Scheduler's log (`notebookos logs`) says more.")


class KernelStartRefused(web.HTTPError, RuntimeError):
    """A kernel start the Global Scheduler refused (or could not be asked about)."""

    def __init__(self, status_code: int, message: str, reason: str, code: str) -> None:
        super().__init__(status_code, message, reason=reason)
        self.message = message
        self.grpc_code = code

    def __str__(self) -> str:
        return self.message


def start_refused(kernel_id: str, address: str, code: grpc.StatusCode,
                  details: str) -> KernelStartRefused:
    """The exception ``launch_kernel`` raises for a failed ``StartKernel``."""
    status, reason, advice = _ADVICE.get(code, _DEFAULT)
    details = " ".join((details or "no reason given").split()).rstrip(".")
    message = (f"NotebookOS could not start kernel {kernel_id} (Global Scheduler at {address}): "
               f"{code.name}: {details}. What you can do: {advice}")
    # tornado logs an HTTPError's message as a %-format (and /api/sessions re-raises str(e)).
    message = message.replace("%", " percent")
    return KernelStartRefused(status, message, reason, code.name)
