"""Replica options: --peers parsing, NOTEBOOKOS_* environment fallbacks, the Raft password."""

from __future__ import annotations

import subprocess
import sys

import pytest

from notebookos.kernel.app import argv_with_env
from notebookos.kernel.peers import parse_peers
from notebookos.kernel.raft_crypto import raft_key


def test_parse_peers():
    assert parse_peers("2=127.0.0.1:7002, 3=host.example:7003") == {
        2: "127.0.0.1:7002", 3: "host.example:7003"}
    assert parse_peers("") == {}


@pytest.mark.parametrize("bad", ["2", "x=1.2.3.4:5", "2=host", "2=host:0", "2=h:1,2=h:2"])
def test_parse_peers_rejects_bad_input_with_a_message(bad):
    with pytest.raises(ValueError, match="peers|host:port"):
        parse_peers(bad)


def test_environment_fills_only_missing_options():
    argv = argv_with_env(["-f", "c.json", "--replica-id=2"], {
        "NOTEBOOKOS_REPLICA_ID": "9", "NOTEBOOKOS_PEERS": "1=a:1", "NOTEBOOKOS_JOIN": "1"})
    assert argv == ["-f", "c.json", "--replica-id=2", "--peers=1=a:1", "--join"]


def test_raft_key_depends_on_the_kernel_key_and_is_not_the_key():
    assert raft_key(b"k1") != raft_key(b"k2")
    assert b"k1" not in raft_key(b"k1")
    assert raft_key("k1") == raft_key(b"k1")


def test_missing_raft_address_fails_with_a_clear_message(tmp_path):
    from jupyter_client.connect import write_connection_file

    cf = tmp_path / "c.json"
    write_connection_file(str(cf), ip="127.0.0.1", key=b"k")
    proc = subprocess.run([sys.executable, "-m", "notebookos.kernel", "-f", str(cf)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "--raft-address" in proc.stderr + proc.stdout


def test_a_raft_port_in_use_is_reported_at_start():
    import socket

    from notebookos.kernel.raft_log import check_bindable

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        with pytest.raises(OSError, match="cannot listen for Raft on 127.0.0.1"):
            check_bindable(address)


def test_help_documents_the_replica_options():
    proc = subprocess.run([sys.executable, "-m", "notebookos.kernel", "--help"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for option in ("--replica-id", "--raft-address", "--peers", "--store-url", "--join",
                   "--restore-from-checkpoint", "--election-timeout"):
        assert option in proc.stdout


@pytest.mark.parametrize("ids,cuda,count,usable", [
    ((0,), False, 0, True),     # no CUDA: ids are virtual
    ((0, 1), True, 2, True),
    ((3,), True, 2, False),     # this host has no GPU 3: the replica yields
    ((), True, 0, True),
])
def test_gpu_ids_usable(ids, cuda, count, usable):
    from notebookos.kernel.gpu_glue import gpu_ids_usable

    assert gpu_ids_usable(ids, cuda, count) is usable


def test_requested_gpu_ids_validates():
    from notebookos.kernel.gpu_glue import requested_gpu_ids

    assert requested_gpu_ids({"gpu_device_ids": [1, 2]}) == (1, 2)
    assert requested_gpu_ids({}) == ()
    for bad in ("0", [-1], [True], [1.5]):
        with pytest.raises(ValueError, match="gpu_device_ids"):
            requested_gpu_ids({"gpu_device_ids": bad})


def test_replicas_do_not_offer_the_debugger_but_notebook_code_can_import_debugpy(tmp_path):
    """debugpy is 8.8 MB and ~50 ms per replica; its breakpoints would be set on the front's
    preferred replica while the cell runs on the elected one. The replica says so in kernel_info
    (as the front does while the replicas start), and a cell may still import debugpy."""
    from harness import ReplicaGroup

    group = ReplicaGroup(tmp_path, store_url=f"file://{tmp_path}/store")
    try:
        group.start()
        client = group.replicas[1].client
        msg_id = client.kernel_info()
        reply = group._wait_reply(client.get_shell_msg, msg_id, 10)
        assert not reply["content"].get("debugger"), reply["content"]
        assert "debugger" not in reply["content"].get("supported_features", []), reply["content"]
        result = group.execute("import sys\nprint('debugpy' in sys.modules)\n"
                               "import debugpy\nprint(debugpy.__name__)", target=1)
        assert result.stdout() == "False\ndebugpy\n", result.summary()
    finally:
        group.stop()
