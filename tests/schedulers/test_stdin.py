"""``input()`` in a notebook cell, through the Global Scheduler, on real replicas: the front
connects the executor's stdin when the cell is sent (front_replicas.py), and the replica's
``input_request`` waits for that connection instead of being dropped (kernel/stdin_socket.py);
a cell that cannot read input says so."""

from __future__ import annotations

import pytest
from sched_cluster import make_cluster_fixture, run_seen, stream_text

make_cluster = make_cluster_fixture
pytestmark = pytest.mark.timeout(180)


def _cell_with_input(kc, code: str, answer: str) -> dict:  # noqa: ANN001
    msg_id = kc.execute(code, allow_stdin=True)
    request = kc.get_stdin_msg(timeout=30)
    assert request["msg_type"] == "input_request"
    assert request["parent_header"]["msg_id"] == msg_id
    kc.input(answer)
    while True:
        reply = kc.get_shell_msg(timeout=30)
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply


def test_input_in_a_cell_reaches_the_client_and_its_answer_the_cell(make_cluster) -> None:  # noqa: ANN001
    cluster = make_cluster()
    cluster.start_gs()
    for i in range(3):
        cluster.start_ls(f"host-{i}")
    cluster.wait_hosts(3)
    _, kc = cluster.start_kernel(gpus=0)
    # the first cell asks at once: the stdin connection is made as the cell is sent
    reply = _cell_with_input(kc, "name = input('who? ')", "ada")
    assert reply["content"]["status"] == "ok", reply["content"]
    reply = _cell_with_input(kc, "again = input('again? ')", "grace")
    assert reply["content"]["status"] == "ok", reply["content"]
    assert stream_text(run_seen(kc, "print(name, again)"), "stdout").strip() == "ada grace"
    # a cell that may not read input gets ipykernel's error, not a hang
    msg_id = kc.execute("input()", allow_stdin=False)
    reply = kc.get_shell_msg(timeout=30)
    assert reply["parent_header"]["msg_id"] == msg_id
    assert reply["content"]["status"] == "error"
    assert reply["content"]["ename"] == "StdinNotImplementedError"
