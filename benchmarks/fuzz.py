"""A long fuzz campaign against a real cluster: what tests/schedulers/test_fuzz.py does with a few
hundred inputs, here with thousands (docs/security.md, *Bad input*).

Starts a Global Scheduler and three Local Schedulers (virtual GPUs, mutual TLS) and one kernel
with three replicas, then sends hypothesis-made hostile gRPC requests to both services and bad or
odd Jupyter messages to the kernel's front (``notebookos.testing.fuzz``). Afterwards it checks
that every daemon and replica still runs with the same pid, that hosts, GPU accounting and the
kernel are as before, and that the kernel runs a cell with its namespace intact.

Keys: ``grpc_requests``, ``grpc_codes``, ``grpc_failures``, ``zmq_messages``, ``zmq_untrusted``,
``zmq_dropped``, ``daemons_alive``, ``state_unchanged``, ``kernel_ok``, ``seconds``.
Usage: ``python benchmarks/fuzz.py [--json] [--examples N] [--seed S]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path

import zmq
from hypothesis import HealthCheck, given, seed, settings
from jupyter_client import BlockingKernelClient
from routing import Daemons

from notebookos.config import load_config
from notebookos.proto import common_pb2, global_scheduler_pb2
from notebookos.proto.convert import connection_info_to_dict
from notebookos.security import JoinTokens, secure_channel
from notebookos.testing import fuzz, smoke


def run_cell(kc: BlockingKernelClient, code: str) -> str:
    out: list[str] = []

    def hook(msg: dict) -> None:
        if msg["msg_type"] == "execute_result":
            out.append(msg["content"]["data"]["text/plain"])

    reply = kc.execute_interactive(code, timeout=60, output_hook=hook)
    return out[0] if out and reply["content"]["status"] == "ok" else repr(reply["content"])


def campaign(examples: int, seed_value: int) -> dict:
    result: dict = {"examples": examples, "seed": seed_value}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="nbos-fuzz-") as tmp:
        daemons = Daemons(Path(tmp))
        try:
            stub = daemons.start()
            config = load_config(env=daemons.security)
            key = uuid.uuid4().hex
            kernel_id = f"fuzz-{uuid.uuid4().hex[:6]}"
            response = stub.StartKernel(global_scheduler_pb2.StartKernelRequest(
                kernel_id=kernel_id, key=key,
                resources=common_pb2.ResourceSpec(millicpus=100, memory_mb=128, gpus=1)),
                timeout=120)
            kc = BlockingKernelClient()
            kc.load_connection_info(connection_info_to_dict(response.connection))
            kc.start_channels()
            kc.wait_for_ready(timeout=60)
            assert run_cell(kc, "x = 41\nx") == "41"
            gs_address = f"127.0.0.1:{daemons.port}"
            status = stub.GetClusterStatus(global_scheduler_pb2.GetClusterStatusRequest(),
                                           timeout=10)
            gs = secure_channel(config, gs_address)
            hosts = {h.host_id: secure_channel(config, h.address) for h in status.hosts}
            token = JoinTokens(config).metadata()
            before = fuzz.settled(gs, hosts, kernel_id)
            known = frozenset([kernel_id, *hosts])
            tally = fuzz.Tally()
            first_host = hosts[sorted(hosts)[0]]
            hypothesis_settings = settings(max_examples=examples, deadline=None,
                                           database=None, suppress_health_check=list(HealthCheck))

            @seed(seed_value)
            @hypothesis_settings
            @given(call=fuzz.calls(kernel_id, known))
            def grpc_one(call: fuzz.Call) -> None:
                code = fuzz.send(gs if call.service == "gs" else first_host, call.service, call,
                                 token)
                tally.codes[code.name] += 1
                why = fuzz.judge(call, code)
                if why is not None:
                    tally.failures.append(why)

            t0 = time.monotonic()
            grpc_one()
            for call in fuzz.oversize_calls():
                code = fuzz.send(gs if call.service == "gs" else first_host, call.service, call,
                                 token)
                tally.codes[code.name] += 1
                if fuzz.judge(call, code) is not None:
                    tally.failures.append(fuzz.judge(call, code))
            result.update(grpc_requests=tally.tried, grpc_codes=dict(tally.codes),
                          grpc_failures=tally.failures[:20],
                          grpc_seconds=round(time.monotonic() - t0, 1))

            def dropped() -> int:
                return stub.GetKernelStatus(global_scheduler_pb2.GetKernelStatusRequest(
                    kernel_id=kernel_id), timeout=10).dropped_messages

            dropped_before = dropped()
            info = kc.get_connection_info()
            context = zmq.Context()
            sockets = {}
            for name in ("shell", "control", "stdin", "hb", "iopub"):
                sock = context.socket(zmq.XSUB if name == "iopub" else zmq.DEALER)
                sock.linger = 0
                sock.sndtimeo = 5000
                sock.connect(f"tcp://{info['ip']}:{info[f'{name}_port']}")
                sockets[name] = sock
            counts = {"sent": 0, "untrusted": 0}

            @seed(seed_value)
            @hypothesis_settings
            @given(item=fuzz.zmq_inputs(key.encode()))
            def zmq_one(item: fuzz.ZmqInput) -> None:
                sockets[item.channel].send_multipart(item.frames)
                counts["sent"] += 1
                counts["untrusted"] += item.must_drop and item.channel != "hb" \
                    and item.channel != "iopub"

            t0 = time.monotonic()
            zmq_one()
            deadline = time.monotonic() + 60
            while dropped() - dropped_before < counts["untrusted"] and \
                    time.monotonic() < deadline:
                time.sleep(0.5)
            for sock in sockets.values():
                sock.close()
            context.term()
            result.update(zmq_messages=counts["sent"], zmq_untrusted=counts["untrusted"],
                          zmq_dropped=dropped() - dropped_before,
                          zmq_seconds=round(time.monotonic() - t0, 1))
            result["kernel_ok"] = run_cell(kc, "x + 1") == "42" and \
                kc.kernel_info(reply=True, timeout=30)["content"]["status"] == "ok"
            after = fuzz.settled(gs, hosts, kernel_id)
            result["state_unchanged"] = after == before
            result["daemons_alive"] = all(p.poll() is None for p in daemons.procs)
            kc.stop_channels()
            gs.close()
            for channel in hosts.values():
                channel.close()
        finally:
            daemons.stop()
    result["seconds"] = round(time.monotonic() - started, 1)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--examples", type=int, default=2000, help="inputs per fuzzer")
    parser.add_argument("--seed", type=int, default=12, help="hypothesis seed")
    args = smoke.parse_args(parser, examples=10)
    result = campaign(args.examples, args.seed)
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k}: {v}")
    ok = (result.get("daemons_alive") and result.get("state_unchanged") and
          result.get("kernel_ok") and not result.get("grpc_failures") and
          result.get("zmq_dropped", 0) >= result.get("zmq_untrusted", 1))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
