"""Writing a run's files: summary.json, tasks.csv, timeline.csv."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from notebookos.simulator.records import TASK_COLUMNS, TIMELINE_COLUMNS, RunRecord


def write_run(out_dir: Path, summary: dict, record: RunRecord) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    with (out_dir / "tasks.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(TASK_COLUMNS)
        writer.writerows(t.row() for t in record.tasks)
    with (out_dir / "timeline.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(TIMELINE_COLUMNS)
        writer.writerows(record.timeline)
