"""State sync between real replicas: every binding form (table-driven), large objects via stores.

The executor runs a cell on replica 1; another replica then runs a check cell and must see the
same state. A module-wide group serves the binding table (each row uses its own names).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from harness import ReplicaGroup

from notebookos.testing.optional import require_torch


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory):
    workdir: Path = tmp_path_factory.mktemp("sync")
    replicas = ReplicaGroup(workdir, store_url=f"file://{workdir}/store")
    try:
        replicas.start()
        yield replicas
    finally:
        replicas.stop()


BINDINGS = [
    ("assign", "b_assign = 1", "print(b_assign)", "1"),
    ("tuple", "b_t1, (b_t2, b_t3) = 1, (2, 3)", "print(b_t1, b_t2, b_t3)", "1 2 3"),
    ("starred", "b_s1, *b_srest = [1, 2, 3]", "print(b_s1, b_srest)", "1 [2, 3]"),
    ("augmented", "b_aug = 10\nb_aug += 5", "print(b_aug)", "15"),
    ("annotated", "b_ann: int = 7", "print(b_ann)", "7"),
    ("walrus", "if (b_walrus := 3) > 2:\n    pass", "print(b_walrus)", "3"),
    ("for", "for b_for in range(4):\n    pass", "print(b_for)", "3"),
    ("with", "import contextlib\nwith contextlib.nullcontext(9) as b_with:\n    pass",
     "print(b_with)", "9"),
    ("except", "try:\n    1 / 0\nexcept ZeroDivisionError as exc:\n    b_exc = type(exc).__name__",
     "print(b_exc, 'exc' in globals())", "ZeroDivisionError False"),
    ("import", "import json", "print(json.dumps([1]))", "[1]"),
    ("import as", "import collections as b_coll", "print(b_coll.Counter('aab')['a'])", "2"),
    ("from import", "from math import sqrt as b_sqrt", "print(b_sqrt(16))", "4.0"),
    ("def", "def b_def(x):\n    return x * 3", "print(b_def(2))", "6"),
    ("async def", "async def b_adef():\n    return 5", "print(await b_adef())", "5"),
    ("class", "class BClass:\n    k = 4\n    def get(self):\n        return self.k",
     "print(BClass().get())", "4"),
    ("del", "b_del = 1\ndel b_del", "print('b_del' in globals())", "False"),
    ("global in function", "def b_set():\n    global b_glob\n    b_glob = 'g'\nb_set()",
     "print(b_glob)", "g"),
    ("method mutation", "b_list = [1]\n_ = None", "print(b_list)", "[1, 2]"),
    ("subscript store", "b_dict = {}", "print(b_dict)", "{'k': 'v'}"),
    ("attribute store", "class BObj:\n    pass\nb_obj = BObj()", "print(b_obj.attr)", "5"),
]
SECOND_CELL = {  # a second executor cell that mutates in place, run on replica 3
    "method mutation": "b_list.append(2)",
    "subscript store": "b_dict['k'] = 'v'",
    "attribute store": "b_obj.attr = 5",
}


@pytest.mark.parametrize("name,cell,check,expected", BINDINGS, ids=[b[0] for b in BINDINGS])
def test_binding_form_syncs(group: ReplicaGroup, name, cell, check, expected):
    first = group.execute(cell, target=1)
    assert first.reply(1)["content"]["status"] == "ok", first.reply(1)["content"]
    if name in SECOND_CELL:
        group.execute(SECOND_CELL[name], target=3)
    result = group.execute(check, target=2)
    assert result.reply(2)["content"]["status"] == "ok", result.reply(2)["content"]
    assert result.stdout() == expected + "\n"


def test_torch_model_trained_in_place_syncs(group: ReplicaGroup):
    require_torch()
    setup = (
        "import torch\ntorch.manual_seed(0)\nmodel = torch.nn.Linear(4, 2)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "x = torch.ones(8, 4)"
    )
    assert group.execute(setup, target=1).reply(1)["content"]["status"] == "ok"
    step = "loss = model(x).sum()\nloss.backward()\nopt.step()\nopt.zero_grad()\n" \
           "print(round(float(model.weight.sum()), 4))"
    trained = group.execute(step, target=1).stdout()
    seen = group.execute("print(round(float(model.weight.sum()), 4))", target=2).stdout()
    assert seen == trained
    # the optimizer on replica 2 still drives the same parameters as the model there
    again = group.execute(step, target=2).stdout()
    check = group.execute("print(round(float(model.weight.sum()), 4))", target=3).stdout()
    assert check == again != trained


def test_a_request_arriving_while_a_large_sync_is_pending_waits_for_it(group: ReplicaGroup):
    # the next cell goes to a standby before the previous cell's (store-backed) update is applied
    first = group.send_execute("import numpy as np\npending = np.full(4_000_000, 7.0)", target=1)
    second = group.send_execute("print(float(pending.sum()))", target=2)
    group.collect(first, group.alive_ids(), target=1, timeout=60)
    result = group.collect(second, group.alive_ids(), target=2, timeout=60)
    assert result.stdout() == "28000000.0\n", result.summary()
