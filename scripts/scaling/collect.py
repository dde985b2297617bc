#!/usr/bin/env python3
"""Reads ipupod run directories (summary.json, memory.json) into the scaling CSV: one row per
configuration, the measured emulator throughput as the median over its repeated runs.

    collect.py RUN_DIR... --csv OUT.csv
"""
import argparse
import csv
import json
import statistics
import sys
from pathlib import Path

COLUMNS = [
    "model", "arch", "topology", "replicas", "stages", "gradient_accumulation",
    "device_iterations", "ipus", "micro_batch", "global_batch", "runs",
    "measured_samples_per_s", "measured_min", "measured_max", "predicted_ipu_samples_per_s",
    "memory_peak_bytes_per_ipu", "busiest_tile_bytes", "predicted_compute_s",
    "predicted_exchange_s", "predicted_sync_s", "predicted_fabric_s", "predicted_host_s",
    "run_dirs",
]
KEY = ("model", "arch", "topology", "replicas", "stages", "gradient_accumulation",
       "device_iterations", "micro_batch", "hidden", "data")


def fail(message):
    print(f"collect.py: error: {message}", file=sys.stderr)
    sys.exit(2)


def load(run_dir):
    summary_path, memory_path = run_dir / "summary.json", run_dir / "memory.json"
    for path in (summary_path, memory_path):
        if not path.is_file():
            fail(f"{path} is missing: is {run_dir} the --run-dir of a finished ipupod train?")
    try:
        summary = json.loads(summary_path.read_text())
        memory = json.loads(memory_path.read_text())
    except json.JSONDecodeError as e:
        fail(f"{run_dir}: not valid JSON ({e})")
    try:
        config = summary["config"]
        step = summary["predicted_seconds_per_host_step"]
        return {
            "key": tuple(str(config.get(k)) if not isinstance(config.get(k), list) else
                         "x".join(map(str, config[k])) for k in KEY),
            "config": config,
            "measured": float(summary["measured_samples_per_s"]),
            "predicted": float(summary["predicted_ipu_samples_per_s"]),
            "memory": max(int(ipu["total_bytes"]) for ipu in memory),
            "busiest": max(int(ipu["busiest_tile_bytes"]) for ipu in memory),
            "step": {part: float(step[part])
                     for part in ("compute", "exchange", "sync", "fabric", "host")},
            "dir": str(run_dir),
        }
    except (KeyError, TypeError, ValueError) as e:
        fail(f"{run_dir}: summary.json or memory.json lacks a field ({e!r}); was it written by "
             "this version of ipupod?")


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="+", type=Path, help="run directories of ipupod train")
    parser.add_argument("--csv", required=True, type=Path, help="CSV file to write")
    args = parser.parse_args()

    groups = {}
    for run_dir in args.run_dirs:
        run = load(run_dir)
        groups.setdefault(run["key"], []).append(run)
    rows = []
    for runs in groups.values():
        config, first = runs[0]["config"], runs[0]
        measured = [r["measured"] for r in runs]
        rows.append({
            "model": config["model"], "arch": config["arch"], "topology": config["topology"],
            "replicas": config["replicas"], "stages": config["stages"],
            "gradient_accumulation": config["gradient_accumulation"],
            "device_iterations": config["device_iterations"],
            "ipus": config["replicas"] * config["stages"], "micro_batch": config["micro_batch"],
            "global_batch": config["global_batch"], "runs": len(runs),
            "measured_samples_per_s": f"{statistics.median(measured):.6g}",
            "measured_min": f"{min(measured):.6g}", "measured_max": f"{max(measured):.6g}",
            # The cycle model is deterministic; the repeats agree, the median is any of them.
            "predicted_ipu_samples_per_s":
                f"{statistics.median(r['predicted'] for r in runs):.6g}",
            "memory_peak_bytes_per_ipu": max(r["memory"] for r in runs),
            "busiest_tile_bytes": max(r["busiest"] for r in runs),
            **{f"predicted_{part}_s": f"{first['step'][part]:.6g}"
               for part in ("compute", "exchange", "sync", "fabric", "host")},
            "run_dirs": " ".join(r["dir"] for r in runs),
        })
    rows.sort(key=lambda r: (r["model"], r["stages"], r["gradient_accumulation"],
                             r["device_iterations"], r["ipus"]))
    args.csv.parent.mkdir(parents=True, exist_ok=True)
    with args.csv.open("w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    print(f"collect.py: wrote {args.csv} ({len(rows)} configurations from "
          f"{len(args.run_dirs)} runs)")


if __name__ == "__main__":
    main()
