"""Large objects between replicas through the real Redis and S3 stores.

A tensor over the threshold and a small torch model (always a store object) are written by the
executor and read back by a standby; the test checks they really went through the store.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from harness import ReplicaGroup

from notebookos.testing.optional import require_torch

torch = require_torch()

pytestmark = pytest.mark.services

CELL = (
    "import torch\n"
    "torch.manual_seed(1)\n"
    "big = torch.arange(3_000_000, dtype=torch.float32)  # 12 MB\n"
    "net = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.ReLU(), torch.nn.Linear(5, 1))\n"
    "probe = torch.ones(2, 3)\n"
    "print(float(big.double().sum()), round(float(net(probe).sum()), 5))"
)
CHECK = "print(float(big.double().sum()), round(float(net(probe).sum()), 5))"


def round_trip(workdir: Path, store_url: str) -> tuple[ReplicaGroup, str, str]:
    group = ReplicaGroup(workdir, store_url=store_url)
    group.start()
    written = group.execute(CELL, target=1)
    assert written.reply(1)["content"]["status"] == "ok", written.reply(1)["content"]
    read = group.execute(CHECK, target=2)
    assert written.stdout().startswith("4499998500000.0 "), written.stdout()
    return group, written.stdout(), read.stdout()


def test_large_tensor_and_model_through_redis(tmp_path: Path, redis_url: str):
    import redis

    prefix = f"nbos-test-{uuid.uuid4().hex[:8]}"
    group, written, read = None, "", ""
    client = redis.Redis.from_url(redis_url)
    try:
        group, written, read = round_trip(tmp_path, f"{redis_url}?prefix={prefix}")
        assert read == written
        keys = [k.decode() for k in client.scan_iter(f"{prefix}:*{group.kernel_id}/objects/*")]
        assert len(keys) >= 2, keys
    finally:
        if group is not None:
            group.stop()
        for key in client.scan_iter(f"{prefix}:*"):
            client.delete(key)
        client.close()


def test_large_tensor_and_model_through_s3(tmp_path: Path, s3_server):
    bucket = s3_server.new_bucket()
    group = None
    try:
        group, written, read = round_trip(tmp_path, s3_server.store_url(bucket))
        assert read == written
        listing = s3_server.client().list_objects_v2(Bucket=bucket)
        keys = [o["Key"] for o in listing.get("Contents", [])]
        assert sum(f"{group.kernel_id}/objects/" in k for k in keys) >= 2, keys
    finally:
        if group is not None:
            group.stop()
