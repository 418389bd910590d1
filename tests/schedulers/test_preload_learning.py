"""The host learns what to preload (issue 34): installed packages its replicas' cells import are
imported by the fork server while the host is idle, so replicas forked afterwards hold them
without ``local_scheduler.preload_modules``. ``idna`` stands in for torch (installed, light,
imported by no replica on its own). Real processes throughout."""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from pathlib import Path

import pytest
from sched_cluster import make_cluster_fixture, run_seen, stream_text  # noqa: F401 - the fixture

from notebookos.import_report import ImportReport
from notebookos.local_scheduler.fork_server import ForkServer
from notebookos.local_scheduler.preload_learning import (
    REPORT_FILE,
    STATUS_FILE,
    LearnSettings,
    PreloadLearner,
)

pytestmark = pytest.mark.timeout(180)
STAND_IN = "idna"

PROBE = """
import os, sys, time
time.sleep(float(os.environ.get("PROBE_SLEEP", "0")))
print(sorted(n for n in ("idna", "certifi") if n in sys.modules), flush=True)
"""


@pytest.fixture
def fork_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    (tmp_path / "learn_probe.py").write_text(PROBE)
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    server = ForkServer(sys.executable, "learn_probe", tmp_path / "fork-server.log")
    server.start()
    yield server
    server.close()


def _forked_sees(server: ForkServer, log: Path) -> str:
    child = server.fork([], {}, log)
    child.wait(30)
    return log.read_text().strip()


def test_the_fork_server_imports_learned_packages_and_forks_with_them(
        fork_server: ForkServer, tmp_path: Path) -> None:
    assert STAND_IN not in fork_server.modules()
    assert _forked_sees(fork_server, tmp_path / "before.log") == "[]"
    answer = fork_server.import_modules([STAND_IN, "not_a_package_here", "os.path", "../x"])
    assert list(answer["imported"]) == [STAND_IN]
    assert answer["failed"] == {"not_a_package_here": "refused: not installed",
                                "os.path": "refused: not a top-level module name",
                                "../x": "refused: not a top-level module name"}
    assert answer["rss_kb"] > 0 and not answer["unsafe"]
    assert STAND_IN in fork_server.modules()  # asked of the server itself
    assert _forked_sees(fork_server, tmp_path / "after.log") == f"['{STAND_IN}']"


def test_a_replica_that_exits_while_the_server_imports_is_reaped_at_once(
        fork_server: ForkServer, tmp_path: Path) -> None:
    """The server imports on its one thread (seconds, for torch); a replica stopped meanwhile is
    reaped and reported then, not left a zombie whose stop waits for the import."""
    child = fork_server.fork([], {"PROBE_SLEEP": "0.3"}, tmp_path / "child.log")
    done: dict[str, float] = {}

    def import_torch() -> None:  # 1.5 s on an idle 2-core VM
        fork_server.import_modules(["torch"])
        done["import"] = time.monotonic()

    importer = threading.Thread(target=import_torch)
    importer.start()
    assert child.wait(30) == 0
    exited = time.monotonic()
    importer.join(60)
    assert done["import"] - exited > 0.2, "the exit was reported only after the import"
    assert "torch" in fork_server.modules()


def test_a_restarted_fork_server_imports_what_was_learned(fork_server: ForkServer,
                                                          tmp_path: Path) -> None:
    fork_server.learned = ["certifi"]
    fork_server.restart()
    deadline = time.monotonic() + 60
    while not fork_server.alive and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "certifi" in fork_server.modules()
    assert _forked_sees(fork_server, tmp_path / "child.log") == "['certifi']"


def test_a_package_in_the_notebooks_folder_is_never_learned(
        fork_server: ForkServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """Only installed packages: a module beside the notebook, denied ones and malformed names
    are refused with a log line each; the bound holds; a failed import is not retried."""
    (tmp_path / "mytrain.py").write_text("raise SystemExit('user code ran in the host')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    learned = []
    learner = PreloadLearner(LearnSettings(max_modules=1, deny=frozenset({"debugpy"})),
                             tmp_path, fork_server, on_learned=lambda: learned.append(1))
    (tmp_path / REPORT_FILE).write_text(
        "mytrain\ndebugpy\n../../etc/passwd\nnumpy\nno_such_pkg\nidna\ncertifi\n")
    with caplog.at_level(logging.INFO, logger="notebookos.local_scheduler.preload_learning"):
        learner.poll()
    assert learner.learned == [STAND_IN] and learned == [1]
    assert set(learner.refused) == {"mytrain", "debugpy", "../../etc/passwd", "no_such_pkg"}
    assert "is not under the standard library or site-packages" in learner.refused["mytrain"]
    text = caplog.text
    assert "not preloading 'mytrain'" in text and "not preloading 'debugpy'" in text
    assert "not preloading '../../etc/passwd', which a replica imported: not a top-level" in text
    assert "learn_preload_max" in text  # certifi: over the bound
    assert "mytrain" not in fork_server.modules() and "certifi" not in fork_server.modules()
    status = json.loads((tmp_path / STATUS_FILE).read_text())
    assert status["learned"] == [STAND_IN] and status["fork_server_rss_mb"] > 0
    # said once, never retried: the same names reported again change nothing
    caplog.clear()
    with open(tmp_path / REPORT_FILE, "a") as f:
        f.write("mytrain\nidna\n")
    learner.poll()
    assert "mytrain" not in caplog.text and learned == [1]


def test_a_replica_reports_the_packages_its_cells_import_once_each(tmp_path: Path) -> None:
    """What the state sync lists after a cell (library modules, dotted) is reported as
    top-level package names, once each; the standard library and private names are not."""
    report = ImportReport(str(tmp_path / REPORT_FILE))
    said = report.add(["torch", "torch.nn", "torch.nn.functional", "json", "_distutils_hack",
                       "certifi.core"])
    assert said == ["certifi", "torch"]
    assert report.add(["torch.optim", "numpy"]) == ["numpy"]
    assert (tmp_path / REPORT_FILE).read_text().splitlines() == ["certifi", "torch", "numpy"]


def test_a_package_one_notebook_imported_is_preloaded_for_the_next(make_cluster) -> None:  # noqa: ANN001
    """No preload_modules: the first notebook imports the stand-in; every host learns it (the
    standbys import it too) and a notebook started afterwards finds it imported."""
    cluster = make_cluster()
    cluster.start_gs()
    for i in range(3):
        cluster.start_ls(f"host-{i}", prewarm=1)
    cluster.wait_hosts(3)
    _, first = cluster.start_kernel(gpus=0)
    seen = run_seen(first, f"import sys\nprint({STAND_IN!r} in sys.modules)\nimport {STAND_IN}")
    assert stream_text(seen, "stdout") == "False\n", seen["reply"]["content"]
    state = cluster.workdir / "state" / "local_scheduler"

    def learned() -> list[str]:
        out = []
        for i in range(3):
            try:
                out += json.loads((state / f"host-{i}" / STATUS_FILE).read_text())["learned"]
            except (OSError, ValueError, KeyError):
                pass
        return out

    cluster.wait(lambda: learned().count(STAND_IN) == 3, 90, "every host learned the stand-in")
    time.sleep(3)  # the pools' waiting replicas were renewed (forked again)
    for _ in range(2):  # the first from the renewed pools, the second forked while they refill
        _, kc = cluster.start_kernel(gpus=0)
        seen = run_seen(kc, f"import sys\nprint({STAND_IN!r} in sys.modules)")
        assert stream_text(seen, "stdout") == "True\n", seen["reply"]["content"]

    # a standby tells what it received before it applies it (an apply that imports torch first
    # takes seconds, and a notebook that hibernates meanwhile stops it before it would tell)
    held = run_seen(first, "import torch\nmodel = torch.nn.Linear(2, 2)")
    assert held["reply"]["content"]["status"] == "ok", held["reply"]["content"]
    reports = [state / f"host-{i}" / REPORT_FILE for i in range(3)]
    cluster.wait(lambda: all("torch" in r.read_text().split() for r in reports if r.exists())
                 and all(r.exists() for r in reports), 1.5, "every host told of torch at once")
