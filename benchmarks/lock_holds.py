"""Print the Global Scheduler's lock holds recorded under NOTEBOOKOS_DEBUG_LOCK_HOLDS
(global_scheduler/lock_holds.py), merged over the given summaries (one per GS process).

    NOTEBOOKOS_DEBUG_LOCK_HOLDS=/tmp/holds/gs-{pid}.json .venv/bin/pytest tests/schedulers/...
    .venv/bin/python benchmarks/lock_holds.py /tmp/holds/*.json [--top 25] [--stacks]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("files", nargs="+")
    parser.add_argument("--top", type=int, default=25, help="sites shown, by max hold")
    parser.add_argument("--stacks", action="store_true", help="the sampled stacks of long holds")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    merged: dict[str, dict] = defaultdict(lambda: {"count": 0, "p50_ms": 0.0, "p99_ms": 0.0,
                                                   "max_ms": 0.0, "total_ms": 0.0,
                                                   "samples": []})
    for name in args.files:
        with open(name) as f:
            doc = json.load(f)
        for site, row in doc["sites"].items():
            m = merged[site]
            m["count"] += row["count"]
            m["total_ms"] += row["total_ms"]
            # the percentiles of merged files: the worst file's (an upper bound)
            for key in ("p50_ms", "p99_ms", "max_ms"):
                m[key] = max(m[key], row[key])
            m["samples"].extend(row["samples"])
    rows = sorted(merged.items(), key=lambda kv: -kv[1]["max_ms"])[:args.top]
    if args.json:
        print(json.dumps(dict(rows), indent=1))
        return
    print(f"{'site':70} {'count':>7} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>9}")
    for site, m in rows:
        print(f"{site[:70]:70} {m['count']:7d} {m['p50_ms']:8.3f} {m['p99_ms']:8.3f} "
              f"{m['max_ms']:9.1f}")
        if args.stacks:
            for s in sorted(m["samples"], key=lambda s: -s["held_ms_at_least"])[:2]:
                print(f"    held >= {s['held_ms_at_least']:.0f} ms (x{s['seen']}):")
                print("      " + s["stack"].rstrip().replace("\n", "\n      "))


if __name__ == "__main__":
    main()
