"""Bad input never harms a daemon: hypothesis-made gRPC requests for every method of both services
(and bytes that are not requests at all), and bad or odd Jupyter messages to a kernel's front,
against a real cluster with a running kernel. Afterwards every daemon and replica runs (same
pids), hosts, accounting and the kernel are as before, and the kernel still runs cells with its
namespace intact.

``NOTEBOOKOS_FUZZ_EXAMPLES`` sets the examples per fuzzer (default 150: well under a minute);
benchmarks/fuzz.py runs long campaigns."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from sched_cluster import Cluster, result_text, run_cell

from notebookos.testing import fuzz
from notebookos.testing.credentials import connect, join_token_metadata

pytestmark = pytest.mark.timeout(240)

EXAMPLES = int(os.environ.get("NOTEBOOKOS_FUZZ_EXAMPLES", "150"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))


class Target:
    def __init__(self, cluster: Cluster, kernel_id: str, kc) -> None:  # noqa: ANN001
        self.cluster = cluster
        self.kernel_id = kernel_id
        self.kc = kc
        self.hosts = {h.host_id: h.address for h in cluster.status().hosts}
        self.gs = connect(cluster.gs_address)
        self.ls = {h: connect(a) for h, a in self.hosts.items()}
        self.token = join_token_metadata()

    def settled(self) -> dict:
        return {**fuzz.settled(self.gs, self.ls, self.kernel_id),
                "daemons": [p.poll() for p in self.cluster.procs]}

    def close(self) -> None:
        self.gs.close()
        for channel in self.ls.values():
            channel.close()


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    cluster = Cluster(Path(tmp_path_factory.mktemp("fuzz")))
    try:
        cluster.start_gs()
        for i in range(3):
            cluster.start_ls(f"host-{i}")
        cluster.wait_hosts(3)
        kernel_id, kc = cluster.start_kernel(gpus=1)
        assert run_cell(kc, "x = 41")["reply"]["content"]["status"] == "ok"
        made = Target(cluster, kernel_id, kc)
        yield made
        made.close()
    finally:
        cluster.close()


def test_grpc_requests_from_hypothesis_harm_no_daemon(target: Target) -> None:
    before = target.settled()
    known = frozenset([target.kernel_id, *target.hosts])
    tally = fuzz.Tally()

    @FUZZ
    @given(call=fuzz.calls(target.kernel_id, known))
    def one(call: fuzz.Call) -> None:
        channel = target.gs if call.service == "gs" else target.ls[sorted(target.ls)[0]]
        code = fuzz.send(channel, call.service, call, target.token)
        tally.codes[code.name] += 1
        why = fuzz.judge(call, code)
        assert why is None, why

    one()
    for call in fuzz.oversize_calls():
        channel = target.gs if call.service == "gs" else target.ls[sorted(target.ls)[0]]
        code = fuzz.send(channel, call.service, call, target.token)
        tally.codes[code.name] += 1
        assert fuzz.judge(call, code) is None, (call, code)
    print(f"gRPC fuzz: {tally.tried} requests, answers {dict(tally.codes)}")
    assert tally.tried >= EXAMPLES
    assert target.settled() == before
    assert result_text(run_cell(target.kc, "x + 1")) == "42"


def test_bad_jupyter_messages_to_the_front_harm_nothing(target: Target) -> None:
    before = target.settled()
    dropped_before = target.cluster.kernel(target.kernel_id).dropped_messages
    info = target.kc.get_connection_info()  # status answers carry no key: the client's has it
    ports = {name: info[f"{name}_port"] for name in ("shell", "control", "stdin", "hb", "iopub")}
    context = zmq.Context()
    sockets = {}
    for name, port in ports.items():
        sock = context.socket(zmq.XSUB if name == "iopub" else zmq.DEALER)
        sock.linger = 0
        sock.sndtimeo = 5000
        sock.connect(f"tcp://{info['ip']}:{port}")
        sockets[name] = sock
    must_drop = 0
    sent = 0
    try:
        @FUZZ
        @given(item=fuzz.zmq_inputs(target.kc.session.key))
        def one(item: fuzz.ZmqInput) -> None:
            nonlocal must_drop, sent
            sockets[item.channel].send_multipart(item.frames)
            sent += 1
            must_drop += item.must_drop and item.channel in ("shell", "control", "stdin")

        one()
        deadline = time.monotonic() + 30
        while target.cluster.kernel(target.kernel_id).dropped_messages - dropped_before \
                < must_drop and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        for sock in sockets.values():
            sock.close()
        context.term()
    dropped = target.cluster.kernel(target.kernel_id).dropped_messages - dropped_before
    print(f"ZMQ fuzz: {sent} messages, {must_drop} untrusted, {dropped} dropped")
    assert sent >= EXAMPLES
    assert dropped >= must_drop
    assert target.kc.kernel_info(reply=True, timeout=30)["content"]["status"] == "ok"
    assert result_text(run_cell(target.kc, "x + 2")) == "43"
    assert target.settled() == before


def test_status_codes_are_what_the_docs_promise(target: Target) -> None:
    """A spot check of the judge against known answers (so a fuzz run cannot pass vacuously)."""
    token_less = fuzz.Call("gs", "RegisterHost", b"", token=False)
    assert fuzz.send(target.gs, "gs", token_less, target.token) == \
        grpc.StatusCode.UNAUTHENTICATED
    garbage = fuzz.Call("ls", "GetHostStatus", b"\xff\xff\xff", typed=False)
    code = fuzz.send(target.ls[sorted(target.ls)[0]], "ls", garbage, target.token)
    assert code == grpc.StatusCode.INTERNAL and fuzz.judge(garbage, code) is None
    assert fuzz.judge(fuzz.Call("gs", "ListKernels", b""), grpc.StatusCode.UNKNOWN)
