"""Executor election across three real replica processes over real Raft (no mocks).

One group serves the whole module (starting three replicas costs ~1.5 s); tests that need a
particular executor say so through the target of their execute_request.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import zmq
from harness import ReplicaGroup
from jupyter_client.jsonutil import parse_date
from jupyter_client.session import Session

from notebookos.kernel.replies import ALL_YIELDED
from notebookos.testing.optional import require_torch


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory):
    workdir: Path = tmp_path_factory.mktemp("replicas")
    replicas = ReplicaGroup(workdir, store_url=f"file://{workdir}/store")
    try:
        replicas.start()
        yield replicas
    finally:
        replicas.stop()


def wait_for_execute_input(group: ReplicaGroup, replica_id: int, msg_id: str) -> None:
    """Block until the replica started running the cell (its execute_input on IOPub)."""
    client = group.replicas[replica_id].client
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        msg = client.get_iopub_msg(timeout=30)
        if msg["msg_type"] == "execute_input" and msg["parent_header"].get("msg_id") == msg_id:
            return
    raise AssertionError(f"replica {replica_id} never started {msg_id}")


def notebookos_meta(reply: dict) -> dict:
    return reply["metadata"]["notebookos"]


def test_lead_wins_and_standbys_agree_on_term_and_count(group: ReplicaGroup):
    result = group.execute("lead_marker = 'ran'\nprint('hello from', lead_marker)", target=1)
    assert result.executor() == 1, result.summary()
    assert result.stdout() == "hello from ran\n"
    executor_reply = result.reply(1)
    assert executor_reply["content"]["status"] == "ok"
    assert notebookos_meta(executor_reply)["role"] == "executor"
    # As ipykernel does: when the cell started, so a client shows its run time (issue 16).
    started = parse_date(executor_reply["metadata"]["started"])
    assert started <= executor_reply["header"]["date"]
    for rid in (2, 3):
        reply = result.reply(rid)
        assert reply["content"]["status"] == "ok"
        assert notebookos_meta(reply)["role"] == "standby"
        assert notebookos_meta(reply)["executor"] == 1
    terms = {notebookos_meta(r)["term"] for r in result.replies.values()}
    counts = {r["content"]["execution_count"] for r in result.replies.values()}
    assert len(terms) == 1 and len(counts) == 1


def test_yield_hands_off_to_another_replica_with_the_state(group: ReplicaGroup):
    group.execute("handoff = [1, 2]", target=1)
    result = group.execute("handoff.append(3)\nprint(handoff)", target=2)
    assert result.executor() == 2, result.summary()
    assert result.stdout() == "[1, 2, 3]\n"
    assert notebookos_meta(result.reply(1))["role"] == "standby"


def test_execution_count_is_continuous_across_executors(group: ReplicaGroup):
    counts = []
    for target in (1, 2, 3, 3, 1):
        result = group.execute("pass", target=target)
        assert result.executor() == target
        counts.append(result.executor_reply()["content"]["execution_count"])
    assert counts == list(range(counts[0], counts[0] + 5))


def test_all_yield_fails_cleanly_and_nothing_runs(group: ReplicaGroup):
    group.execute("side_effects = 0", target=1)
    result = group.execute("side_effects += 1", target=None)
    for reply in result.replies.values():
        assert reply["content"]["status"] == "error"
        assert reply["content"]["ename"] == ALL_YIELDED
    after = group.execute("print(side_effects)", target=3)
    assert after.stdout() == "0\n"


def test_progress_when_a_replica_never_gets_the_request_and_when_it_gets_it_late(
    group: ReplicaGroup,
):
    result = group.execute("missed = 'by three'", target=1, to=[1, 2])
    assert result.executor() == 1, result.summary()
    msg = group.last_message
    # the request reaches replica 3 only now, after the decision: it must not run the cell
    group.send_copy(msg, 3, "execute_request")
    late = group.collect(msg["header"]["msg_id"], [3], target=None)
    assert notebookos_meta(late.reply(3))["role"] == "standby"
    assert notebookos_meta(late.reply(3))["executor"] == 1
    assert notebookos_meta(late.reply(3))["term"] == notebookos_meta(result.reply(1))["term"]
    seen = group.execute("print(missed)", target=3)
    assert seen.executor() == 3 and seen.stdout() == "by three\n"


def test_a_late_execute_request_does_not_run_the_cell_twice(group: ReplicaGroup):
    group.execute("runs = []", target=2)
    result = group.execute("runs.append(1)", target=2, to=[2, 3])
    msg = group.last_message
    group.send_copy(msg, 1, "execute_request")
    late = group.collect(msg["header"]["msg_id"], [1], target=None)
    assert notebookos_meta(late.reply(1))["role"] == "standby"
    assert result.executor() == 2
    assert group.execute("print(len(runs))", target=1).stdout() == "1\n"


def test_unpicklable_variable_warns_by_name_and_is_not_synced(group: ReplicaGroup):
    result = group.execute("import threading\nlock_here = threading.Lock()\nok_value = 5", target=1)
    assert result.reply(1)["content"]["status"] == "ok"
    assert "lock_here" in result.stderr()
    other = group.execute("print(ok_value, 'lock_here' in globals())", target=2)
    assert other.stdout() == "5 False\n"


def test_deletion_replicates(group: ReplicaGroup):
    group.execute("doomed = 1", target=1)
    group.execute("del doomed", target=1)
    assert group.execute("print('doomed' in globals())", target=3).stdout() == "False\n"


def test_stdin_works_on_the_executor(group: ReplicaGroup):
    msg_id = group.send_execute("answer = input('who? ')", target=1, allow_stdin=True)
    client = group.replicas[1].client
    request = client.get_stdin_msg(timeout=10)
    assert request["msg_type"] == "input_request" and request["content"]["prompt"] == "who? "
    client.input("alice")
    result = group.collect(msg_id, group.alive_ids(), target=1)
    assert result.reply(1)["content"]["status"] == "ok", result.summary()
    assert group.execute("print(answer)", target=2).stdout() == "alice\n"


def test_interrupt_on_control_stops_the_executor_cell(group: ReplicaGroup):
    msg_id = group.send_execute("import time\nstarted = 1\ntime.sleep(30)\nfinished = 1", target=2)
    wait_for_execute_input(group, 2, msg_id)
    time.sleep(0.2)
    t0 = time.monotonic()
    reply = group.control(2, "interrupt_request", {})
    assert reply["content"]["status"] == "ok"
    result = group.collect(msg_id, group.alive_ids(), target=2)
    assert time.monotonic() - t0 < 5
    assert result.reply(2)["content"]["ename"] == "KeyboardInterrupt"
    assert notebookos_meta(result.reply(1))["executor_status"] == "error"
    after = group.execute("print(started, 'finished' in globals())", target=3)
    assert after.stdout() == "1 False\n"
    # the traceback is a plain kernel's: it ends at the cell's line, not in the replica's
    # SIGINT handler (kernel/interrupt_traceback.py)
    shown = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(result.reply(2)["content"]["traceback"]))
    assert "time.sleep(30)" in shown
    assert "_on_sigint" not in shown and "replica.py" not in shown, shown


def test_unsigned_and_malformed_messages_are_dropped_without_a_crash(group: ReplicaGroup):
    replica = group.replicas[1]
    info = json.loads(replica.connection_file.read_text())
    context = zmq.Context.instance()
    sock = context.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(f"tcp://127.0.0.1:{info['shell_port']}")
    try:
        sock.send_multipart([b"garbage"])
        sock.send_multipart([b"<IDS|MSG>", b"not-a-signature", b"{}", b"{}", b"{}", b"{}"])
        forged = Session(key=b"wrong key", signature_scheme="hmac-sha256")
        forged.send(sock, forged.msg("execute_request", {"code": "hacked = 1"}))
        signed = Session(key=group.key.encode(), signature_scheme="hmac-sha256")
        signed.send(sock, signed.msg("execute_request", {"no_code": True}))
        signed.send(sock, signed.msg("yield_request", "not a dict"))
        time.sleep(0.5)
    finally:
        sock.close()
    assert replica.alive
    result = group.execute("print('hacked' in globals())", target=1)
    assert result.stdout() == "False\n", result.summary()


def test_gpu_device_ids_are_exposed_to_the_cell_and_released_after(group: ReplicaGroup):
    pytest.importorskip("notebookos.kernel.gpu_binding")
    cell = "from notebookos.kernel.gpu_binding import assigned_gpus\nprint(assigned_gpus())"
    result = group.execute(cell, target=1, metadata={"gpu_device_ids": [2, 5]})
    assert result.stdout() == "(2, 5)\n", result.summary()
    after = group.execute("print(assigned_gpus())", target=1)
    assert after.stdout() == "()\n"


@pytest.mark.gpu
def test_torch_state_is_on_the_assigned_gpu_during_the_cell_and_on_host_after(
    group: ReplicaGroup,
):
    torch = require_torch()
    pytest.importorskip("notebookos.kernel.gpu_binding")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    group.execute("import torch\ngpu_net = torch.nn.Linear(2, 2)", target=1)
    during = group.execute("print(next(gpu_net.parameters()).device)", target=1,
                           metadata={"gpu_device_ids": [0]})
    assert during.stdout() == "cuda:0\n"
    after = group.execute("print(next(gpu_net.parameters()).device)", target=2)
    assert after.stdout() == "cpu\n"


def test_interrupt_sent_to_every_replica_stops_only_the_running_cell(group: ReplicaGroup):
    group.execute("import time", target=1)
    slow = group.send_execute("time.sleep(20)\nslow_done = True", target=1)
    queued = group.send_execute("queued_ran = True", target=1)  # waits for the slow cell
    wait_for_execute_input(group, 1, slow)
    time.sleep(0.2)
    for rid in group.alive_ids():  # standbys and the waiting request ignore it, nobody dies
        assert group.control(rid, "interrupt_request", {})["content"]["status"] == "ok"
    first = group.collect(slow, group.alive_ids(), target=1)
    assert first.reply(1)["content"]["ename"] == "KeyboardInterrupt", first.summary()
    second = group.collect(queued, group.alive_ids(), target=None)
    assert second.reply(1)["content"]["status"] == "ok", second.summary()
    assert all(group.replicas[rid].alive for rid in (1, 2, 3))
    after = group.execute("print('slow_done' in globals(), queued_ran)", target=2)
    assert after.stdout() == "False True\n", after.summary()



def test_replicas_offer_no_kernel_subshells_and_run_top_level_await(group: ReplicaGroup):
    """Subshells would run cells concurrently beside the group's elections: a replica does not
    advertise them, and a top-level ``await`` cell (ipykernel's async path) still runs."""
    client = group.replicas[1].client
    msg_id = client.kernel_info()
    reply = group._wait_reply(client.get_shell_msg, msg_id, 30)
    assert "kernel subshells" not in reply["content"].get("supported_features", [])
    result = group.execute("import asyncio\nawait asyncio.sleep(0.01)\nslept = 1", target=1)
    assert result.reply(1)["content"]["status"] == "ok", result.summary()
    assert group.execute("print(slept)", target=2).stdout() == "1\n"


def test_history_stays_in_memory_and_still_answers_history_magic(group: ReplicaGroup):
    group.execute("history_marker = 41", target=1)
    result = group.execute(
        "hm = get_ipython().history_manager\n"
        "print(hm.hist_file, hasattr(hm, 'save_thread') and hm.save_thread is not None)\n"
        "get_ipython().run_line_magic('history', '')", target=1)
    assert result.executor() == 1, result.summary()
    lines = result.stdout().splitlines()
    assert lines[0] == ":memory: False", lines  # no sqlite file, no writer thread
    assert "history_marker = 41" in lines[1:], lines


def test_the_replicas_own_warnings_stay_out_of_the_users_cell(group: ReplicaGroup):
    """pysyncobj's and NotebookOS's loggers write to the replica's log, not into the running
    cell's stderr (a paused replica's Raft warning showed in a user's output); the user's own
    logging still shows in the notebook, as with ipykernel."""
    result = group.execute(
        "import logging\n"
        "logging.getLogger('pysyncobj').critical('raft-internal-warning')\n"
        "logging.getLogger('notebookos.kernel.raft_log').warning('notebookos-internal-warning')\n"
        "logging.getLogger('my_analysis').warning('the-users-own-warning')\n", target=1)
    assert result.executor() == 1, result.summary()
    assert "the-users-own-warning" in result.stderr()
    assert "internal-warning" not in result.stderr() + result.stdout()
    log = group.replicas[1].log_tail(20000)
    assert "raft-internal-warning" in log and "notebookos-internal-warning" in log, log
