"""Fault campaign: does a notebook's state survive random faults of a local cluster?

A cluster started by ``notebookos up`` itself (Global Scheduler, Local Schedulers, JupyterLab; a
daemon that dies is restarted by ``notebookos up``), one notebook driven through Jupyter Server's
kernel websocket the way JupyterLab drives it (a session created over REST, the
``v1.kernel.websocket.jupyter.org`` protocol, ``kernel_info`` first), and state made of small values
(a counter, a dict, a list) and large objects (a numpy array over the sync threshold, a torch model
with its SGD optimizer, whose parameters they share).

Every cell prints a digest of the whole state before and after it changes it. After each fault the
next cell must see exactly the digest the previous cell left, or, when the kernel announces that it
was rebuilt from the checkpoint taken after cell [N] (a Raft majority was lost), exactly the digest
cell [N] left. Anything else is a *silent loss*; a cell that fails or never answers is an *error*.

Faults, drawn at random (seeded) between cells:

- ``kill-executor``: SIGKILL of the replica that ran the last cell (the next cell's sticky pick);
- ``kill-standby``: SIGKILL of another replica;
- ``kill-local-scheduler``: SIGKILL of the Local Scheduler of a host holding a replica (its
  replicas live on; ``notebookos up`` restarts it and it takes them back);
- ``kill-global-scheduler``: SIGKILL of the Global Scheduler (``notebookos up`` restarts it);
- ``hang-host``: SIGSTOP of a host's Local Scheduler and everything it runs, SIGCONT 10 s later;
- ``burst-global-scheduler``: SIGKILL of the Global Scheduler 5 times in a row, each as soon as it
  answers again plus 1-3 s (issue 33: a crash loop must never take JupyterLab down);
- ``double``: two of the first five, on different hosts, the second 0.1-1 s after the first.

With ``--hibernate N`` (the cluster runs with ``global_scheduler.hibernate_after_s`` =
``--hibernate-after``, default 3 s), N more faults are drawn from the hibernation kinds (issue 34).
Each first waits until the kernel is hibernated (no replica, state ``hibernated``; not within
``hibernate_after_s`` + 120 s is an error: a kernel that never hibernates again); the next cell
then wakes it from its checkpoint, and its digest must be the one the last cell left:

- ``hibernate-wake``: no fault, the cell wakes it;
- ``kill-global-scheduler-asleep`` / ``kill-local-scheduler-asleep``: SIGKILL of the Global
  Scheduler / of a random host's Local Scheduler while the kernel sleeps, then the cell;
- ``kill-global-scheduler-waking``: the cell is sent, the Global Scheduler is killed 0.1-1 s later
  (mid-wake);
- ``kill-local-scheduler-waking`` / ``kill-replica-waking``: the cell is sent; as soon as the
  first woken replica has a pid, its Local Scheduler / the replica itself is killed;
- ``kill-executor-after-wake``: the cell wakes it, then the executor is killed and one more cell
  runs (judged like ``kill-executor``).

With hibernation on, a kernel may also fall asleep while the campaign waits for full redundancy
(a hibernated kernel counts as whole: its state is in its checkpoint); before any other fault it
is woken by one cell, judged and reported as ``wake-before-fault`` only when it is not intact.

Throughout, JupyterLab's ``/api/status`` is asked every 0.5 s: the summary says how many probes
failed and the longest outage (JupyterLab must stay reachable whatever fails behind it).

The next cell is sent 0-0.3 s after the fault (before any replacement has joined). Single faults
wait until the kernel is whole again (three live replicas on distinct hosts, every host back)
before the next one. Reported per fault kind: cells intact, rollbacks announced, silent losses,
errors, time from the fault to the next cell's reply (p50/p99), time from the fault back to full
redundancy (p50/p99).

Usage::

    python benchmarks/chaos.py [--faults 100] [--double 30] [--seed 1] [--hosts 4]
        [--big-mib 16] [--no-torch] [--round-robin] [--hibernate N] [--hibernate-after S]
        [--json] [--keep DIR]
    python benchmarks/chaos.py --table-of DIR

``--round-robin`` draws the single faults in turn instead of at random (every kind at least once in
a short run; ``make test`` runs it that way). Exit status 1 when a silent loss or an error occurred.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

from notebookos.proto import common_pb2
from notebookos.testing import smoke
from notebookos.testing.up_session import CellResult, Notebook, UpCluster

# the kinds a double fault is drawn from (a burst is already several faults)
DOUBLE_KINDS = ("kill-executor", "kill-standby", "kill-local-scheduler", "kill-global-scheduler",
                "hang-host")
SINGLE_KINDS = (*DOUBLE_KINDS, "burst-global-scheduler")
# faults around hibernation (``--hibernate N``): each waits until the kernel hibernated
HIBERNATE_KINDS = ("hibernate-wake", "kill-global-scheduler-asleep", "kill-local-scheduler-asleep",
                   "kill-global-scheduler-waking", "kill-local-scheduler-waking",
                   "kill-replica-waking", "kill-executor-after-wake")
KINDS = (*SINGLE_KINDS, "double", *HIBERNATE_KINDS, "wake-before-fault")
HIBERNATE_TIMEOUT_S = 120.0  # beyond hibernate_after_s: "a kernel that never hibernates again"
BURST_KILLS = 5
LAB_PROBE_S = 0.5
HANG_S = 10.0
WHOLE_TIMEOUT_S = 300.0
# a rebuild from the store: "... rebuilt from the checkpoint taken after cell [N]. Work after
# that cell is lost." or, from the freshest survivor's state, "... rebuilt from the checkpoint
# of cell [N], which holds every cell replica R ... had applied."
ROLLBACK = re.compile(r"(?:rebuilt|woke) from the checkpoint (?:taken after|of) cell \[(\d+)\]")
CHAOS_LINE = re.compile(r"^CHAOS (\S+) (\S+)$", re.M)


# -- the notebook's state --------------------------------------------------------------------

def setup_code(big_mib: int, use_torch: bool) -> str:
    rows = max(1, big_mib * (1 << 20) // (1024 * 8))
    code = ("import numpy as np\n"
            "counter = 0\nsmall = {'name': 'chaos'}\nitems = []\n"
            f"big = np.zeros(({rows}, 1024), dtype=np.float64)\n")
    if use_torch:
        code += ("import torch\ntorch.manual_seed(0)\n"
                 "model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), "
                 "torch.nn.Linear(64, 8))\n"
                 "opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)\n")
    return code + _digest_code(use_torch) + "print('CHAOS', '-', _chaos_digest())\n"


def _digest_code(use_torch: bool) -> str:
    """A function (redefined by every cell) that hashes the whole state, names it needs included:
    a missing name fails the cell instead of hiding in the digest."""
    code = ("def _chaos_digest():\n"
            "    import hashlib\n"
            "    h = hashlib.sha256()\n"
            "    h.update(repr((counter, sorted(small.items()), items, big.shape,"
            " str(big.dtype))).encode())\n"
            "    h.update(big.tobytes())\n")
    if use_torch:
        code += ("    for k, v in sorted(model.state_dict().items()):\n"
                 "        h.update(k.encode()); h.update(v.detach().cpu().numpy().tobytes())\n"
                 "    state = opt.state_dict()\n"
                 "    for i, st in sorted(state['state'].items()):\n"
                 "        for k, v in sorted(st.items()):\n"
                 "            h.update(f'{i}/{k}'.encode())\n"
                 "            h.update(v.detach().cpu().numpy().tobytes() if hasattr(v, 'detach')"
                 " else repr(v).encode())\n"
                 "    h.update(repr([{k: v for k, v in g.items() if k != 'params'}"
                 " for g in state['param_groups']]).encode())\n"
                 "    # the optimizer must still update the model's own parameters\n"
                 "    shared = all(p is q for p, q in zip(opt.param_groups[0]['params'],"
                 " model.parameters()))\n"
                 "    h.update(b'shared' if shared else b'COPIED')\n")
    return code + "    return h.hexdigest()[:16]\n"


def cell_code(use_torch: bool) -> str:
    code = (_digest_code(use_torch) + "_before = _chaos_digest()\n"
            "counter += 1\nsmall[f'k{counter}'] = counter * 7\nitems.append(counter)\n"
            "big[counter % big.shape[0]] += counter\n")
    if use_torch:
        code += ("x = torch.full((8, 64), float(counter % 5))\n"
                 "loss = model(x).pow(2).mean()\nopt.zero_grad()\nloss.backward()\nopt.step()\n")
    return code + "print('CHAOS', _before, _chaos_digest())\n"


PROBE = "print('CHAOS', '-', _chaos_digest())\n"


# -- faults ----------------------------------------------------------------------------------

@dataclass
class Fault:
    kind: str
    detail: str
    host: str | None  # the host it touched (a second fault goes elsewhere)


class Injector:
    def __init__(self, cluster: UpCluster, kernel_id: str, rng: random.Random) -> None:
        self.cluster = cluster
        self.kernel_id = kernel_id
        self.rng = rng
        self._hangs: list[threading.Timer] = []

    def inject(self, kind: str, status: common_pb2.KernelStatus, avoid: set[str]) -> Fault:
        replicas = [r for r in status.replicas if r.host_id not in avoid and r.pid > 0]
        if not replicas:
            raise LookupError("no replica outside the hosts already touched")
        executor = next((r for r in replicas if r.replica_id == status.executor_replica_id), None)
        if kind == "kill-executor" and executor is None:
            kind = "kill-standby"  # the executor's host was touched by the first fault
        if kind == "kill-executor":
            os.kill(executor.pid, signal.SIGKILL)
            return Fault(kind, f"replica {executor.replica_id} on {executor.host_id}",
                         executor.host_id)
        if kind == "kill-standby":
            standby = self.rng.choice([r for r in replicas if r is not executor] or replicas)
            os.kill(standby.pid, signal.SIGKILL)
            return Fault(kind, f"replica {standby.replica_id} on {standby.host_id}",
                         standby.host_id)
        if kind == "kill-global-scheduler":
            self.cluster.global_scheduler().send_signal(signal.SIGKILL)
            return Fault(kind, "global scheduler", None)
        # A host of notebookos up, whose processes the campaign knows (and whose daemon up
        # restarts: issue 33's fault); the autoscaler's own hosts (auto-...) are the Global
        # Scheduler's children, not up's: killed, they stay gone.
        supervised = [r for r in replicas if not r.host_id.startswith("auto-")]
        victim = self.rng.choice(supervised or replicas)
        if kind == "kill-local-scheduler":
            ls = self.cluster.local_scheduler(victim.host_id)
            ls.send_signal(signal.SIGKILL)
            return Fault(kind, f"{victim.host_id} (pid {ls.pid}, holding replica "
                               f"{victim.replica_id})", victim.host_id)
        if kind == "hang-host":
            procs = self.cluster.host_processes(victim.host_id)
            pids = [p.pid for p in procs]
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
            self.cluster.stopped_pids.extend(pids)
            timer = threading.Timer(HANG_S, self._resume, args=(pids,))
            timer.daemon = True
            timer.start()
            self._hangs.append(timer)
            return Fault(kind, f"{victim.host_id} ({len(pids)} processes) for {HANG_S:g} s",
                         victim.host_id)
        raise ValueError(f"unknown fault kind {kind!r}")

    async def burst(self) -> Fault:
        """Kill the Global Scheduler ``BURST_KILLS`` times, each once it serves again."""
        for kill in range(BURST_KILLS):
            self.cluster.global_scheduler().send_signal(signal.SIGKILL)
            if kill == BURST_KILLS - 1:
                break
            deadline = time.monotonic() + WHOLE_TIMEOUT_S
            await asyncio.sleep(0.2)
            while await asyncio.to_thread(self.cluster.host_count) < 0:
                if time.monotonic() > deadline:
                    raise RuntimeError("the Global Scheduler did not come back in a burst")
                await asyncio.sleep(0.1)
            await asyncio.sleep(self.rng.uniform(1.0, 3.0))
        return Fault("burst-global-scheduler", f"global scheduler killed {BURST_KILLS} times",
                     None)

    def _resume(self, pids: list[int]) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
            with contextlib.suppress(ValueError):
                self.cluster.stopped_pids.remove(pid)

    def hung(self) -> bool:
        return any(t.is_alive() for t in self._hangs)


# -- the campaign ----------------------------------------------------------------------------

class LabWatch:
    """Asks JupyterLab's ``/api/status`` every ``LAB_PROBE_S`` while the campaign runs."""

    def __init__(self, base: str, token: str) -> None:
        self.url = f"{base}/api/status"
        self.headers = {"Authorization": f"token {token}"}
        self.probes = 0
        self.failures = 0
        self.longest_outage_s = 0.0
        self._down_since: float | None = None

    async def run(self) -> None:
        from tornado.httpclient import AsyncHTTPClient, HTTPRequest

        client = AsyncHTTPClient()
        while True:
            self.probes += 1
            now = time.monotonic()
            try:
                await client.fetch(HTTPRequest(self.url, headers=self.headers,
                                               request_timeout=2.0))
                self._down_since = None
            except Exception:  # noqa: BLE001 - any failure is an outage
                self.failures += 1
                if self._down_since is None:
                    self._down_since = now
                self.longest_outage_s = max(self.longest_outage_s,
                                            time.monotonic() - self._down_since)
            await asyncio.sleep(LAB_PROBE_S)

    def summary(self) -> dict:
        return {"probes": self.probes, "failed": self.failures,
                "longest_outage_s": round(self.longest_outage_s, 2)}


@dataclass
class Outcome:
    kind: str
    detail: str
    verdict: str  # intact, rollback, silent-loss, error
    next_cell_s: float
    redundancy_s: float | None
    note: str = ""


@dataclass
class Campaign:
    outcomes: list[Outcome] = field(default_factory=list)
    setup_s: float = 0.0
    restarts: int = 0
    reconnects: int = 0
    lab: LabWatch | None = None

    def table(self) -> list[dict]:
        rows = []
        for kind in [*KINDS, "all"]:
            group = [o for o in self.outcomes if kind in ("all", o.kind)]
            if not group:
                continue
            nxt = [o.next_cell_s for o in group]
            red = [o.redundancy_s for o in group if o.redundancy_s is not None]
            rows.append({
                "kind": kind, "faults": len(group),
                "intact": sum(o.verdict == "intact" for o in group),
                "rollbacks_announced": sum(o.verdict == "rollback" for o in group),
                "silent_losses": sum(o.verdict == "silent-loss" for o in group),
                "errors": sum(o.verdict == "error" for o in group),
                "next_cell_p50_s": _pct(nxt, 50), "next_cell_p99_s": _pct(nxt, 99),
                "redundancy_p50_s": _pct(red, 50), "redundancy_p99_s": _pct(red, 99),
                "not_whole_again": sum(o.redundancy_s is None for o in group),
            })
        return rows

    def markdown(self) -> str:
        head = ("| fault | n | intact | rollbacks announced | silent losses | errors | "
                "next cell p50 / p99 (s) | back to 3 replicas p50 / p99 (s) |\n"
                "|---|---|---|---|---|---|---|---|\n")
        body = "".join(
            f"| {r['kind']} | {r['faults']} | {r['intact']} | {r['rollbacks_announced']} | "
            f"{r['silent_losses']} | {r['errors']} | {_fmt(r['next_cell_p50_s'])} / "
            f"{_fmt(r['next_cell_p99_s'])} | {_fmt(r['redundancy_p50_s'])} / "
            f"{_fmt(r['redundancy_p99_s'])}"
            + (f" ({r['not_whole_again']} never)" if r["not_whole_again"] else "") + " |\n"
            for r in self.table())
        return head + body


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))], 2)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


class Verifier:
    """Follows the digests: what each execution count left, what the last cell left."""

    def __init__(self) -> None:
        self.after: dict[int, str] = {}
        self.last = ""

    def record(self, result: CellResult) -> tuple[str, str]:
        """(verdict, note) for a cell run after a fault; updates the chain."""
        if result.status != "ok":
            return "error", f"{result.status}: {result.error} {result.stderr[-300:]}".strip()
        match = CHAOS_LINE.search(result.stdout)
        if match is None:
            return "error", f"no digest in the output: {result.stdout[-300:]!r}"
        before, after = match.groups()
        rollback = ROLLBACK.search(result.stderr)
        verdict, note = "intact", ""
        if rollback:
            count = int(rollback.group(1))
            wanted = self.after.get(count)
            if before == self.last:  # rebuilt with every cell: nothing was lost
                note = f"rebuilt from the checkpoint of cell [{count}], nothing lost"
            elif before == wanted:
                verdict, note = "rollback", f"rebuilt from the checkpoint of cell [{count}]"
            else:
                verdict = "silent-loss"
                note = (f"announced a rebuild from cell [{count}], whose state was {wanted}, "
                        f"but the cell saw {before}")
        elif before != self.last:
            verdict, note = "silent-loss", (f"expected {self.last}, saw {before}; "
                                            f"stderr: {result.stderr[-300:]!r}")
        self.accept(result.execution_count, after)
        return verdict, note

    def accept(self, count: int | None, digest: str) -> None:
        if count is not None:
            self.after[count] = digest
        self.last = digest


async def run_campaign(args: argparse.Namespace, workdir: Path,
                       progress: Callable[[Outcome], None]) -> Campaign:
    rng = random.Random(args.seed)
    campaign = Campaign()
    cluster = UpCluster(workdir, args.hosts)
    _ACTIVE.append(cluster)
    notebook: Notebook | None = None
    try:
        t0 = time.monotonic()
        await asyncio.to_thread(cluster.wait_up)
        campaign.lab = LabWatch(cluster.base, cluster.token)
        lab_task = asyncio.create_task(campaign.lab.run())
        notebook = Notebook(cluster.base, cluster.token)
        await notebook.open()
        verifier = Verifier()
        setup_source = setup_code(args.big_mib, args.torch)
        setup = await notebook.execute(setup_source)
        if setup.status != "ok" or not CHAOS_LINE.search(setup.stdout):
            raise RuntimeError(f"the setup cell failed: {setup.error} {setup.stderr[-2000:]}")
        verifier.accept(setup.execution_count, CHAOS_LINE.search(setup.stdout).group(2))
        code = cell_code(args.torch)
        for _ in range(2):  # warm: the executor is sticky, large objects are in the store
            verdict, note = verifier.record(await notebook.execute(code))
            if verdict != "intact":
                raise RuntimeError(f"a cell without any fault: {verdict}: {note}")
        if not await _wait_whole(cluster, notebook.kernel_id, None):
            raise RuntimeError("the kernel never had three replicas")
        campaign.setup_s = time.monotonic() - t0
        injector = Injector(cluster, notebook.kernel_id, rng)
        plan = _plan(args, rng)
        for kind in plan:
            outcomes = []
            if kind in HIBERNATE_KINDS:
                outcomes.append(await _hibernation_fault(kind, cluster, notebook, injector,
                                                         verifier, code, setup_source, rng,
                                                         args.hibernate_after))
            else:
                if args.hibernate_after > 0:
                    woken = await _wake_before(cluster, notebook, verifier, code, setup_source)
                    if woken is not None:
                        outcomes.append(woken)
                outcomes.append(await _one_fault(kind, cluster, notebook, injector, verifier,
                                                 code, setup_source, rng))
            for outcome in outcomes:
                campaign.outcomes.append(outcome)
                with open(workdir / "outcomes.jsonl", "a") as out:  # a cut-short run keeps it
                    out.write(json.dumps(asdict(outcome)) + "\n")
                progress(outcome)
            await asyncio.sleep(args.gap)
        campaign.restarts = cluster.restarts()
        campaign.reconnects = notebook.reconnects
        lab_task.cancel()
        return campaign
    finally:
        if notebook is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(notebook.close(), 60)
        await asyncio.to_thread(cluster.stop)
        _ACTIVE.remove(cluster)


def _plan(args: argparse.Namespace, rng: random.Random) -> list[str]:
    kinds = args.kinds or SINGLE_KINDS
    if args.round_robin:
        singles = [kinds[i % len(kinds)] for i in range(args.faults)]
        asleep = [HIBERNATE_KINDS[i % len(HIBERNATE_KINDS)] for i in range(args.hibernate)]
    else:
        singles = [rng.choice(kinds) for _ in range(args.faults)]
        asleep = [rng.choice(HIBERNATE_KINDS) for _ in range(args.hibernate)]
    plan = singles + ["double"] * args.double + asleep
    if not args.round_robin:
        rng.shuffle(plan)
    return plan


async def _one_fault(kind: str, cluster: UpCluster, notebook: Notebook, injector: Injector,
                     verifier: Verifier, code: str, setup: str, rng: random.Random) -> Outcome:
    status = cluster.kernel(notebook.kernel_id)
    assert status is not None
    t_fault = time.monotonic()
    if kind == "double":
        first_kind, second_kind = rng.sample(DOUBLE_KINDS, 2)
        first = injector.inject(first_kind, status, set())
        await asyncio.sleep(rng.uniform(0.1, 1.0))
        avoid = {first.host} if first.host else set()
        # the kernel as it is now (the first fault may have ended or replaced a replica)
        now = await asyncio.to_thread(cluster.kernel, notebook.kernel_id) or status
        try:
            second = injector.inject(second_kind, now, avoid)
        except (LookupError, psutil.Error, ProcessLookupError) as exc:
            # ProcessLookupError: the replica chosen had exited meanwhile (seed 22 stopped
            # the whole campaign on it after 35 faults)
            second = Fault(second_kind, f"not injected: {exc}", None)
        fault = Fault("double", f"{first.kind} {first.detail} + {second.kind} {second.detail}",
                      None)
    elif kind == "burst-global-scheduler":
        fault = await injector.burst()
        t_fault = time.monotonic()  # timed from the last kill of the burst
    else:
        fault = injector.inject(kind, status, set())
    await asyncio.sleep(rng.uniform(0.0, 0.3))
    result = await notebook.execute(code)
    next_cell_s = time.monotonic() - t_fault
    verdict, note = verifier.record(result)
    if verdict == "error":
        verdict, note = await _after_error(result, note, notebook, verifier, setup)
    whole = await _wait_whole(cluster, notebook.kernel_id, injector)
    redundancy_s = time.monotonic() - t_fault if whole else None
    return Outcome(fault.kind, fault.detail, verdict, round(next_cell_s, 3),
                   round(redundancy_s, 3) if redundancy_s is not None else None, note)


def _asleep(status: common_pb2.KernelStatus | None) -> bool:
    return status is not None and status.state in (common_pb2.KERNEL_STATE_HIBERNATING,
                                                    common_pb2.KERNEL_STATE_HIBERNATED,
                                                    common_pb2.KERNEL_STATE_WAKING)


async def _wake_before(cluster: UpCluster, notebook: Notebook, verifier: Verifier, code: str,
                       setup: str) -> Outcome | None:
    """The kernel fell asleep while the campaign waited: one cell wakes it before the next
    fault (which needs its replicas); an outcome only when that cell was not intact."""
    status = await asyncio.to_thread(cluster.kernel, notebook.kernel_id)
    if not _asleep(status) and (status is None or status.replicas):
        return None  # awake (a kernel going to sleep shows no replica once it stopped them)
    t0 = time.monotonic()
    result = await notebook.execute(code)
    took = time.monotonic() - t0
    verdict, note = verifier.record(result)
    if verdict == "error":
        verdict, note = await _after_error(result, note, notebook, verifier, setup)
    whole = await _wait_whole(cluster, notebook.kernel_id, None, asleep_ok=False)
    if verdict in ("intact", "rollback") and whole:
        return None
    return Outcome("wake-before-fault", "a cell woke the kernel", verdict, round(took, 3),
                   round(time.monotonic() - t0, 3) if whole else None, note)


async def _wait_state(cluster: UpCluster, kernel_id: str, check: Callable[[object], bool],
                      timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check(await asyncio.to_thread(cluster.kernel, kernel_id)):
            return True
        await asyncio.sleep(0.1)
    return False


def _hibernated(status: common_pb2.KernelStatus | None) -> bool:
    return status is not None and status.state == common_pb2.KERNEL_STATE_HIBERNATED \
        and not status.replicas


def _woken_replica(status: common_pb2.KernelStatus | None) -> bool:
    return status is not None and any(r.pid > 0 for r in status.replicas)


async def _hibernation_fault(kind: str, cluster: UpCluster, notebook: Notebook,
                             injector: Injector, verifier: Verifier, code: str, setup: str,
                             rng: random.Random, after_s: float) -> Outcome:
    """One of ``HIBERNATE_KINDS``: wait for the kernel to hibernate, fault, wake it by a cell."""
    kid = notebook.kernel_id
    if not await _wait_state(cluster, kid, _hibernated, after_s + HIBERNATE_TIMEOUT_S):
        status = await asyncio.to_thread(cluster.kernel, kid)
        state = common_pb2.KernelState.Name(status.state) if status is not None else "unknown"
        return Outcome(kind, "not injected", "error", 0.0, None,
                       f"the kernel never hibernated (state {state}, "
                       f"{len(status.replicas) if status else '?'} replicas, "
                       f"message {status.message if status else ''!r})")
    t_fault = time.monotonic()
    detail = "woken by a cell"
    if kind == "kill-global-scheduler-asleep":
        cluster.global_scheduler().send_signal(signal.SIGKILL)
        detail = "global scheduler killed while the kernel slept"
    elif kind == "kill-local-scheduler-asleep":
        host = f"host-{rng.randrange(cluster.hosts)}"
        ls = cluster.local_scheduler(host)
        ls.send_signal(signal.SIGKILL)
        detail = f"local scheduler of {host} (pid {ls.pid}) killed while the kernel slept"
    if kind.endswith("-asleep"):
        await asyncio.sleep(rng.uniform(0.0, 0.3))
    cell = asyncio.create_task(notebook.execute(code))
    if kind == "kill-global-scheduler-waking":
        await asyncio.sleep(rng.uniform(0.1, 1.0))
        cluster.global_scheduler().send_signal(signal.SIGKILL)
        detail = "global scheduler killed mid-wake"
    elif kind in ("kill-local-scheduler-waking", "kill-replica-waking"):
        t_wake = time.monotonic()
        if await _wait_state(cluster, kid, _woken_replica, 60):
            status = await asyncio.to_thread(cluster.kernel, kid)
            replica = rng.choice([r for r in status.replicas if r.pid > 0])
            if kind == "kill-replica-waking":
                with contextlib.suppress(ProcessLookupError):
                    os.kill(replica.pid, signal.SIGKILL)
                detail = f"replica {replica.replica_id} on {replica.host_id} killed mid-wake"
            else:
                ls = cluster.local_scheduler(replica.host_id)
                ls.send_signal(signal.SIGKILL)
                detail = f"local scheduler of {replica.host_id} killed mid-wake"
            detail += f" ({time.monotonic() - t_wake:.1f} s after the cell)"
        else:
            detail = "not injected: no woken replica within 60 s"
    result = await cell
    next_cell_s = time.monotonic() - t_fault
    verdict, note = verifier.record(result)
    if verdict == "error":
        verdict, note = await _after_error(result, note, notebook, verifier, setup)
    if verdict == "intact" and "woke" not in result.stderr + result.stdout:
        note = "the cell's output did not say that the notebook woke"
    if kind == "kill-executor-after-wake" and verdict in ("intact", "rollback"):
        if await _wait_whole(cluster, kid, injector, asleep_ok=False):
            after = await _one_fault("kill-executor", cluster, notebook, injector, verifier,
                                     code, setup, rng)
            detail = f"woke in {next_cell_s:.1f} s, then executor {after.detail}"
            verdict, note = after.verdict, after.note
            next_cell_s = after.next_cell_s
        else:
            verdict, note = "error", "never whole after the wake"
    whole = await _wait_whole(cluster, kid, injector, asleep_ok=False)
    redundancy_s = time.monotonic() - t_fault if whole else None
    return Outcome(kind, detail, verdict, round(next_cell_s, 3),
                   round(redundancy_s, 3) if redundancy_s is not None else None, note)


async def _after_error(result: CellResult, note: str, notebook: Notebook, verifier: Verifier,
                       setup: str) -> tuple[str, str]:
    """A cell after a fault failed, or ran without its output reaching the client: classify it
    and re-baseline the chain from a probe (a cell that changes nothing), so the next fault is
    judged on its own. A ``NameError`` is state that vanished without a word: a silent loss.
    When even the probe fails, the setup cell runs again (the state starts over)."""
    verdict = "error"
    if result.status == "ok":
        note = f"the cell ran but its output never reached the client ({note})"
    elif "NameError" in result.error:
        verdict = "silent-loss"
    probe = await notebook.execute(PROBE)
    match = CHAOS_LINE.search(probe.stdout) if probe.status == "ok" else None
    if match is not None:
        verifier.accept(probe.execution_count, match.group(2))
        return verdict, note
    note += f"; the probe failed too ({probe.error}): setup cell run again"
    again = await notebook.execute(setup)
    match = CHAOS_LINE.search(again.stdout) if again.status == "ok" else None
    if match is None:
        raise RuntimeError(f"the notebook cannot be repaired: {again.error} {again.stderr}")
    verifier.accept(again.execution_count, match.group(2))
    return verdict, note


async def _wait_whole(cluster: UpCluster, kernel_id: str, injector: Injector | None,
                      asleep_ok: bool = True) -> bool:
    """Full redundancy; a hibernated kernel counts (its state is in its checkpoint) unless
    ``asleep_ok`` is False."""
    deadline = time.monotonic() + WHOLE_TIMEOUT_S
    while time.monotonic() < deadline:
        hung = injector is not None and injector.hung()
        if not hung and await asyncio.to_thread(cluster.whole, kernel_id):
            return True
        if not hung and asleep_ok and _HIBERNATION[0] and _hibernated(
                await asyncio.to_thread(cluster.kernel, kernel_id)) \
                and await asyncio.to_thread(cluster.host_count) == cluster.hosts:
            return True
        await asyncio.sleep(0.1)
    return False


_ACTIVE: list[UpCluster] = []
_HIBERNATION = [False]  # the campaign runs with hibernate_after_s > 0


def _stop_and_exit(signum: int, _frame: object) -> None:
    for cluster in _ACTIVE:
        cluster.stop()
    os._exit(128 + signum)


def _torch_available() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--faults", type=int, default=100, help="single faults (default 100)")
    parser.add_argument("--double", type=int, default=30, help="double faults (default 30)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--hosts", type=int, default=4, help="Local Schedulers (default 4)")
    parser.add_argument("--big-mib", type=int, default=16, help="size of the numpy array")
    parser.add_argument("--no-torch", dest="torch", action="store_false",
                        help="leave the torch model out (it is left out when torch is missing)")
    parser.add_argument("--round-robin", action="store_true",
                        help="single faults in turn instead of at random")
    parser.add_argument("--kinds", type=lambda v: tuple(v.split(",")), default=None,
                        help="single faults only of these kinds, comma-separated (default all: "
                             + ", ".join(SINGLE_KINDS) + ")")
    parser.add_argument("--hibernate", type=int, default=0,
                        help="faults drawn from the hibernation kinds ("
                             + ", ".join(HIBERNATE_KINDS) + "), mixed in (default 0)")
    parser.add_argument("--hibernate-after", type=float, default=None,
                        help="the cluster's global_scheduler.hibernate_after_s (default 3 with "
                             "--hibernate, else the cluster's own setting)")
    parser.add_argument("--gap", type=float, default=0.0,
                        help="seconds between faults (notebookos up never gives up on a "
                             "daemon, but waits 1 s, 2 s, 4 s ... before restarting one that "
                             "exits again before it was ready)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--keep", metavar="DIR", help="run in DIR and keep the logs there")
    parser.add_argument("--table-of", metavar="DIR",
                        help="only print the table of the run kept in DIR (its outcomes.jsonl, "
                             "also of a run cut short)")
    args = smoke.parse_args(parser, faults=2, double=0, hosts=4, big_mib=1, torch=False,
                            hibernate=1, hibernate_after=2.0)
    if args.table_of:
        lines = (Path(args.table_of) / "outcomes.jsonl").read_text().splitlines()
        print(Campaign([Outcome(**json.loads(line)) for line in lines if line]).markdown())
        return 0
    if args.hosts < 4:
        parser.error("--hosts must be at least 4: a lost host's replicas need a fourth host")
    unknown = set(args.kinds or ()) - set(SINGLE_KINDS)
    if unknown:
        parser.error(f"unknown fault kind(s) {', '.join(sorted(unknown))}; "
                     f"known: {', '.join(SINGLE_KINDS)}")
    if args.faults < 0 or args.double < 0 or args.hibernate < 0:
        parser.error("--faults, --double and --hibernate must be >= 0")
    if args.hibernate_after is None:
        args.hibernate_after = 3.0 if args.hibernate else 0.0
    if args.hibernate and args.hibernate_after <= 0:
        parser.error("--hibernate needs --hibernate-after > 0 (a kernel that never hibernates)")
    if args.hibernate_after > 0:  # `notebookos up` and its daemons read it from the environment
        os.environ["NOTEBOOKOS_GLOBAL_SCHEDULER_HIBERNATE_AFTER_S"] = str(args.hibernate_after)
        _HIBERNATION[0] = True
    args.torch = args.torch and _torch_available()
    for sig in (signal.SIGTERM, signal.SIGINT):  # stop the cluster, whatever the loop is doing
        signal.signal(sig, _stop_and_exit)

    bar = None
    total = args.faults + args.double + args.hibernate
    if sys.stderr.isatty() and not args.json:
        from tqdm import tqdm

        bar = tqdm(total=total, unit="fault", desc="chaos", file=sys.stderr)

    def progress(outcome: Outcome) -> None:
        line = (f"{outcome.kind}: {outcome.verdict}, next cell {outcome.next_cell_s:.1f} s, "
                f"whole again "
                + (f"{outcome.redundancy_s:.1f} s" if outcome.redundancy_s else "never")
                + f" ({outcome.detail}){' - ' + outcome.note if outcome.note else ''}")
        if bar is not None:
            bar.update(1)
            bar.set_postfix_str(f"{outcome.kind}: {outcome.verdict}")
            if outcome.verdict not in ("intact", "rollback"):
                bar.write(line)
        else:
            print(line, file=sys.stderr, flush=True)

    with contextlib.ExitStack() as stack:
        if args.keep:
            workdir = Path(args.keep)
            workdir.mkdir(parents=True, exist_ok=True)
        else:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="chaos-")))
        t0 = time.monotonic()
        campaign = asyncio.run(run_campaign(args, workdir, progress))
        elapsed = time.monotonic() - t0
    if bar is not None:
        bar.close()
    result = {
        "seed": args.seed, "hosts": args.hosts, "big_mib": args.big_mib, "torch": args.torch,
        "round_robin": args.round_robin, "hibernate_after_s": args.hibernate_after,
        "elapsed_s": round(elapsed, 1),
        "setup_s": round(campaign.setup_s, 1), "daemon_restarts": campaign.restarts,
        "websocket_reconnects": campaign.reconnects, "table": campaign.table(),
        "jupyterlab": campaign.lab.summary() if campaign.lab else None,
        "outcomes": [asdict(o) for o in campaign.outcomes],
    }
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(campaign.markdown())
        print(f"{len(campaign.outcomes)} faults in {elapsed:.0f} s (setup {campaign.setup_s:.0f}"
              f" s), {campaign.restarts} daemon restarts by notebookos up, torch "
              f"{'on' if args.torch else 'off'}, numpy array {args.big_mib} MiB, seed "
              f"{args.seed}")
        if campaign.lab is not None:
            lab = campaign.lab.summary()
            print(f"JupyterLab: {lab['failed']} of {lab['probes']} probes failed, longest "
                  f"outage {lab['longest_outage_s']:.1f} s")
    bad = sum(o.verdict in ("silent-loss", "error") for o in campaign.outcomes)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
