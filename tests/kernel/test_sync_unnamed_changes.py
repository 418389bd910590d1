"""What a cell changes without its AST saying so reaches the standbys (issue 31 items 1, 2, 6).

Training code changes state in ways the cell's text does not name: ``p.data += -lr * p.grad``
(torch's version counter does not move), ``backward()`` filling ``.grad``, a function kept in a
dict writing into an array, a seed set in one cell and drawn from in the next. Plain IPython is
the oracle: after the cell, the standby must hold what the executor holds.
"""

from __future__ import annotations

import random
import time

import numpy as np
import pytest
from codec_pair import Pair

from notebookos.kernel import rng_state
from notebookos.kernel.ast_effects import analyze_cell
from notebookos.kernel.sync_codec import SyncUpdate


def _same_tensor(pair: Pair, name: str) -> None:
    import torch

    executor, standby = pair.executor[name], pair.standby[name]
    assert standby is not executor
    assert torch.equal(standby.detach(), executor.detach()), name


@pytest.mark.usefixtures("torch_installed")
@pytest.mark.parametrize("size", [3, 1 << 16], ids=["small", "large"])
def test_an_update_through_data_reaches_the_standby(pair: Pair, size: int) -> None:
    pair.run(f"import torch\nW = torch.zeros({size}, requires_grad=True)\nparams = [W]")
    pair.run("W.data += 1")  # named, but W._version does not move
    _same_tensor(pair, "W")
    assert float(pair.standby["W"].detach()[0]) == 1.0
    pair.run("for p in params:\n    p.data.add_(2)")  # W not named at all
    _same_tensor(pair, "W")
    assert float(pair.standby["W"].detach()[0]) == 3.0
    assert pair.standby["params"][0] is pair.standby["W"]


@pytest.mark.usefixtures("torch_installed")
def test_a_manual_training_loop_keeps_weights_and_gradients(pair: Pair) -> None:
    pair.run("""
        import torch
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        x, y = torch.randn(8, 4), torch.randn(8, 2)
    """)
    step = """
        loss = ((model(x) - y) ** 2).mean()
        for p in model.parameters():
            p.grad = None
        loss.backward()
        for p in model.parameters():
            p.data += -0.1 * p.grad
    """
    for _ in range(3):
        pair.run(step)
        for name in ("weight", "bias"):
            executor = getattr(pair.executor["model"], name)
            standby = getattr(pair.standby["model"], name)
            assert standby.data.equal(executor.data), name
            assert standby.grad is not None and standby.grad.equal(executor.grad), name


@pytest.mark.usefixtures("torch_installed")
def test_grad_is_replicated_and_cleared(pair: Pair) -> None:
    pair.run("import torch\nW = torch.zeros(3, requires_grad=True)")
    pair.run("(W * 2).sum().backward()")  # W is not the root of any call or store
    assert pair.standby["W"].grad is not None
    assert pair.standby["W"].grad.tolist() == [2.0, 2.0, 2.0]
    pair.run("(W * 3).sum().backward()")  # accumulates into the same grad tensor
    assert pair.standby["W"].grad.tolist() == [5.0, 5.0, 5.0]
    pair.run("opt = torch.optim.SGD([W], lr=0.1)\nopt.step()")
    _same_tensor(pair, "W")
    pair.run("opt.zero_grad()")  # set_to_none: W.grad becomes None
    assert pair.executor["W"].grad is None
    assert pair.standby["W"].grad is None


@pytest.mark.usefixtures("torch_installed")
def test_a_loss_whose_graph_stayed_with_the_executor_says_so_on_backward(pair: Pair) -> None:
    """A loss computed in one cell and ``backward()`` in the next (llm-appendix-a cell 17 of the
    notebook corpus): after a failover the new executor holds the loss's values, not its graph
    (C++ nodes of the process that ran the forward pass). It used to be a leaf that took a
    gradient of ones for itself, the parameters' ``.grad`` stayed None, and the cell printed
    None without a word. Now ``backward()`` raises and says what to do; the values are right."""
    import torch

    pair.run("import torch\nb = torch.tensor([0.5], requires_grad=True)\n"
             "loss = (b * 3.0 - 1.0).pow(2).sum()")
    lost = pair.standby["loss"]
    assert float(lost.detach()) == pytest.approx(float(pair.executor["loss"].detach()))
    assert lost.requires_grad
    with pytest.raises(RuntimeError, match="autograd graph was lost"):
        lost.backward()
    assert pair.standby["b"].grad is None
    pair.executor["loss"].backward()  # the executor still holds the graph
    assert pair.executor["b"].grad is not None
    # a forward pass on the standby makes a new graph, as the message says
    fresh = (pair.standby["b"] * 3.0 - 1.0).pow(2).sum()
    fresh.backward()
    assert torch.equal(pair.standby["b"].grad, pair.executor["b"].grad)


def test_an_array_written_by_a_function_the_cell_does_not_name(pair: Pair) -> None:
    pair.run("""
        import numpy as np
        big = np.zeros(100_000)
        ops = {"fill": lambda value: big.fill(value)}
    """)
    pair.run("ops['fill'](7.0)")
    assert pair.standby["big"][0] == 7.0
    assert np.array_equal(pair.standby["big"], pair.executor["big"])


def _encode(pair: Pair, code: str) -> SyncUpdate:
    exec(compile(code, "<cell>", "exec"), pair.executor)
    record = pair.encoder.encode(pair.executor, analyze_cell(code)).to_bytes()
    return SyncUpdate.from_bytes(record)


def _apply(pair: Pair, update: SyncUpdate) -> None:
    pair.applier.prefetch(update)
    pair.applier.apply(pair.standby, update)


def test_seeded_global_generators_continue_on_the_standby(pair: Pair) -> None:
    """One process holds both namespaces here, so the generators are disturbed between encode and
    apply, as the standby's own process would have them."""
    code = "import numpy as np, random\nnp.random.seed(0)\nrandom.seed(1)\n"
    update = _encode(pair, code)
    expected = (np.random.rand(2).tolist(), random.random())
    np.random.seed(12345)
    random.seed(999)
    _apply(pair, update)
    assert (np.random.rand(2).tolist(), random.random()) == expected


@pytest.mark.usefixtures("torch_installed")
def test_torch_seed_continues_on_the_standby(pair: Pair) -> None:
    import torch

    update = _encode(pair, "import torch\ntorch.manual_seed(42)\n")
    expected = torch.rand(3).tolist()
    torch.manual_seed(7)
    _apply(pair, update)
    assert torch.rand(3).tolist() == expected


def test_an_unchanged_generator_sends_nothing(pair: Pair) -> None:
    pair.run("import numpy as np\nnp.random.seed(0)")
    update = pair.run("x = 1")
    assert [e.name for e in update.entries] == ["x"]
    update = pair.run("y = np.random.rand()")  # drew a number: the state moved
    assert sorted(e.name for e in update.entries) == sorted(["y", rng_state.RNG_ROOT])


def test_the_generators_survive_a_checkpoint(pair: Pair) -> None:
    from notebookos.kernel.sync_codec import read_checkpoint, restore_namespace, write_checkpoint

    pair.run("import numpy as np\nnp.random.seed(3)")
    expected = np.random.rand(2).tolist()
    np.random.seed(3)
    pair.run("x = 1")
    write_checkpoint(pair.store, pair.kernel_id, pair.encoder.snapshot_entries(), 2)
    np.random.seed(100)
    restored: dict = {}
    failed = restore_namespace(pair.store, read_checkpoint(pair.store, pair.kernel_id), restored)
    assert failed == []
    assert rng_state.RNG_ROOT not in restored
    assert np.random.rand(2).tolist() == expected


def test_the_state_is_plain_data() -> None:
    """Applying it runs no code: the restricted unpickler reads it."""
    import numpy  # noqa: F401 - captured only once imported

    state = rng_state.from_bytes(rng_state.to_bytes(rng_state.capture()))
    assert set(state) >= {"random", "numpy"}
    rng_state.restore(state)


@pytest.mark.usefixtures("torch_installed")
def test_checking_a_gib_of_tensors_after_a_cell_is_bounded(pair: Pair) -> None:
    """Every cell hashes every tensor the namespace holds (issue 31 asks for a namespace of
    1 GiB; 256 MiB here keeps the suite quick; benchmarks/kernel.py measures 1 GiB)."""
    pair.run("import torch\nbig = [torch.ones(32 << 20) for _ in range(2)]")  # 256 MiB
    started = time.perf_counter()
    update = pair.run("x = 1")
    took = time.perf_counter() - started
    assert [e.name for e in update.entries] == ["x"]
    assert took < 3.0, f"checking 256 MiB of tensors took {took:.2f} s"
    pair.run("big[1].data[5] = 2.0")
    assert float(pair.standby["big"][1][5]) == 2.0


def test_a_write_through_a_view_reaches_the_array_it_views(pair: Pair) -> None:
    """Found by the notebook corpus (PythonDataScienceHandbook 02.02): small arrays are copied
    per name, so the array a view was taken from is sent again when the view is written."""
    pair.run("import numpy as np\nx2 = np.arange(12).reshape(3, 4)\nx2_sub = x2[:2, :2]")
    pair.run("x2_sub[0, 0] = 99")
    assert pair.standby["x2"][0, 0] == 99 and pair.standby["x2_sub"][0, 0] == 99
    pair.run("x2[0, 1] = 42")
    assert pair.standby["x2_sub"][0, 1] == 42


def test_a_cached_notebook_function_is_replicated(pair: Pair) -> None:
    """Found by the notebook corpus (norvig/pytudes Stubborn): a @functools.cache function was
    pickled by reference to __main__, where a standby has no such name."""
    pair.run("""
        import functools
        @functools.cache
        def fib(n):
            return n if n < 2 else fib(n - 1) + fib(n - 2)
        @functools.lru_cache(maxsize=8, typed=True)
        def square(n):
            return n * n
        table = {n: fib(n) for n in range(20)}
    """)
    fib, square = pair.standby["fib"], pair.standby["square"]
    assert fib(30) == 832040 and fib.cache_info().maxsize is None
    assert square(3) == 9 and square.cache_parameters() == {"maxsize": 8, "typed": True}
    assert pair.standby["table"][19] == 4181


def test_a_cached_functions_results_travel_with_it(pair: Pair) -> None:
    """Found by the notebook corpus (pytudes Stubborn, with an executor kill after every cell):
    cells filled a recursive @cache function's cache step by step, and after a failover the
    next cell's call recursed from an empty cache: RecursionError on NotebookOS only."""
    pair.run("""
        import functools
        @functools.cache
        def depth(n, step=1):
            return 0 if n <= 0 else 1 + depth(n - step, step=step)
    """)
    for upto in range(400, 4001, 400):  # each call recurses at most 400 deep
        pair.run(f"depth({upto})")
        pair.run(f"depth({upto}, step=2)")  # a key with keywords: its separator is per process
    standby = pair.standby["depth"]
    executor = pair.executor["depth"]
    assert standby.cache_info().currsize == executor.cache_info().currsize > 4000
    assert standby(4000) == 4000  # from the cache: no recursion at all
    assert standby(4000, step=2) == 2000
    assert standby.cache_info().misses == 0


def test_a_bounded_cache_travels_empty(pair: Pair) -> None:
    pair.run("""
        import functools
        @functools.lru_cache(maxsize=4)
        def square(n):
            return n * n
        values = [square(n) for n in range(3)]
    """)
    square = pair.standby["square"]
    assert square.cache_info().currsize == 0 and square(3) == 9


@pytest.mark.usefixtures("torch_installed")
def test_a_tensor_over_an_arrays_memory_stays_over_it_on_the_standby(pair: Pair) -> None:
    """Found by the notebook corpus with a kill after every cell (LLMs-from-scratch appendix A,
    "changes because of memory sharing"): ``t = torch.from_numpy(a)``, the executor killed,
    ``a[0, 0, 0] = 999`` on the new executor, and ``t`` still printed 1 there: the standby had
    made the tensor a copy. It is now a tensor over the standby's array, as on the executor."""
    pair.run("""
        import numpy as np, torch
        ary3d = np.array([[[1, 2], [3, 4]], [[5, 6], [7, 8]]])
        tensor3d_3 = torch.from_numpy(ary3d)
        tail = torch.from_numpy(ary3d[1])
        alone = torch.arange(4)
    """)
    ary, tensor, tail = (pair.standby[n] for n in ("ary3d", "tensor3d_3", "tail"))
    assert np.shares_memory(ary, tensor.numpy()) and np.shares_memory(ary, tail.numpy())
    ary[0, 0, 0] = 999  # as the next cell on this replica would, were it the executor now
    ary[1, 1, 1] = 77
    assert int(tensor[0, 0, 0]) == 999 and int(tail[1, 1]) == 77
    pair.run("tensor3d_3[0, 1, 0] = -5")  # and a write through the tensor on the executor
    assert int(pair.standby["ary3d"][0, 1, 0]) == -5
    assert int(pair.standby["tensor3d_3"][0, 1, 0]) == -5
    assert np.shares_memory(pair.standby["ary3d"], pair.standby["tensor3d_3"].numpy())
    assert pair.standby["alone"].tolist() == [0, 1, 2, 3]


def test_a_large_array_the_cell_names_is_hashed_once_per_cell(pair: Pair, monkeypatch) -> None:  # noqa: ANN001
    """Every cell checks the arrays held (``_recheck``); one the cell also names was hashed a
    second time when its name was pickled: 100 MiB, ~0.1-0.2 s of each such cell before idle
    (the first cell after a wake among them). A change is still sent, and only once."""
    from notebookos.kernel import sync_codec

    pair.run("import numpy as np\nbig = np.arange(2_000_000)")
    hashed: list[int] = []
    digest = sync_codec._digest

    def counting(*parts):  # noqa: ANN002, ANN202
        size = sum(memoryview(part).nbytes for part in parts)
        if size >= big_bytes:
            hashed.append(size)
        return digest(*parts)

    big_bytes = pair.executor["big"].nbytes
    monkeypatch.setattr(sync_codec, "_digest", counting)
    pair.run("total = int(big.sum())")
    assert len(hashed) == 1
    hashed.clear()
    pair.run("big[0] = -1")
    assert len(hashed) == 1
    assert int(pair.standby["big"][0]) == -1
    assert (pair.standby["big"][1:] == pair.executor["big"][1:]).all()
