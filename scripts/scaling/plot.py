#!/usr/bin/env python3
"""Plots a scaling CSV of scripts/scaling/sweep.sh: throughput and scaling efficiency against
the number of IPUs, the emulator's measured figures and the cycle model's predicted IPU figures
side by side, one line per (stages, gradient accumulation, device iterations) group. A CSV of
`ipupod estimate --sweep-*` (predicted figures only) gets the predicted panels alone.

    /usr/bin/python3 scripts/scaling/plot.py sweep.csv --out-dir plots [--title TEXT]

Scaling efficiency of n IPUs = (throughput(n) / throughput(n0)) / (n / n0), n0 being the
smallest IPU count of the group: 1.0 is perfect linear scaling.
"""
import argparse
import csv
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402


def fail(message):
    print(f"plot.py: error: {message}", file=sys.stderr)
    sys.exit(2)


def read_groups(path):
    """Returns the groups' points (ipus, measured or None, predicted) and whether the CSV has
    measured figures (sweep.sh) or only predicted ones (ipupod estimate)."""
    if not path.is_file():
        fail(f"{path}: no such file (make it with scripts/scaling/sweep.sh or ipupod estimate)")
    groups = {}
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        columns = set(reader.fieldnames or [])
        measured = "measured_samples_per_s" in columns
        predicted = "predicted_ipu_samples_per_s" if measured else "predicted_samples_per_s"
        needed = {"model", "ipus", "stages", "gradient_accumulation", "device_iterations",
                  predicted}
        missing = needed - columns
        if missing:
            fail(f"{path} lacks the columns {sorted(missing)}; is it a sweep.sh or an "
                 "ipupod estimate CSV?")
        for line, row in enumerate(reader, start=2):
            try:
                point = (int(row["ipus"]),
                         float(row["measured_samples_per_s"]) if measured else None,
                         float(row[predicted]))
            except ValueError as e:
                fail(f"{path}:{line}: {e}")
            label = (f"{row['model']} S={row['stages']} GA={row['gradient_accumulation']} "
                     f"DI={row['device_iterations']}")
            groups.setdefault(label, []).append(point)
    if not groups:
        fail(f"{path} has no rows")
    return {label: sorted(points) for label, points in groups.items()}, measured


def efficiency(points, column):
    n0, base = points[0][0], points[0][column]
    return [(p[column] / base) / (p[0] / n0) for p in points]


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", type=Path, help="CSV written by sweep.sh")
    parser.add_argument("--out-dir", type=Path, default=Path("."), help="where the PNGs go")
    parser.add_argument("--title", default="", help="title prefix, e.g. the model and arch")
    parser.add_argument("--dpi", type=int, default=80)
    args = parser.parse_args()
    groups, measured = read_groups(args.csv)
    args.out_dir.mkdir(parents=True, exist_ok=True)

    if measured:
        fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
        throughput_measured, throughput_predicted, scaling = axes
    else:
        fig, axes = plt.subplots(1, 2, figsize=(10, 4.5))
        throughput_measured = None
        throughput_predicted, scaling = axes
    ipu_counts = sorted({p[0] for points in groups.values() for p in points})
    for index, (label, points) in enumerate(groups.items()):
        color = f"C{index % 10}"  # one colour per group: solid measured, dashed predicted
        ipus = [p[0] for p in points]
        if measured:
            throughput_measured.plot(ipus, [p[1] for p in points], "o-", color=color,
                                     label=label)
            scaling.plot(ipus, efficiency(points, 1), "o-", color=color,
                         label=f"{label} measured (emulator)")
        throughput_predicted.plot(ipus, [p[2] for p in points], "s--", color=color, label=label)
        scaling.plot(ipus, efficiency(points, 2), "s--", color=color,
                     label=f"{label} predicted (IPU)")
    panels = [(throughput_predicted, "Predicted: real IPUs (cycle model)", "samples/s"),
              (scaling, "Scaling efficiency", "efficiency vs the smallest size (1 = linear)")]
    if measured:
        panels.insert(0, (throughput_measured, "Measured: the emulator on this machine",
                          "samples/s"))
    for ax, title, ylabel in panels:
        ax.set_title(title)
        ax.set_xlabel("IPUs")
        ax.set_ylabel(ylabel)
        ax.set_xscale("log", base=2)
        ax.set_xticks(ipu_counts, [str(n) for n in ipu_counts])
        ax.grid(True, which="both", alpha=0.3)
    for ax in (throughput_measured, throughput_predicted):
        if ax is not None:
            ax.set_yscale("log")
    scaling.axhline(1.0, color="grey", linewidth=0.8)
    scaling.set_ylim(bottom=0)
    scaling.legend(fontsize=7)
    (throughput_measured or throughput_predicted).legend(fontsize=7)
    if args.title:
        fig.suptitle(args.title)
    fig.tight_layout()
    out = args.out_dir / "scaling.png"
    fig.savefig(out, dpi=args.dpi)
    print(f"plot.py: wrote {out}")


if __name__ == "__main__":
    main()
