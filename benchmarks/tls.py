"""What mutual TLS and the join token cost a gRPC call, against plain gRPC in the same run.

Two gRPC servers in this process serve the same small Global Scheduler servicer: one as every
NotebookOS daemon now serves (``add_secure_port``: mutual TLS with the cluster's files, and the
join token interceptor), one with a plain port (the baseline, as before TLS). Calls alternate
between the two, so both see the same machine load:

- ``status``: ``GetClusterStatus`` on a warm channel (what every client call costs);
- ``heartbeat``: ``Heartbeat`` on a warm channel, with the join token checked on the TLS side
  (what a Local Scheduler's calls cost);
- ``connect``: a new channel and its first call (TCP + handshake: what a new client, such as
  ``notebookos status`` or a new host link, pays once).

Keys: ``<kind>_plain_p50_ms``, ``<kind>_tls_p50_ms``, ``<kind>_tls_ratio`` (TLS p50 / plain p50)
and ``<kind>_tls_extra_ms`` for each kind, plus p99s.
Usage: ``python benchmarks/tls.py [--json] [--calls N] [--connects N]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from concurrent import futures
from pathlib import Path

import grpc

from notebookos.config import load_config
from notebookos.proto import global_scheduler_pb2, global_scheduler_pb2_grpc
from notebookos.security import (
    JoinTokenInterceptor,
    JoinTokens,
    add_secure_port,
    ensure_cluster_credentials,
    secure_channel,
)
from notebookos.testing import smoke


class Servicer(global_scheduler_pb2_grpc.GlobalSchedulerServicer):
    def GetClusterStatus(self, request, context):  # noqa: N802
        return global_scheduler_pb2.ClusterStatus(policy="notebookos", gpus_total=8)

    def Heartbeat(self, request, context):  # noqa: N802
        return global_scheduler_pb2.HeartbeatResponse()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def timed(fn) -> float:  # noqa: ANN001
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--calls", type=int, default=2000, help="warm calls per kind and side")
    parser.add_argument("--connects", type=int, default=200, help="new channels per side")
    args = smoke.parse_args(parser, calls=20, connects=3)
    with tempfile.TemporaryDirectory(prefix="nbos-tls-") as tmp:
        config = load_config(env={}, overrides={"cluster.state_dir": str(Path(tmp))})
        ensure_cluster_credentials(config)
        tls_server = grpc.server(futures.ThreadPoolExecutor(4),
                                 interceptors=[JoinTokenInterceptor(config)])
        plain_server = grpc.server(futures.ThreadPoolExecutor(4))
        for server in (tls_server, plain_server):
            global_scheduler_pb2_grpc.add_GlobalSchedulerServicer_to_server(Servicer(), server)
        tls_port = add_secure_port(tls_server, config, "127.0.0.1:0")
        plain_port = plain_server.add_insecure_port("127.0.0.1:0")  # the baseline
        tls_server.start()
        plain_server.start()
        token = JoinTokens(config).metadata()
        tls_target, plain_target = f"127.0.0.1:{tls_port}", f"127.0.0.1:{plain_port}"

        def tls_channel() -> grpc.Channel:
            return secure_channel(config, tls_target)

        def plain_channel() -> grpc.Channel:
            return grpc.insecure_channel(plain_target)

        status = global_scheduler_pb2.GetClusterStatusRequest()
        beat = global_scheduler_pb2.HeartbeatRequest(host_id="host-0", sequence=1)
        samples: dict[str, list[float]] = {}
        try:
            with tls_channel() as tc, plain_channel() as pc:
                tls_stub = global_scheduler_pb2_grpc.GlobalSchedulerStub(tc)
                plain_stub = global_scheduler_pb2_grpc.GlobalSchedulerStub(pc)
                for _ in range(200):  # warm up both
                    tls_stub.GetClusterStatus(status, timeout=10)
                    plain_stub.GetClusterStatus(status, timeout=10)
                for kind, tls_call, plain_call in (
                        ("status", lambda: tls_stub.GetClusterStatus(status, timeout=10),
                         lambda: plain_stub.GetClusterStatus(status, timeout=10)),
                        ("heartbeat", lambda: tls_stub.Heartbeat(beat, timeout=10, metadata=token),
                         lambda: plain_stub.Heartbeat(beat, timeout=10))):
                    tls_ms, plain_ms = [], []
                    for _ in range(args.calls):
                        tls_ms.append(timed(tls_call))
                        plain_ms.append(timed(plain_call))
                    samples[f"{kind}_tls"], samples[f"{kind}_plain"] = tls_ms, plain_ms
            tls_ms, plain_ms = [], []
            for _ in range(args.connects):
                for make, out in ((tls_channel, tls_ms), (plain_channel, plain_ms)):
                    def first_call(make=make) -> None:  # noqa: ANN001
                        with make() as channel:
                            global_scheduler_pb2_grpc.GlobalSchedulerStub(
                                channel).GetClusterStatus(status, timeout=10)
                    out.append(timed(first_call))
            samples["connect_tls"], samples["connect_plain"] = tls_ms, plain_ms
        finally:
            tls_server.stop(None)
            plain_server.stop(None)
    result: dict = {"calls": args.calls, "connects": args.connects}
    for kind in ("status", "heartbeat", "connect"):
        tls, plain = samples[f"{kind}_tls"], samples[f"{kind}_plain"]
        result[f"{kind}_plain_p50_ms"] = round(statistics.median(plain), 3)
        result[f"{kind}_tls_p50_ms"] = round(statistics.median(tls), 3)
        result[f"{kind}_plain_p99_ms"] = round(percentile(plain, 0.99), 3)
        result[f"{kind}_tls_p99_ms"] = round(percentile(tls, 0.99), 3)
        result[f"{kind}_tls_ratio"] = round(statistics.median(tls) / statistics.median(plain), 2)
        result[f"{kind}_tls_extra_ms"] = round(statistics.median(tls) -
                                               statistics.median(plain), 3)
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k}: {v}")


if __name__ == "__main__":
    main()
