"""``python -m notebookos.kernel``: the IPKernelApp that starts one replica.

    python -m notebookos.kernel -f CONNECTION_FILE --replica-id 1 \
        --raft-address 127.0.0.1:7001 --peers 2=127.0.0.1:7002,3=127.0.0.1:7003 \
        --kernel-id K --store-url s3://bucket/prefix?endpoint_url=... \
        [--election-timeout 0.2] [--join] [--restore-from-checkpoint]

Every option can also come from the environment (NOTEBOOKOS_REPLICA_ID, NOTEBOOKOS_RAFT_ADDRESS,
NOTEBOOKOS_PEERS, NOTEBOOKOS_KERNEL_ID, NOTEBOOKOS_STORE_URL, NOTEBOOKOS_ELECTION_TIMEOUT,
NOTEBOOKOS_JOIN=1, NOTEBOOKOS_RESTORE_FROM_CHECKPOINT=1,
NOTEBOOKOS_CELL_CONTAINER=1); a flag on the command line wins.
The HMAC key in the connection file is the kernel's key: it signs Jupyter messages, derives the Raft
password and authenticates values in the store. See docs/kernel-protocol.md.
"""

from __future__ import annotations

import logging
import os
import sys

import zmq
from ipykernel.kernelapp import IPKernelApp, kernel_aliases, kernel_flags
from traitlets import Bool, Dict, DottedObjectName, Int, Type

from notebookos.backlog import DEFAULT_MAX_BYTES, DEFAULT_MAX_MESSAGES

from .iopub import BufferedIOPubThread, set_dead_peer_timeouts
from .replica import ReplicaKernel
from .stdin_socket import make_patient

ENV_OPTIONS = {
    "NOTEBOOKOS_REPLICA_ID": "replica-id",
    "NOTEBOOKOS_RAFT_ADDRESS": "raft-address",
    "NOTEBOOKOS_PEERS": "peers",
    "NOTEBOOKOS_KERNEL_ID": "kernel-id",
    "NOTEBOOKOS_STORE_URL": "store-url",
    "NOTEBOOKOS_ELECTION_TIMEOUT": "election-timeout",
    "NOTEBOOKOS_RESTORED_FROM_SURVIVOR": "restored-from-survivor",
    "NOTEBOOKOS_RESTORED_FOR": "restored-for",
    "NOTEBOOKOS_RESTORE_EXPECTED": "restore-expected",
    "NOTEBOOKOS_INCARNATION": "incarnation",
}
ENV_FLAGS = {
    "NOTEBOOKOS_JOIN": "join",
    "NOTEBOOKOS_RESTORE_FROM_CHECKPOINT": "restore-from-checkpoint",
    "NOTEBOOKOS_CELL_CONTAINER": "cell-container",
}


MEMORY_HISTORY = ":memory:"


class ReplicaKernelApp(IPKernelApp):
    name = "notebookos-kernel"
    classes = [*IPKernelApp.classes, ReplicaKernel]  # so --help documents the replica options
    kernel_class = Type(ReplicaKernel, klass="ipykernel.kernelbase.Kernel").tag(config=True)
    outstream_class = DottedObjectName(
        "notebookos.kernel.iostream.ReplicaOutStream",
        help="stdout/stderr class (ipykernel's OutStream, skipping empty flushes)",
    ).tag(config=True)
    def init_sockets(self) -> None:
        super().init_sockets()
        # No kernel subshells: they would run cells concurrently beside the group's elections
        # (a replica runs one elected cell at a time), and without the shell-channel thread a
        # message reaches the kernel's loop, and its reply the socket, one thread hop sooner.
        self.shell_channel_thread = None
        # The Global Scheduler connects control and stdin only when a request needs them and
        # closes them when idle (front_replicas.py): its reconnection must take its identity
        # over (ipykernel sets this as well), and an input_request waits for the connection.
        self.control_socket.setsockopt(zmq.ROUTER_HANDOVER, 1)
        make_patient(self.stdin_socket)

    def init_kernel(self) -> None:
        # IPython's input history stays in memory unless configured otherwise: a replica's own
        # history file would hold only the cells it happened to execute, every kernel on the
        # host would contend for the one sqlite file, and its commit after every cell cost the
        # executor ~1.8 ms of CPU (docs/performance.md). The notebook is the record of cells;
        # %history and In still list the cells this replica ran.
        if "hist_file" not in self.config.HistoryManager:
            self.config.HistoryManager.hist_file = MEMORY_HISTORY
        # ipykernel loads debugpy for Jupyter's debugger when the kernel is made: 8.8 MB and
        # ~50 ms of CPU per replica (three per kernel; docs/performance.md, issue 18). It would
        # follow the front's preferred replica, not the cell's elected executor, so replicas do
        # not offer it (kernel_info says "debugger": false, as the front says while starting).
        # debugpy is hidden only while the kernel is made: notebook code can still import it.
        hide = not self.debugger and "debugpy" not in sys.modules \
            and "ipykernel.debugger" not in sys.modules
        if hide:
            sys.modules["debugpy"] = None  # type: ignore[assignment] - import fails: no debugger
        try:
            super().init_kernel()
        finally:
            if hide and "debugpy" in sys.modules and sys.modules["debugpy"] is None:
                del sys.modules["debugpy"]

    aliases = Dict({
        **kernel_aliases,
        "replica-id": "ReplicaKernel.replica_id",
        "raft-address": "ReplicaKernel.raft_address",
        "peers": "ReplicaKernel.peers",
        "kernel-id": "ReplicaKernel.kernel_id",
        "store-url": "ReplicaKernel.store_url",
        "election-timeout": "ReplicaKernel.election_timeout",
        "restored-from-survivor": "ReplicaKernel.restored_from_survivor",
        "restored-for": "ReplicaKernel.restored_for",
        "restore-expected": "ReplicaKernel.restore_expected",
        "incarnation": "ReplicaKernel.incarnation",
        "executor-dead-after": "ReplicaKernel.executor_dead_after",
        "raft-compaction-entries": "ReplicaKernel.raft_compaction_entries",
        "iopub-backlog-messages": "ReplicaKernelApp.iopub_backlog_messages",
        "iopub-backlog-bytes": "ReplicaKernelApp.iopub_backlog_bytes",
    })
    flags = Dict({
        **kernel_flags,
        "join": ({"ReplicaKernel": {"join": True}}, "Join an existing group as a replacement."),
        "restore-from-checkpoint": (
            {"ReplicaKernel": {"restore_from_checkpoint": True}},
            "Rebuild the namespace from the store's checkpoint.",
        ),
        "cell-container": (
            {"ReplicaKernel": {"cell_container": True}},
            "The container of one cell (batch, lcp): a restore is planned, not a loss.",
        ),
    })
    debugger = Bool(
        False,
        help="Offer Jupyter's debugger (loads debugpy). Off: breakpoints would be set on the "
        "front's preferred replica, while a cell runs on whichever replica is elected.",
    ).tag(config=True)
    iopub_backlog_messages = Int(
        DEFAULT_MAX_MESSAGES,
        help="IOPub messages kept while no scheduler subscribes (oldest dropped beyond).",
    ).tag(config=True)
    iopub_backlog_bytes = Int(
        DEFAULT_MAX_BYTES, help="Bytes of IOPub messages kept while no scheduler subscribes."
    ).tag(config=True)

    def init_iopub(self, context: zmq.Context) -> None:
        """ipykernel's XPUB, published by a ``BufferedIOPubThread`` (kernel/iopub.py) so nothing
        is lost while the Global Scheduler is away."""
        self.iopub_socket = context.socket(zmq.XPUB)
        self.iopub_socket.linger = 1000
        # A held backlog is sent in one burst on subscription: the send queue must take it all.
        self.iopub_socket.sndhwm = max(1000, self.iopub_backlog_messages)
        # A subscriber on a host that vanished (no FIN/RST) is dropped, so holding starts: by the
        # operating system's TCP keepalive while the link is idle (a probe after 2 s of silence,
        # dropped after 2 more unanswered at 2 s) and TCP_USER_TIMEOUT (ZMQ_TCP_MAXRT) while data
        # waits for an acknowledgement, about 6 s either way. These timers run in the kernel: ZMTP
        # heartbeats (2 s, as before) woke libzmq's IO thread about once a second in every idle
        # replica (issue 36).
        set_dead_peer_timeouts(self.iopub_socket)
        self._apply_curve_server_options(self.iopub_socket)
        self.iopub_port = self._bind_socket(self.iopub_socket, self.iopub_port)
        self.log.debug("iopub XPUB Channel on port: %i", self.iopub_port)
        self.configure_tornado_logger()
        self.iopub_thread = BufferedIOPubThread(
            self.iopub_socket, pipe=True, session=self.session,
            max_messages=self.iopub_backlog_messages, max_bytes=self.iopub_backlog_bytes)
        self.iopub_thread.start()
        self.iopub_socket = self.iopub_thread.background_socket


def argv_with_env(argv: list[str], environ: dict[str, str] | None = None) -> list[str]:
    """``argv`` plus options taken from NOTEBOOKOS_* variables that the command line lacks."""
    environ = dict(os.environ if environ is None else environ)
    given = {a.split("=", 1)[0].lstrip("-") for a in argv if a.startswith("--")}
    extra: list[str] = []
    for var, option in ENV_OPTIONS.items():
        if environ.get(var) and option not in given:
            extra.append(f"--{option}={environ[var]}")
    for var, flag in ENV_FLAGS.items():
        if environ.get(var, "").lower() in ("1", "true", "yes") and flag not in given:
            extra.append(f"--{flag}")
    return [*argv, *extra]


# Loggers of the replica's own machinery. Without a handler their warnings reach logging's
# last-resort handler, which writes to whatever ``sys.stderr`` is when they fire: inside a cell,
# ipykernel's stream to the notebook. A user saw pysyncobj's "truncating already-applied log
# entries" in a cell's output after a replica was paused (the fault tests).
INTERNAL_LOGGERS = ("pysyncobj", "notebookos")


def keep_internal_logs_out_of_cells(stream_fd: int) -> logging.Handler:
    """Send the replica's internal loggers (WARNING and up) to ``stream_fd`` (the process's own
    stderr, saved before ipykernel redirects it: the replica's log) instead of the user's cell.
    The user's own logging keeps ipykernel's behaviour (it shows in the notebook)."""
    handler = logging.StreamHandler(os.fdopen(stream_fd, "w", buffering=1, closefd=False))
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.setLevel(logging.WARNING)
    for name in INTERNAL_LOGGERS:
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        logger.propagate = False
    return handler


def main(argv: list[str] | None = None) -> None:
    import sys
    import traceback

    stderr_fd = os.dup(2)  # ipykernel redirects fd 2 (and sys.stderr) to its IOPub streams
    keep_internal_logs_out_of_cells(stderr_fd)
    try:
        ReplicaKernelApp.launch_instance(
            argv=argv_with_env(sys.argv[1:] if argv is None else argv))
    except Exception:  # noqa: BLE001 - a replica that cannot start must exit, not linger
        # e.g. a port taken between its draw and the bind: the threads started before the
        # failure (IOPub, Raft) would keep a plain exit from ending the process, and its Local
        # Scheduler would see no exit while the Global Scheduler waited for a reply
        os.write(stderr_fd, traceback.format_exc().encode(errors="replace"))
        os._exit(1)
