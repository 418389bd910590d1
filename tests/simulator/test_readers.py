"""Trace readers: formats, units, and clear errors on bad input."""

from __future__ import annotations

import json

import pytest

from notebookos.workload.model import TraceError
from notebookos.workload.readers import read_trace


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_canonical_and_tiresias_and_muri_units(tmp_path):
    canonical = write(tmp_path, "c.csv", "job_id,submit_time,duration,num_gpu\n1,10,20,2\n0,0,5,1\n")
    w = read_trace(canonical, "canonical")
    assert w.job_trace and [(t.task_id, t.submit, t.duration, t.gpus) for t in w.tasks] == [
        ("0", 0, 5, 1), ("1", 10, 20, 2)]
    tiresias = write(tmp_path, "t.csv", "job_id,num_gpu,submit_time,iterations,model_name,duration,"
                     "interval\n7,4,2,0,vgg,3,0\n")
    assert read_trace(tiresias, "tiresias", "min").tasks[0].submit == 120
    muri = write(tmp_path, "m.csv", "job_id,num_gpu,submit_time,duration\n0,1,1500,2500\n")
    task = read_trace(muri, "muri").tasks[0]
    assert (task.submit, task.duration) == (1.5, 2.5)


@pytest.mark.parametrize("body, message", [
    ("job_id,submit_time,duration\n1,0,1\n", "missing column"),
    ("job_id,submit_time,duration,num_gpu\n1,0,x,1\n", "c.csv:2: column 'duration'='x'"),
    ("job_id,submit_time,duration,num_gpu\n1,0,1,0\n", "num_gpu='0' must be an integer >= 1"),
    ("job_id,submit_time,duration,num_gpu\n1,0,1,1\n1,0,1,1\n", "duplicate job_id"),
    ("job_id,submit_time,duration,num_gpu\n", "no jobs"),
])
def test_bad_csv_is_refused_with_file_and_line(tmp_path, body, message):
    with pytest.raises(TraceError, match=message):
        read_trace(write(tmp_path, "c.csv", body), "canonical")


def test_unknown_format_unit_and_missing_file(tmp_path):
    with pytest.raises(TraceError, match="known formats"):
        read_trace(tmp_path / "x", "philly")
    with pytest.raises(TraceError, match="unknown time unit"):
        read_trace(tmp_path / "x", "canonical", "h")
    with pytest.raises(TraceError, match="no such trace file"):
        read_trace(tmp_path / "x", "canonical")


def test_template_sessions_ticks_and_gpu_count_from_utilisations(tmp_path):
    template = {"sessions": [{
        "id": "s1", "start_tick": 1, "stop_tick": 10,
        "trainings": [
            {"start_tick": 2, "duration_in_ticks": 3, "cpus": 100, "memory": 99.5, "vram": 1,
             "gpus": 1, "gpu_utilizations": [{"utilization": 5}, {"utilization": 5}]},
            {"start_tick": 6, "duration_in_ticks": 1, "millicpus": 300, "memory": 10,
             "num_gpus": 1},
        ]}]}
    w = read_trace(write(tmp_path, "t.json", json.dumps(template)), "template")
    (session,) = w.sessions
    assert (session.start, session.stop) == (60, 600)
    assert [(t.submit, t.duration, t.gpus) for t in session.tasks] == [(120, 180, 2), (360, 60, 1)]
    assert session.request.gpus == 2 and session.request.millicpus == 300
    assert session.request.memory_mb == 100


def test_template_errors_name_the_session(tmp_path):
    bad = {"sessions": [{"id": "s", "start_tick": 1, "stop_tick": 5,
                         "trainings": [{"duration_in_ticks": 1}]}]}
    with pytest.raises(TraceError, match="session #0: malformed"):
        read_trace(write(tmp_path, "t.json", json.dumps(bad)), "template")
    with pytest.raises(TraceError, match="not a readable JSON"):
        read_trace(write(tmp_path, "u.json", "{"), "template")
