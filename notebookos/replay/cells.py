"""The code a replayed training cell runs, and reading back what it reports.

Every cell first checks the state the session's previous completed cell left (``replay_state``:
the session id and that cell's index; with ``torch`` also the model's parameter checksum and the
optimizer's step count, which only survive if the model and the optimizer state were carried
over), then works for the scaled duration, then prints one marker line with what it saw:
``@@notebookos-replay {json}``.

- ``sleep`` holds the cell's GPUs for the duration (``time.sleep``).
- ``torch`` trains a small MLP with Adam in a loop until the duration has passed, on the device
  the kernel bound for the cell (``notebookos.kernel.assigned_device()``: the first assigned GPU,
  or the CPU where there is none). From the second cell on, the model and the optimizer state
  must already be on that device when the cell starts: the kernel moved them (the
  dynamic-binding path); the marker says whether they were (``moved_by_kernel``).

The helpers are defined, used and deleted within the cell, so the only name the cell leaves in
the namespace (and so in the replicated state) is ``replay_state`` (and, with torch,
``replay_model`` and ``replay_optimizer``).
"""

from __future__ import annotations

import json
from typing import Any

MARKER = "@@notebookos-replay "
WORK_KINDS = ("sleep", "torch")

_SLEEP_BODY = """
    import time as _time
    _time.sleep({duration!r})
    return {{}}
"""

_TORCH_BODY = """
    import time as _time
    import torch as _torch
    device = _torch.device(_device)
    model, opt = _objects
    fresh = model is None or opt is None
    if fresh:
        _torch.manual_seed({seed!r})
        model = _torch.nn.Sequential(
            _torch.nn.Linear(128, 256), _torch.nn.ReLU(), _torch.nn.Linear(256, 16))
        model.to(device)
        opt = _torch.optim.Adam(model.parameters(), lr=1e-3)
        _objects[:] = [model, opt]
    first = next(model.parameters())
    moved_by_kernel = None if fresh else first.device == device
    if first.device != device:
        model.to(device)
        for per_param in opt.state.values():
            for key, value in per_param.items():
                if _torch.is_tensor(value) and key != "step":
                    per_param[key] = value.to(device)
    steps_before = int(opt.state[first]["step"]) if first in opt.state else 0
    checksum_before = float(sum(float(p.detach().double().sum()) for p in model.parameters()))
    steps = 0
    while True:
        x = _torch.randn(64, 128, device=device)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        steps += 1
        if _time.time() - _t0 >= {duration!r}:
            break
    if device.type == "cuda":
        _torch.cuda.synchronize(device)
    return {{"device": str(first.device), "moved_by_kernel": moved_by_kernel,
            "steps_before": steps_before, "checksum_before": checksum_before, "steps": steps,
            "steps_after": int(opt.state[next(model.parameters())]["step"]),
            "checksum_after": float(sum(float(p.detach().double().sum())
                                        for p in model.parameters()))}}
"""

_CELL = """\
def __notebookos_replay_cell(_prev, _objects):
    import json as _json
    import os as _os
    import socket as _socket
    import time as _time
    _t0 = _time.time()
    try:
        import notebookos.kernel as _nk
        _gpus, _device = list(_nk.assigned_gpus()), _nk.assigned_device()
    except Exception:
        _gpus, _device = None, "cpu"
    _expected = {expected!r}
    _seen = None if not isinstance(_prev, dict) else _prev.get("cell")
    # consistent: no state, or a state this session's cells left (with torch, also the model's
    # and optimizer's as that cell left them); state_ok: and it is the expected cell's.
    _consistent = _prev is None or (isinstance(_prev, dict) and _prev.get("session") == {session!r})

    def _work(_t0, _device, _objects):
{body}
    _info = _work(_t0, _device, _objects)
    if {torch!r} and isinstance(_prev, dict) and _prev.get("steps") is not None:
        _consistent = _consistent and _info["steps_before"] == _prev["steps"] and abs(
            _info["checksum_before"] - _prev["checksum"]) <= 1e-6 * max(1.0, abs(_prev["checksum"]))
    _state_ok = _consistent and _seen == _expected
    _t1 = _time.time()
    print({marker!r} + _json.dumps({{
        "session": {session!r}, "cell": {index!r}, "expected": _expected, "seen": _seen,
        "state_ok": bool(_state_ok),
        "consistent": bool(_consistent), "t_start": _t0, "t_end": _t1, "gpus": _gpus,
        "device": _device, "pid": _os.getpid(), "hostname": _socket.gethostname(), **_info}}),
        flush=True)
    _state = {{"session": {session!r}, "cell": {index!r}}}
    if "steps_after" in _info:
        _state.update(steps=_info["steps_after"], checksum=_info["checksum_after"])
    return [_state, *_objects]
{assign} = __notebookos_replay_cell(
    replay_state if "replay_state" in dir() else None, {objects})
del __notebookos_replay_cell
"""


def cell_code(work: str, session_id: str, index: int, duration_s: float,
              expected_previous: int | None, seed: int = 0) -> str:
    """The code of cell ``index`` of ``session_id``. ``expected_previous``: the index of the last
    cell of this session that completed (its state must be there), None for none yet."""
    if work not in WORK_KINDS:
        raise ValueError(f"--work {work!r}: expected one of {', '.join(WORK_KINDS)}")
    template = _TORCH_BODY if work == "torch" else _SLEEP_BODY
    body = template.format(duration=max(0.0, float(duration_s)), seed=seed)
    body = "\n".join("    " + line if line.strip() else line for line in body.splitlines())
    torch = work == "torch"
    if torch:
        assign = "replay_state, replay_model, replay_optimizer"
        objects = ("[replay_model if \"replay_model\" in dir() else None, "
                   "replay_optimizer if \"replay_optimizer\" in dir() else None]")
    else:
        assign, objects = "(replay_state,)", "[]"
    return _CELL.format(expected=expected_previous, session=session_id, index=index, body=body,
                        marker=MARKER, torch=torch, assign=assign, objects=objects)


def parse_marker(text: str) -> dict[str, Any] | None:
    """The marker a cell printed, from a ``stream`` message's text; None if there is none."""
    for line in text.splitlines():
        if line.startswith(MARKER):
            try:
                value = json.loads(line[len(MARKER):])
            except json.JSONDecodeError:
                return None
            return value if isinstance(value, dict) else None
    return None
