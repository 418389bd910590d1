"""Room for thousands of kernels: open files and ZMQ sockets.

Each open kernel holds up to 17 ZMQ sockets in the Global Scheduler (5 bound for its clients;
per replica shell and IOPub, and control and stdin while a request uses them: front_replicas.py),
each an fd for its mailbox plus one per TCP connection or listener. A kernel in use holds 11
sockets and 22 fds, and 5 fds more for each client attached (Jupyter Server's channels); once
idle, with its standbys' links resting, 7 sockets and 14 fds. The room counted here is for
kernels in use.
libzmq's default of 1,023 sockets per context and a soft ``RLIMIT_NOFILE`` of 1,024 would stop
the scheduler at about 45 kernels.
"""

from __future__ import annotations

import errno
import logging
import resource

import zmq

log = logging.getLogger(__name__)

SOCKETS_PER_KERNEL = 17  # at most, with every replica's control and stdin connected
FDS_PER_IDLE_KERNEL = 22  # in use: 5 bound sockets (mailbox, listener), 6 replica links (mailbox, TCP)
# once its standbys' links rest (global_scheduler.idle_links_close_s after its last request):
# 5 bound sockets and its executor's shell and IOPub (front_replicas.py)
FDS_PER_RESTING_KERNEL = 14
FDS_PER_CLIENT = 5  # a Jupyter Server attached: its shell, control, stdin, IOPub, heartbeat
FDS_PER_OPEN_KERNEL = FDS_PER_IDLE_KERNEL + FDS_PER_CLIENT


def raise_limits(kernels: int = 20_000) -> int:
    """Raise the soft open-file limit to the hard one and the process ZMQ context's socket cap
    to what ``kernels`` need (call before the context makes its first socket). Returns the
    number of idle kernels without clients the open-file limit leaves room for."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-file limit from %d: %s", soft, exc)
    wanted = kernels * SOCKETS_PER_KERNEL + 1024
    context = zmq.Context.instance()
    if context.get(zmq.MAX_SOCKETS) < wanted:
        context.set(zmq.MAX_SOCKETS, wanted)
    room = soft // FDS_PER_IDLE_KERNEL if soft != resource.RLIM_INFINITY else kernels
    return min(kernels, room)


def open_file_limit() -> int:
    """This process's soft open-file limit (0: none)."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return 0 if soft == resource.RLIM_INFINITY else soft


def kernels_room(open_files: int) -> int:
    """How many open kernels, each with a client attached, a process allowed ``open_files``
    holds while keeping a twentieth of them (at least 256) for everything else: gRPC
    connections, the control and stdin links made on demand, replacement replicas, the
    registry, logs (0 for no limit: any number)."""
    if open_files <= 0:
        return 0
    reserve = max(256, open_files // 20)
    return max(1, (open_files - reserve) // FDS_PER_OPEN_KERNEL)


def out_of_files(exc: BaseException) -> bool:
    """Whether ``exc`` (an OSError or a ZMQError) says the process is out of open files."""
    return getattr(exc, "errno", None) in (errno.EMFILE, errno.ENFILE)

