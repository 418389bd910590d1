"""Raft never draws from the user's global generator (issue 31: seeded randomness diverged)."""

from __future__ import annotations

import random

from pysyncobj.dns_resolver import globalDnsResolver
from pysyncobj.syncobj import SyncObj, SyncObjConf

from notebookos.kernel.raft_random import keep_raft_off_the_users_generator


def test_pysyncobj_resolves_peers_and_draws_timeouts_without_the_users_numbers() -> None:
    keep_raft_off_the_users_generator()
    random.seed(5)
    before = random.getstate()
    resolver = globalDnsResolver()
    for _ in range(3):  # every connection attempt to a peer resolves its address
        assert resolver.resolve("127.0.0.1") == "127.0.0.1"
    timeout = SyncObj._SyncObj__generateRaftTimeout  # type: ignore[attr-defined]
    holder = type("Holder", (), {"_SyncObj__conf": SyncObjConf(raftMinTimeout=0.1,
                                                               raftMaxTimeout=0.2)})()
    assert 0.1 <= timeout(holder) <= 0.2
    assert random.getstate() == before


def test_a_kernel_info_request_takes_none_of_the_users_numbers(group) -> None:  # noqa: ANN001
    """IPython's banner picks a random tip from the global generator, and every
    kernel_info_request builds the banner: a woken kernel's first random.random() was plain
    IPython's next-but-one (the scheduler asks kernel_info of the replicas it starts)."""
    group.execute("import random\nrandom.seed(7)", target=1)
    for replica in group.replicas.values():
        assert replica.client.kernel_info(reply=True, timeout=10)["content"]["status"] == "ok"
    expected = random.Random(7).random()
    assert group.execute("print(random.random())", target=1).stdout() == f"{expected}\n"
