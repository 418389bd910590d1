"""The reply merger: what a front's replicas answer on shell and control, merged into the one
reply its client sees.

A request sent to one replica gets that replica's reply (another live one is asked when it is
lost). For an ``execute_request`` the executor's reply goes to the client, with what the
scheduler knows added under ``metadata.notebookos`` (``_with_scheduler_metadata``), and the
cell's GPUs are released; when every replica asked answered and none executed, the cell is
placed again (every replica yielded: nothing ran) or the client gets the replicas' reason. A
reply to a request this front did not route (sent before a Global Scheduler restart) goes to
the client whose session sent it. A shell reply for a client that is not connected is kept for
``UNROUTED_KEEP_S`` and retried.

Mixed into ``KernelFront``.
"""

from __future__ import annotations

import datetime
import logging
import time
from typing import Any

from notebookos.global_scheduler.front_hooks import call_optional
from notebookos.global_scheduler.front_requests import MAX_RESUBMISSIONS, _Pending, _retry_id
from notebookos.zmq_frames import send_frames

log = logging.getLogger(__name__)

ALL_YIELDED = "NotebookOSAllReplicasYielded"  # docs/kernel-protocol.md
REPLICAS_LOST = "NotebookOSReplicasLost"  # every replica running a started cell was lost
# How long a shell reply for a client that is not connected is kept (a client reconnecting after
# a Global Scheduler restart is back within a second; one that left for good never is).
UNROUTED_KEEP_S = 60.0


class ReplyMerger:
    # A started cell whose replicas were all lost fails with REPLICAS_LOST here; a front whose
    # placement answers for such a cell itself (per-cell containers) turns this off.
    fail_lost_started_cells = True

    def _init_replies(self) -> None:
        self._pending: dict[str, _Pending] = {}

    def _from_replica(self, channel: str, rid: int, frames: list[bytes]) -> None:
        """A replica's reply on shell or control (its stdin: ``KernelFront._input_request``)."""
        idents, msg_list = self.session.feed_identities(frames, copy=True)
        msg = self._verify(msg_list, content=False)
        if msg is None:
            return
        parent_id = msg["parent_header"].get("msg_id", "")
        pending = self._pending.get(parent_id)
        if pending is None:
            self._orphan_reply(channel, rid, msg, msg_list)
            return
        pending.answered.add(rid)
        role = ((msg.get("metadata") or {}).get("notebookos") or {}).get("role")
        log.debug("kernel %s: %s from replica %d (role %s)", self.kernel_id,
                  msg["header"]["msg_type"], rid, role)
        if pending.msg_type != "execute_request":
            if pending.source is None or rid == pending.source:
                del self._pending[parent_id]
                self._to_client(pending, msg, msg_list)
            return
        if role == "executor" or (role is None and rid == pending.source):
            if rid != pending.source:
                self._executor_found(parent_id, pending, rid)
            del self._pending[parent_id]
            self._holding.pop(parent_id, None)  # a short cell: its standbys never needed asking
            if pending.placement is not None:
                msg_list = self._with_scheduler_metadata(msg, msg_list, pending, rid)
            self._to_client(pending, msg, msg_list)
            self.hooks.release_execute(self.kernel_id, parent_id)
            self.hooks.execute_finished(self.kernel_id, rid, parent_id)
            return
        pending.last_reply = msg_list
        self._settle(parent_id, pending)

    def _with_scheduler_metadata(self, msg: dict, msg_list: list[bytes],
                                 pending: _Pending, rid: int) -> list[bytes]:
        """The executor's execute_reply with what the scheduler knows added under
        ``metadata.notebookos``: ``host_id`` (the executor's host), ``gpu_device_ids`` (the
        GPUs committed for the cell), ``gpu_seconds`` (their count x their commit -> this reply:
        the cell's GPU time), ``interactivity_delay_ms`` (request at the front ->
        execute_input) and, for a cell that waited before it was sent to its executor,
        ``waited_ms`` (request at the front -> sent), ``waited_for`` (what it waited for:
        ``replicas starting``, ``GPUs``, ``migration``, comma-separated in order) and
        ``wait_reason`` (why). Re-signed; ``msg`` is updated to match."""
        placement = pending.placement
        assert placement is not None
        extra: dict[str, Any] = {"gpu_device_ids": list(pending.gpu_device_ids)}
        if pending.gpu_device_ids and placement.placed_at:  # committed when placed, released now
            extra["gpu_seconds"] = round(
                len(pending.gpu_device_ids) * (time.monotonic() - placement.placed_at), 3)
        replica = self._replicas.get(rid)
        if replica is not None and replica.endpoint.host_id:
            extra["host_id"] = replica.endpoint.host_id
        started = pending.started or _started_from_reply(msg)
        if started:
            extra["interactivity_delay_ms"] = round(
                max(0.0, started - placement.arrived) * 1000, 1)
        waited = self._waited_for.pop(pending.client_msg_id, None)
        if waited:
            extra.update(waited_for=", ".join(waited), wait_reason="; ".join(waited.values()),
                         waited_ms=round((placement.placed_at - placement.arrived) * 1000))
        metadata = dict(msg.get("metadata") or {})
        metadata["notebookos"] = {**(metadata.get("notebookos") or {}), **extra}
        msg["metadata"] = metadata
        frames = [msg_list[1], msg_list[2], self.session.pack(metadata), msg_list[4]]
        return [self._sign(frames), *frames, *msg_list[5:]]

    def _orphan_reply(self, channel: str, rid: int, msg: dict, msg_list: list[bytes]) -> None:
        """A reply to a request this front did not route (sent before a Global Scheduler
        restart): the executor's reply goes to the client whose session sent the request
        (jupyter_client's shell identity is its session id); other replies are dropped."""
        parent = msg.get("parent_header") or {}
        role = ((msg.get("metadata") or {}).get("notebookos") or {}).get("role")
        session = parent.get("session")
        if channel != "shell" or role != "executor" or not session:
            return
        self._learn_source(parent.get("msg_id", ""), rid)
        self._reply("shell", [str(session).encode(), b"<IDS|MSG>", *msg_list])

    def _settle(self, msg_id: str, pending: _Pending) -> None:
        """Every replica still asked has answered and none executed: resubmit when they all
        yielded (nothing ran), else give the client the replicas' reason."""
        if pending.msg_type != "execute_request":
            if pending.asked:
                return
            # Its replica is gone: ask another live one, or answer instead of leaving it hanging.
            live = sorted(self._replicas)
            if live and pending.frames and pending.source is not None:
                pending.source = live[0]
                pending.asked = {live[0]}
                self._remember(self._iopub_source, msg_id, live[0])
                sock = self._replica_socket(live[0], pending.channel)
                send_frames(sock, [b"<IDS|MSG>", *pending.frames])
                return
            del self._pending[msg_id]
            if pending.client_msg is not None and pending.msg_type.endswith("_request"):
                self._reply_error(pending.channel, pending.idents, pending.client_msg,
                                  "NotebookOSReplicaLost",
                                  "the replica handling this request was lost; retry")
            return
        if pending.held_yields:  # the executor answered without running it: ask the others
            self._send_held_yields(msg_id, pending)
        if not pending.answered >= pending.asked:
            return
        del self._pending[msg_id]
        self.hooks.release_execute(self.kernel_id, msg_id)
        last = self._verify_quiet(pending.last_reply) if pending.last_reply else None
        content = (last or {}).get("content", {})
        yielded = last is None or content.get("ename") == ALL_YIELDED
        if yielded and not pending.started:  # no execute_input will come under this id
            call_optional(self.hooks, "execute_abandoned", self.kernel_id, msg_id)
        client = pending.client_msg
        if last is None and pending.started and client is not None \
                and self.fail_lost_started_cells:
            # Every replica asked was lost after the cell's code had started (a rebuild from
            # the checkpoint follows): it may have run in part, so it is never run again
            # unasked (a cell runs at most once); the user decides.
            log.warning("kernel %s: every replica running %s was lost; not running it again",
                        self.kernel_id, pending.client_msg_id)
            self._reply_error("shell", pending.idents, client, REPLICAS_LOST,
                              "every replica running this cell was lost before it finished; "
                              "the cell did not complete and is not run again. The kernel "
                              "is rebuilt from its last checkpoint (its next cell says which "
                              "cell that is): run the cell again then")
            return
        if yielded and client is not None and pending.attempt < MAX_RESUBMISSIONS:
            retry_id = _retry_id(msg_id, pending.attempt + 1)
            log.info("kernel %s: no replica ran %s; resubmitting as %s", self.kernel_id,
                     pending.client_msg_id, retry_id)
            self._remember(self._superseded, msg_id, pending.attempt)
            self._route_execute(pending.idents, client, retry_id, pending.attempt + 1)
        elif last is not None:
            self._to_client(pending, last, pending.last_reply)
        elif client is not None:
            self._reply_error("shell", pending.idents, client, ALL_YIELDED,
                              f"no replica could run the cell after {pending.attempt + 1} "
                              "attempt(s)")

    def _to_client(self, pending: _Pending, msg: dict, msg_list: list[bytes]) -> None:
        """Forward a reply; one to a resubmitted request gets the client's parent header back.
        An execute_reply is followed by its idle (``_idle_after_reply``)."""
        election_id = msg["parent_header"].get("msg_id", "")
        original = self._aliases.get(election_id)
        if original is None:
            self._reply(pending.channel, [*pending.idents, b"<IDS|MSG>", *msg_list])
        else:
            frames = self.session.serialize({**msg, "parent_header": original,
                                             "content": self.session.unpack(msg_list[4])},
                                            ident=pending.idents)
            self._reply(pending.channel, [*frames, *msg_list[5:]])
        if pending.msg_type == "execute_request":
            self._idle_after_reply(pending, election_id)

    def _reply(self, channel: str, frames: list[bytes]) -> None:
        """Send a reply to a client; on shell, one for a client that is not connected is kept
        for ``UNROUTED_KEEP_S`` and retried by the loop (after a Global Scheduler restart, a
        replica's held reply can arrive before the client's DEALER has reconnected)."""
        if channel == "shell":
            self._unrouted.send(frames)
        else:
            send_frames(self._sockets[channel], frames)

    def _reply_error(self, channel: str, idents: list[bytes], parent: dict, ename: str,
                     evalue: str) -> None:
        """Answer the client directly (busy, error reply, idle) when no replica can."""
        reply_type = parent["header"]["msg_type"].replace("_request", "_reply")
        content = {"status": "error", "ename": ename, "evalue": evalue, "traceback": [
            f"{ename}: {evalue}"]}
        if reply_type == "execute_reply":
            content["execution_count"] = None
        msg = self.session.msg
        self._send_iopub(msg("status", {"execution_state": "busy"}, parent=parent),
                         b"kernel.notebookos.status")
        if reply_type == "execute_reply":
            error = {k: content[k] for k in ("ename", "evalue", "traceback")}
            self._send_iopub(msg("error", error, parent=parent), b"kernel.notebookos.error")
        self._reply(channel, self.session.serialize(msg(reply_type, content, parent=parent),
                                                    ident=idents))
        self._send_iopub(msg("status", {"execution_state": "idle"}, parent=parent),
                         b"kernel.notebookos.status")


def _started_from_reply(msg: dict) -> float:
    """When the replica started the cell (ipykernel's ``metadata.started``, wall clock), on this
    process's monotonic clock; 0 when the reply does not say. The front learns the start from
    the executor's ``execute_input``, but that comes on IOPub, which ipykernel sends from
    another thread: it can reach the front after the reply."""
    raw = (msg.get("metadata") or {}).get("started")
    if isinstance(raw, str):
        try:
            raw = datetime.datetime.fromisoformat(raw)
        except ValueError:
            return 0.0
    if not isinstance(raw, datetime.datetime):
        return 0.0
    if raw.tzinfo is None:
        raw = raw.replace(tzinfo=datetime.UTC)
    return time.monotonic() - max(0.0, time.time() - raw.timestamp())

