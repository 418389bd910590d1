"""Replica failures on real processes: SIGKILL between and mid-cell, replacement, full rebuild.

Each test owns its group (the failures are destructive); a group starts in about 1.5 s.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from harness import ReplicaGroup

from notebookos.kernel.replies import EXECUTOR_FAILED


def test_executor_killed_between_cells(group: ReplicaGroup):
    first = group.execute("import numpy as np\nstate = {'a': 1}\narr = np.arange(10)", target=1)
    count = first.executor_reply()["content"]["execution_count"]
    group.kill(1)
    t0 = time.monotonic()
    result = group.execute("state['b'] = 2\nprint(sorted(state), int(arr.sum()))", target=2)
    failover = time.monotonic() - t0
    assert result.executor() == 2, result.summary()
    assert result.stdout() == "['a', 'b'] 45\n"
    assert result.executor_reply()["content"]["execution_count"] == count + 1
    assert failover < 5.0
    again = group.execute("print(state)", target=3)
    assert again.stdout() == "{'a': 1, 'b': 2}\n"
    assert again.executor_reply()["content"]["execution_count"] == count + 2


def test_executor_killed_mid_cell_fails_the_cell_and_keeps_the_previous_namespace(
    group: ReplicaGroup,
):
    group.execute("value = 'before'", target=1)
    msg_id = group.send_execute("value = 'during'\nimport time\ntime.sleep(60)", target=1)
    client = group.replicas[1].client
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        msg = client.get_iopub_msg(timeout=10)
        if msg["msg_type"] == "execute_input" and msg["parent_header"].get("msg_id") == msg_id:
            break
    time.sleep(0.3)
    group.kill(1)
    result = group.collect(msg_id, [2, 3], target=None, timeout=20)
    for rid in (2, 3):
        content = result.reply(rid)["content"]
        assert content["status"] == "error" and content["ename"] == EXECUTOR_FAILED
        assert "replica 1" in content["evalue"] and "last completed cell" in content["evalue"]
    after = group.execute("print(value)", target=2)
    assert after.executor() == 2 and after.stdout() == "before\n"


def test_executor_holding_the_gil_for_seconds_is_not_taken_for_dead(group: ReplicaGroup):
    # sum() over a range never releases the GIL: Raft's thread in the executor is frozen
    result = group.execute("total = sum(range(150_000_000))", target=1)
    assert result.reply(1)["content"]["status"] == "ok", result.summary()
    for rid in (2, 3):
        assert result.reply(rid)["content"]["status"] == "ok", result.summary()
    assert group.replicas[1].alive
    assert group.execute("print(total > 0)", target=2).stdout() == "True\n"


def test_replacement_replica_catches_up_and_can_execute(group: ReplicaGroup):
    group.execute("import numpy as np\nbig = np.ones(300_000)\nsmall = [1, 2, 3]", target=1)
    group.execute("small.append(4)\ndef twice(v):\n    return 2 * v", target=2)
    group.kill(3)
    removed = group.remove(3, via=1)
    assert removed["content"]["status"] == "ok", removed["content"]
    replacement = group.add_replacement(via=1)
    rid = replacement.replica_id
    result = group.execute("print(small, twice(int(big.sum())))", target=rid)
    assert result.executor() == rid, result.summary()
    assert result.stdout() == "[1, 2, 3, 4] 600000\n"
    status = group.status()
    assert set(status[1]["members"]) == {"1", "2", str(rid)}


def test_replacement_has_the_state_of_cells_its_predecessor_ran_back_to_back(
    group: ReplicaGroup,
):
    """Issues 11 and 19: cells 2 and 3 run on replica 1 again, so its LEAD alone decides them
    (the sticky fast path). A replacement replays that log starting with other members; it must
    still apply their updates, or it later runs cells without that state (NameError)."""
    group.execute("import numpy as np\nbig = np.arange(300_000.0)\nv = 0", target=1)
    group.execute("v = 1\nnote = 'set by cell 2'", target=1)
    group.execute("v += 1\nbig[0] = 7.0", target=1)
    group.kill(1)
    assert group.remove(1, via=2)["content"]["status"] == "ok"
    replacement = group.add_replacement(via=2)
    result = group.execute("print(v, note, float(big[0]))", target=replacement.replica_id)
    assert result.executor() == replacement.replica_id, result.summary()
    assert result.stdout() == "2 set by cell 2 7.0\n", (result.summary(), result.stderr())
    counts = {r["content"]["execution_count"] for r in result.replies.values()}
    assert len(counts) == 1, result.summary()


def test_all_replicas_killed_kernel_rebuilt_from_checkpoint(tmp_path: Path):
    store_url = f"file://{tmp_path}/store"
    first = ReplicaGroup(tmp_path / "a", store_url=store_url)
    try:
        first.start()
        first.execute("import numpy as np\nweights = np.arange(5.0)\nnote = 'kept'", target=1)
        last = first.execute("note += '!'", target=2)
        count = last.executor_reply()["content"]["execution_count"]
        first.wait_status(lambda s: all(x["checkpoint_count"] == count for x in s.values()))
        for rid in (1, 2, 3):
            first.kill(rid)
    finally:
        first.stop()
    second = ReplicaGroup(tmp_path / "b", store_url=store_url, kernel_id=first.kernel_id,
                          key=first.key)
    try:
        second.start("--restore-from-checkpoint")
        result = second.execute("print(note, weights.tolist())", target=3)
        assert result.stdout() == "kept! [0.0, 1.0, 2.0, 3.0, 4.0]\n", result.summary()
        assert f"checkpoint taken after cell [{count}]" in result.stderr()
        assert result.executor_reply()["content"]["execution_count"] == count + 1
    finally:
        second.stop()


def test_replacement_catches_up_from_a_raft_snapshot(tmp_path: Path):
    group = ReplicaGroup(tmp_path, store_url=f"file://{tmp_path}/store",
                         extra_args=["--raft-compaction-entries=10"])
    try:
        group.start()
        group.execute("import numpy as np\ntable = np.arange(200_000)\ncounter = 0", target=1)
        for _ in range(8):  # enough records to compact the log several times
            group.execute("counter += 1", target=2)
        group.execute("del table\ntable2 = [counter]", target=1)
        group.kill(3)
        assert group.remove(3, via=1)["content"]["status"] == "ok"
        replacement = group.add_replacement(via=2)
        result = group.execute("print(counter, table2, 'table' in globals())",
                               target=replacement.replica_id)
        assert result.stdout() == "8 [8] False\n", result.summary()
    finally:
        group.stop()


def test_a_replica_with_another_kernel_key_cannot_join_the_raft_group(tmp_path: Path):
    from jupyter_client.connect import write_connection_file

    group = ReplicaGroup(tmp_path, store_url=f"file://{tmp_path}/store")
    impostor = group.replicas[3]
    impostor.connection_file.unlink()
    write_connection_file(str(impostor.connection_file), ip="127.0.0.1", key=b"another key")
    try:
        group.start(ready=[1, 2])
        time.sleep(1.5)  # ample time for Raft to have let it in, were the password not checked
        status = group.control(3, "replica_status_request", {})["content"]
        assert not status["has_quorum"] and not status["raft_ready"], status
        result = group.execute("print('two of three')", target=1, to=[1, 2])
        assert result.stdout() == "two of three\n", result.summary()
    finally:
        group.stop()


def test_a_replica_that_cannot_bind_its_ports_exits_at_once(tmp_path: Path) -> None:
    """A port taken between its draw and the bind (another host's replica drew it too): the
    replica must exit, so that its Local Scheduler reports it and the start is retried, instead
    of lingering with the threads it started before the failure (the Global Scheduler then
    waited its whole start timeout, 60 s, for a reply that never came)."""
    import json
    import socket

    group = ReplicaGroup(tmp_path, size=1)
    replica = group.replicas[1]
    taken = socket.socket()
    try:
        taken.bind(("127.0.0.1", json.loads(replica.connection_file.read_text())["iopub_port"]))
        taken.listen()
        group._launch(replica, {1: replica.raft_address})  # noqa: SLF001 - one process
        assert replica.proc is not None
        code = replica.proc.wait(timeout=30)
        assert code == 1, replica.proc
        assert "Address already in use" in replica.log_path.read_text()
    finally:
        taken.close()
        group.stop()


def test_shared_references_survive_an_executor_failover(group: ReplicaGroup):
    """Issue 20: after the failover the standby's alias is still the list inside d."""
    group.execute("d = {'k': []}\nalias = d['k']\nalias.append('x')", target=1)
    group.execute("cfg = {'optim': {'lr': 0.1}}", target=1)
    group.execute("opt_cfg = cfg['optim']", target=1)  # cfg is not touched by this cell
    group.kill(1)
    result = group.execute("alias.append('y')\nopt_cfg['lr'] = 0.01\n"
                           "print(alias is d['k'], d, opt_cfg is cfg['optim'], cfg)", target=2)
    assert result.stdout() == ("True {'k': ['x', 'y']} True {'optim': {'lr': 0.01}}\n"), \
        result.summary()
    again = group.execute("print(alias is d['k'], d, cfg)", target=3)
    assert again.stdout() == "True {'k': ['x', 'y']} {'optim': {'lr': 0.01}}\n"


@pytest.mark.usefixtures("torch_installed")
def test_training_state_and_seeds_survive_the_executors_death(group: ReplicaGroup):
    """Issue 31 items 1, 2, 6 on real replicas: an update through ``.data``, a gradient filled
    by ``backward()`` and the seeded global generators are what the next executor holds.
    The expected values are plain Python's (computed here the same way)."""
    import random as plain_random

    import numpy as np
    import torch

    group.execute("import torch, random, numpy as np\nW = torch.zeros(3, requires_grad=True)",
                  target=1)
    group.execute("W.data += 1\n(W * 2).sum().backward()\nnp.random.seed(0)\nrandom.seed(1)\n"
                  "torch.manual_seed(42)", target=1)
    group.kill(1)
    result = group.execute(
        "print(W.detach().tolist(), W.grad.tolist())\n"
        "print(np.random.rand(2).tolist(), random.random(), torch.rand(2).tolist())", target=2)
    assert result.executor() == 2, result.summary()
    np.random.seed(0)
    plain_random.seed(1)
    torch.manual_seed(42)
    expected = (f"[1.0, 1.0, 1.0] [2.0, 2.0, 2.0]\n"
                f"{np.random.rand(2).tolist()} {plain_random.random()} {torch.rand(2).tolist()}\n")
    assert result.stdout() == expected


def test_a_survivor_writes_its_state_as_the_checkpoint_to_rebuild_from(tmp_path: Path):
    """The Global Scheduler rebuilds a group that lost its quorum from the store's checkpoint;
    the executor's last one may lag (a SIGKILL right after a cell: the notebook corpus lost the
    cells since then). First the freshest survivor writes what it applied
    (``write_checkpoint_request``). Here the executor writes its checkpoints to a store of its
    own, so the shared one holds only what the survivor writes."""
    shared = f"file://{tmp_path}/shared"
    first = ReplicaGroup(tmp_path / "a", store_url=shared,
                         store_urls={1: f"file://{tmp_path}/executors-own"})
    try:
        first.start()
        first.execute("note = 'kept'\nitems = [1, 2]", target=1)
        last = first.execute("items.append(3)\nnote += '!'", target=1)
        count = last.executor_reply()["content"]["execution_count"]
        first.wait_status(lambda s: s[2]["execution_count"] == count and s[2]["caught_up"])
        first.kill(1)
        first.kill(3)
        reply = first.control(2, "write_checkpoint_request", {}, timeout=60)["content"]
        assert reply["status"] == "ok" and reply["checkpoint_count"] == count, reply
        again = first.control(2, "write_checkpoint_request", {}, timeout=60)["content"]
        assert again["checkpoint_count"] == 0, again  # the store's is as recent: not rewritten
    finally:
        first.stop()
    result = _run_in_a_group_rebuilt_from_replica_2(tmp_path, shared, first,
                                                    "print(note, items)")
    assert result.stdout() == "kept! [1, 2, 3]\n", result.summary()
    assert (f"checkpoint of cell [{count}], which holds every cell replica 2, its most "
            "up-to-date survivor, had applied") in result.stderr()
    assert "lost." not in result.stderr()
    assert result.executor_reply()["content"]["execution_count"] == count + 1


def test_a_survivor_answers_while_a_membership_change_it_cannot_commit_waits(tmp_path: Path):
    """A double fault (the executor killed, a second host hung): the Global Scheduler asks the
    survivor to remove the dead member, which cannot commit (no majority) and waits up to the
    membership timeout; it gives up on its side and asks the survivor what it holds and to
    write it as the checkpoint to rebuild from. Those answers came only after the removal's
    wait (ipykernel answers control requests one at a time): the scheduler gave up after 5 s
    and rebuilt the group from the executor's older checkpoint (the fault campaign, seed 14:
    a notebook rolled back one cell)."""
    shared = f"file://{tmp_path}/shared"
    group = ReplicaGroup(tmp_path / "a", store_url=shared,
                         store_urls={1: f"file://{tmp_path}/executors-own"})
    try:
        group.start()
        last = group.execute("kept = 'yes'", target=1)
        count = last.executor_reply()["content"]["execution_count"]
        group.wait_status(lambda s: s[2]["execution_count"] == count and s[2]["caught_up"])
        os.killpg(group.replicas[3].proc.pid, signal.SIGSTOP)  # its host hangs
        try:
            group.kill(1)
            client = group.replicas[2].client
            removal = client.session.msg("remove_replica_request", {"replica_id": 1})
            client.control_channel.send(removal)  # waits in the survivor: no majority
            time.sleep(0.5)
            t0 = time.monotonic()
            status = group.control(2, "replica_status_request", {}, timeout=4)["content"]
            assert status["execution_count"] == count, status
            reply = group.control(2, "write_checkpoint_request",
                                  {"apply_unconfirmed_tail": True}, timeout=8)["content"]
            took = time.monotonic() - t0
            assert reply["status"] == "ok" and reply["checkpoint_count"] == count, reply
            assert took < 4.0, f"the survivor answered after {took:.1f} s"
        finally:
            os.killpg(group.replicas[3].proc.pid, signal.SIGCONT)
    finally:
        group.stop()


def _run_in_a_group_rebuilt_from_replica_2(tmp_path: Path, store_url: str,
                                           first: ReplicaGroup, code: str):  # noqa: ANN202
    """Start a fresh group from the store's checkpoint, as the Global Scheduler rebuilds one
    from its survivor replica 2's state, and run ``code`` there."""
    second = ReplicaGroup(tmp_path / "b", store_url=store_url, kernel_id=first.kernel_id,
                          key=first.key)
    try:
        second.start("--restore-from-checkpoint", "--restored-from-survivor=replica 2")
        return second.execute(code, target=3)
    finally:
        second.stop()


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_the_executor_killed_after_every_cell_leaves_every_joiner_in_the_group(tmp_path: Path):
    """Issue 32: the executor (the Raft leader) SIGKILLed after every cell, removed, and a
    replacement joined, the next cells sent at once, each cell's state update over pysyncobj's
    batch size (sent in parts). A joiner catching up took late AppendEntries, and pysyncobj's
    deletion of the entries it held reversed the log's membership changes: its view became
    the gone replicas instead of its live peers, and once the leader was killed no live
    replica had a quorum (a cell or the removal hung). Failed 4 times in 74 rounds before the
    fix (this test: 3 runs of 3 failed, in 30-55 s), never in 177 after."""
    group = ReplicaGroup(tmp_path, store_url=f"file://{tmp_path}/store")
    try:
        group.start()
        group.execute("import numpy as np\nx = 0\nparts = []", target=1)
        for _ in range(24):
            executor = sorted(group.alive_ids())[0]
            for _ in range(2):
                result = group.execute("x += 1\nparts.append(np.random.rand(20000))",
                                       target=executor)
                assert result.reply(executor)["content"]["status"] == "ok", result.summary()
            group.kill(executor)
            via = sorted(group.alive_ids())[0]
            removed = group.remove(executor, via=via)
            assert removed["content"]["status"] == "ok", (removed["content"], group.status())
            group.add_replacement(via=via)
        status = group.status()
        addresses = {group.replicas[rid].raft_address for rid in status}
        for rid, content in status.items():
            assert set(content["raft_members"]) == addresses, (rid, status)
        result = group.execute("print(x, len(parts))", target=sorted(group.alive_ids())[-1])
        assert result.stdout() == "48 48\n", result.summary()
    finally:
        group.stop()


def test_a_survivor_applies_the_completion_it_had_not_learned_was_committed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The executor tells the standbys that a Completion committed only with its next message
    (kernel/raft_log.py ``_nobody_waits_for``: a Completion without an update, or any with
    NOTEBOOKOS_RAFT_ANNOUNCE_UPDATES=0, set here: one with an update is announced at once, and
    the window below is then too short to hit). Killed right after its cell, with another
    replica gone too, the survivor holds that Completion in its log but never learns it was
    committed: the group has no quorum. Raft would have committed it (a new leader commits its
    whole log); the survivor applies it before writing the checkpoint a rebuilt group starts
    from (``apply_unconfirmed_tail``), else that cell's effects were lost (the notebook corpus:
    a rebuild that lost the last cell). The window is a heartbeat long: the executor is stopped
    at once after its cell, and the round tried again when the survivor had learned it."""
    monkeypatch.setenv("NOTEBOOKOS_RAFT_ANNOUNCE_UPDATES", "0")
    shared = f"file://{tmp_path}/shared"
    first = ReplicaGroup(tmp_path / "a", store_url=shared,
                         store_urls={1: f"file://{tmp_path}/executors-own"})
    count = 0
    try:
        first.start()
        first.execute("items = []", target=1)
        first.kill(3)  # replicas 1 and 2 remain: a quorum of the three
        for attempt in range(12):
            # the executor's reply and idle only: the standby replies once it applied the cell
            msg_id = first.send_execute(f"items.append({attempt})", target=1, to=[1, 2])
            last = first.collect(msg_id, [1], target=1)
            count = last.executor_reply()["content"]["execution_count"]
            os.killpg(first.replicas[1].proc.pid, signal.SIGSTOP)
            survivor = first.control(2, "replica_status_request", {})["content"]
            if survivor["open_elections"] and survivor["raft_unapplied"]:
                break  # the survivor holds the cell's Completion, unconfirmed
            os.killpg(first.replicas[1].proc.pid, signal.SIGCONT)
        else:
            pytest.skip("the survivor learned every commit within the window in 12 rounds")
        first.kill(1)
        first.wait_status(lambda s: not s[2]["has_quorum"], timeout=30)
        reply = first.control(2, "write_checkpoint_request", {"apply_unconfirmed_tail": True},
                              timeout=60)["content"]
        assert reply["status"] == "ok", reply
        # the survivor's checkpoint is labelled with the cell and holds that cell's effects
        assert reply["tail_applied"] >= 1 and reply["checkpoint_count"] == count, reply
    finally:
        first.stop()
    result = _run_in_a_group_rebuilt_from_replica_2(tmp_path, shared, first, "print(items)")
    assert result.stdout() == f"{list(range(attempt + 1))}\n", result.summary()
