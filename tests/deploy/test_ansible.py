"""The ansible playbook against this machine (connection local): ansible-lint, --check, a real
run that deploys NotebookOS with compose, and a second run that changes nothing."""

from __future__ import annotations

import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml
from ansible_run import ANSIBLE, playbook, tool
from notebook_check import ROOT

from notebookos.ports import free_ports
from notebookos.testing.deployment import ComposeDeployment

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def test_ansible_lint_is_clean() -> None:
    proc = subprocess.run([tool("ansible-lint"), "--offline", "--nocolor"], cwd=ANSIBLE,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "Profile 'production' was required, and it passed" in proc.stdout + proc.stderr


def test_playbook_check_then_deploy_then_nothing_changes(tmp_path: Path, notebookos_image: str,
                                                         image_torch: str) -> None:
    if shutil.which("apt-get") is None or not Path("/usr/bin/python3").exists():
        pytest.fail("the playbook targets Debian/Ubuntu hosts (apt-get, /usr/bin/python3)")
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"notebookos": {"children": {"notebookos_control": {
        "hosts": {"localhost": {"ansible_connection": "local",
                                "ansible_python_interpreter": "/usr/bin/python3"}}}}}}))
    project = f"nbosansible{uuid.uuid4().hex[:6]}"
    port = free_ports(1)[0]
    extra = tmp_path / "vars.yml"
    extra.write_text(yaml.safe_dump({
        # everything the playbook writes stays under tmp_path; the image is the one the other
        # deployment tests built from this tree
        "notebookos_prefix": str(tmp_path / "prefix"),
        "notebookos_cli_plugins_dir": str(tmp_path / "cli-plugins"),
        "notebookos_image": notebookos_image,
        "notebookos_image_torch": image_torch,
        "notebookos_image_remote_source_dir": "",
        "notebookos_project": project,
        "notebookos_deploy_jupyter_port": port,
        "notebookos_deploy_s3_secret_key": uuid.uuid4().hex,
    }))
    deployment = ComposeDeployment(ROOT, project, notebookos_image, port)
    try:
        _, recap = playbook(inventory, extra, "--check")
        assert recap["localhost"]["failed"] == 0
        assert not deployment.leftovers().containers  # --check deployed nothing

        _, recap = playbook(inventory, extra)
        assert recap["localhost"]["changed"] > 0 and recap["localhost"]["failed"] == 0
        deployment.wait_for_jupyterlab()
        deployment.wait_for_hosts(3)

        out, recap = playbook(inventory, extra)
        assert recap["localhost"]["changed"] == 0, out[-5000:]
    finally:
        compose = tmp_path / "cli-plugins" / "docker-compose"
        if compose.exists():
            subprocess.run([str(compose), "-p", project, "down", "--volumes", "--timeout", "30"],
                           cwd=tmp_path / "prefix" / "deploy", capture_output=True, timeout=300)
    assert not deployment.leftovers()

