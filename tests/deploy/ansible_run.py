"""Running the ansible playbook (ansible/site.yml) from the deployment tests: the tools of the
test extra, and each host's counts of the PLAY RECAP."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from notebook_check import ROOT

ANSIBLE = ROOT / "ansible"
BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    path = BIN / name
    if not path.exists():
        pytest.fail(f"{name} is not installed (the test extra installs it)")
    return str(path)


def recap(out: str) -> dict[str, dict[str, int]]:
    """host -> {ok, changed, unreachable, failed, skipped, ...} of the last PLAY RECAP."""
    assert "PLAY RECAP" in out, out[-3000:]
    hosts = {}
    for line in out.rsplit("PLAY RECAP", 1)[1].splitlines():
        match = re.match(r"\s*(\S+)\s*:\s*(\w+=\d+.*)$", line)
        if match:
            hosts[match.group(1)] = {k: int(v) for k, v in
                                     re.findall(r"(\w+)=(\d+)", match.group(2))}
    return hosts


def playbook(inventory: Path, extra: Path, *args: str, timeout: float = 1200
             ) -> tuple[str, dict[str, dict[str, int]]]:
    """Run site.yml; fails the test when ansible-playbook fails. Returns its output and the
    recap of every host."""
    proc = subprocess.run(
        [tool("ansible-playbook"), "-i", str(inventory), "-e", f"@{extra}", "site.yml", *args],
        cwd=ANSIBLE, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0"})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-8000:]
    return out, recap(out)
