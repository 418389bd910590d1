"""The user-facing GPU API on the kernel package: loaded lazily, and unknown names still fail."""

from __future__ import annotations

import subprocess
import sys

import pytest

import notebookos.kernel as kernel_package
from notebookos.kernel import gpu_binding


def test_assigned_gpus_follows_the_binding() -> None:
    gpu_binding.set_assigned_gpus([3, 5])
    try:
        assert kernel_package.assigned_gpus() == (3, 5)
    finally:
        gpu_binding.set_assigned_gpus(())
    assert kernel_package.assigned_gpus() == ()
    assert kernel_package.assigned_device is gpu_binding.assigned_device
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        kernel_package.nope  # noqa: B018


def test_importing_the_package_loads_no_kernel_machinery() -> None:
    probe = ("import sys, notebookos.kernel; "
             "print(sorted(m for m in ('ipykernel', 'pysyncobj', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
