"""GPU binding: the traversal is tested on CPU with the "meta" device; real moves on CUDA (gpu)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from notebookos.kernel import gpu_binding
from notebookos.kernel.gpu_binding import (
    assigned_device,
    assigned_gpus,
    bound_gpus,
    cuda_available,
    move_namespace_to_device,
    move_namespace_to_host,
    set_assigned_gpus,
)
from notebookos.testing.optional import require_torch

torch = require_torch()
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(autouse=True)
def no_assignment_left_over():
    yield
    set_assigned_gpus(())


def trained_state() -> dict:
    """A module, its Adam optimizer after one step, an alias of a parameter, tensors in containers."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(5, 4)).sum().backward()
    opt.step()
    features = torch.randn(3, 4)
    return {
        "model": model,
        "opt": opt,
        "first_weight": model[0].weight,
        "features": features,
        "same_features": features,
        "batch": {"x": features, "y": torch.zeros(3), "note": "kept"},
        "pair": (torch.ones(2), "label"),
        "history": [torch.arange(3), 7],
        "count": 3,
    }


def test_cuda_available_matches_torch() -> None:
    assert cuda_available() is torch.cuda.is_available()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the virtual-GPU path")
def test_without_cuda_gpu_ids_are_virtual_and_nothing_moves() -> None:
    namespace = trained_state()
    before = {k: v for k, v in namespace.items()}
    weight = namespace["model"][0].weight.detach().clone()
    assert move_namespace_to_device(namespace, "cuda:0") == 0
    assert move_namespace_to_host(namespace) == 0
    assert all(namespace[k] is before[k] for k in before)
    assert torch.equal(namespace["model"][0].weight, weight)
    with bound_gpus(namespace, [3]) as moved:
        assert moved == 0
        assert assigned_gpus() == (3,)
        assert assigned_device() == "cpu"


def test_move_keeps_identity_across_names_modules_and_optimizer() -> None:
    namespace = trained_state()
    model, opt = namespace["model"], namespace["opt"]
    # 1 module + 6 params (Linear, BatchNorm, Linear) x 2 Adam moments + 4 loose tensors
    assert move_namespace_to_device(namespace, "meta") == 1 + 12 + 4
    params = list(model.parameters())
    assert all(p.device.type == "meta" for p in params)
    assert all(b.device.type == "meta" for b in model.buffers())
    assert all(a is b for a, b in zip(params, opt.param_groups[0]["params"], strict=True))
    assert namespace["first_weight"] is model[0].weight
    assert namespace["features"] is namespace["same_features"] is namespace["batch"]["x"]
    assert namespace["features"].device.type == "meta"
    assert namespace["batch"]["y"].device.type == "meta" and namespace["batch"]["note"] == "kept"
    assert namespace["pair"][0].device.type == "meta" and namespace["pair"][1] == "label"
    assert namespace["history"][0].device.type == "meta" and namespace["history"][1] == 7
    for param in params:
        state = opt.state[param]  # re-keyed by the moved parameter objects
        assert state["exp_avg"].device.type == "meta"
        assert state["exp_avg_sq"].device.type == "meta"
        assert state["step"].device.type == "cpu"  # torch keeps the scalar step on the CPU
    assert namespace["model"] is model and namespace["opt"] is opt
    # A second move to the same device finds nothing to do.
    assert move_namespace_to_device(namespace, "meta") == 0


def test_tied_parameters_stay_tied() -> None:
    shared = torch.nn.Linear(2, 2)
    encoder = torch.nn.Sequential(shared)
    decoder = torch.nn.Sequential(torch.nn.ReLU(), shared)
    namespace = {"encoder": encoder, "decoder": decoder, "w": shared.weight}
    assert move_namespace_to_device(namespace, "meta") >= 1
    assert encoder[0].weight is decoder[1].weight is namespace["w"]
    assert namespace["w"].device.type == "meta"


def test_host_move_on_host_state_changes_nothing() -> None:
    namespace = trained_state()
    snapshot = {k: v for k, v in namespace.items()}
    values = {n: p.detach().clone() for n, p in namespace["model"].named_parameters()}
    dtypes = {n: p.dtype for n, p in namespace["model"].named_parameters()}
    assert move_namespace_to_host(namespace) == 0
    assert move_namespace_to_device(namespace, "cpu") == 0
    assert all(namespace[k] is snapshot[k] for k in snapshot)
    for name, param in namespace["model"].named_parameters():
        assert param.dtype == dtypes[name] and torch.equal(param, values[name])


def test_internal_names_are_left_alone() -> None:
    displayed = torch.ones(2)
    namespace = {"_": displayed, "Out": {1: displayed}, "_notebookos_x": torch.ones(1)}
    assert move_namespace_to_device(namespace, "meta") == 0
    assert namespace["_"] is displayed and displayed.device.type == "cpu"


def test_assigned_gpus_api() -> None:
    assert assigned_gpus() == ()
    set_assigned_gpus([2, 5])
    assert assigned_gpus() == (2, 5)
    assert assigned_device() == ("cuda:2" if torch.cuda.is_available() else "cpu")
    for bad in ([-1], ["0"], [1.0], [True]):
        with pytest.raises(ValueError, match="non-negative integers"):
            set_assigned_gpus(bad)
    assert assigned_gpus() == (2, 5)  # a rejected call changes nothing


def test_bound_gpus_clears_the_assignment_even_when_the_cell_fails() -> None:
    # GPU 0: with CUDA the binding checks the index exists (GPU 1 failed on a one-GPU H200)
    with pytest.raises(ZeroDivisionError), bound_gpus({}, [0]):
        assert gpu_binding.assigned_gpus() == (0,)
        raise ZeroDivisionError("the cell failed")
    assert assigned_gpus() == ()


def test_never_imports_torch() -> None:
    code = textwrap.dedent("""
        import sys
        from notebookos.kernel import gpu_binding as g
        ns = {"x": 1}
        assert g.cuda_available() is False
        assert g.move_namespace_to_device(ns, "cuda:0") == 0
        assert g.move_namespace_to_host(ns) == 0
        g.set_assigned_gpus([0])
        assert g.assigned_device() == "cpu"
        assert "torch" not in sys.modules, "torch was imported"
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr


# ------------------------------------------------------------------------------- real GPUs


@pytest.mark.gpu
@needs_cuda
def test_round_trip_to_cuda_and_back_keeps_values_and_identity() -> None:
    namespace = trained_state()
    model, opt = namespace["model"], namespace["opt"]
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    moments = {i: opt.state[p]["exp_avg"].clone() for i, p in enumerate(model.parameters())}
    features = namespace["features"].clone()
    params_before = list(model.parameters())

    with bound_gpus(namespace, [0]) as moved:
        assert moved == 1 + 12 + 4
        assert assigned_device() == "cuda:0"
        assert all(p.is_cuda for p in model.parameters())
        assert namespace["features"].is_cuda and namespace["batch"]["x"] is namespace["features"]
        assert all(opt.state[p]["exp_avg"].is_cuda for p in model.parameters())
        # Train one step on the GPU: the optimizer still drives the module's parameters.
        model(namespace["features"].new_ones(5, 4)).sum().backward()
        opt.step()
        trained = {n: p.detach().cpu().clone() for n, p in model.named_parameters()}

    assert all(a is b for a, b in zip(params_before, model.parameters(), strict=True))
    assert all(not p.is_cuda for p in model.parameters())
    assert torch.equal(namespace["features"], features) and not namespace["features"].is_cuda
    for name, param in model.named_parameters():
        assert torch.equal(param, trained[name])
        assert not torch.equal(param, weights[name])  # the GPU step's result came back
    assert all(not opt.state[p]["exp_avg"].is_cuda for p in model.parameters())
    assert not torch.equal(opt.state[params_before[0]]["exp_avg"], moments[0])


@pytest.mark.gpu
@needs_cuda
def test_unknown_gpu_index_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="not visible"):
        move_namespace_to_device({"t": torch.ones(1)}, f"cuda:{torch.cuda.device_count()}")



@pytest.mark.gpu
@needs_cuda
def test_a_failed_move_brings_everything_back_to_the_host() -> None:
    class Unmovable(torch.nn.Module):
        """A module whose move fails after its parameters moved (like CUDA OOM half-way)."""

        def __init__(self) -> None:
            super().__init__()
            self.inner = torch.nn.Linear(2, 2)

        def _apply(self, fn, recurse=True):
            super()._apply(fn, recurse)
            raise RuntimeError("out of memory (simulated half-way failure)")

    namespace = {"a_model": torch.nn.Linear(2, 2), "broken": Unmovable(), "z": torch.arange(4.0)}
    with pytest.raises(RuntimeError, match="out of memory"):
        move_namespace_to_device(namespace, "cuda:0")
    everything = [*namespace["a_model"].parameters(), *namespace["broken"].parameters(),
                  namespace["z"]]
    assert all(t.device.type == "cpu" for t in everything)
