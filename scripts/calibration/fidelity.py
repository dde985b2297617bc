#!/usr/bin/env python3
"""Checks ipupod's predictions against public IPU measurements: one row per published figure
(scripts/calibration/published.json) with its configuration, the published and the predicted
throughput and the error, then the median absolute error and the scaling trend (each
configuration's throughput relative to the smallest pod of its model and architecture).

    /usr/bin/python3 scripts/calibration/fidelity.py [--ipupod BIN] [--work DIR]
        [--set FIELD=VALUE ...] [--markdown FILE] [--only ID ...]

Rows that share a model, architecture, stage count, micro-batch and precision are one
`ipupod estimate` (its compiled stages timed on every topology, replica count and accumulation
of the group, see --sweep-topologies). --set overrides architecture preset fields (e.g.
vertex_overhead_cycles=120) through a preset file based on each row's architecture: fit.py
uses it. Exit code 0, or 2 on bad input.
"""
import argparse
import csv
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


def fail(message):
    print(f"fidelity.py: error: {message}", file=sys.stderr)
    sys.exit(2)


def load_rows(path, only):
    try:
        rows = json.loads(Path(path).read_text())["rows"]
    except (OSError, ValueError, KeyError) as e:
        fail(f"cannot read the published figures from {path}: {e}")
    if only:
        unknown = set(only) - {r["id"] for r in rows}
        if unknown:
            fail(f"unknown row id(s) {', '.join(sorted(unknown))}; see {path}")
        rows = [r for r in rows if r["id"] in only]
    return rows


def parse_overrides(items):
    out = {}
    for item in items or []:
        if "=" not in item:
            fail(f"--set expects FIELD=VALUE, got '{item}'")
        key, value = item.split("=", 1)
        try:
            number = float(value)
        except ValueError:
            fail(f"--set {key}: '{value}' is not a number")
        out[key] = int(number) if number.is_integer() else number
    return out


GROUP_KEYS = ("model", "arch", "stages", "micro_batch", "precision", "partials_type")


def groups_of(rows):
    groups = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in GROUP_KEYS), []).append(r)
    return groups


def arch_argument(arch, overrides, work):
    """The --arch value: the preset's name, or a preset file with the overrides."""
    if not overrides:
        return arch
    trial = "-".join(f"{k}{v}" for k, v in sorted(overrides.items()))
    path = work / f"{arch}-{trial}.json"
    path.write_text(json.dumps({"base": arch, "name": f"{arch} with {overrides}", **overrides,
                                "sources": [f"calibration trial: {overrides}"]}))
    return str(path)


def joined(values):
    return ",".join(str(v) for v in sorted(set(values)))


def estimate_group(ipupod, key, rows, overrides, work):
    """Runs one estimate for the rows of a group; returns {row id: predicted samples/s}."""
    model, arch, stages, micro_batch, precision, partials = key
    trial = "-".join(f"{k}{v}" for k, v in sorted(overrides.items())) or "presets"
    run_dir = work / f"{rows[0]['id']}-{trial}"
    command = [ipupod, "estimate", "--model", model, "--arch", arch_argument(arch, overrides, work),
               "--stages", str(stages), "--micro-batch", str(micro_batch),
               "--precision", precision, "--partials-type", partials,
               "--sweep-topologies", joined(r["topology"] for r in rows),
               "--sweep-replicas", joined(r["replicas"] for r in rows),
               "--sweep-gradient-accumulation", joined(r["gradient_accumulation"] for r in rows),
               "--sweep-device-iterations", joined(r["device_iterations"] for r in rows),
               "--run-dir", str(run_dir)]
    start = time.monotonic()
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # Exit 1 is an estimate of a job that does not fit: its figures are "if it fit".
    if done.returncode not in (0, 1) or not (run_dir / "estimate.csv").exists():
        fail(f"{' '.join(command)} failed with exit code {done.returncode}:\n{done.stdout[-3000:]}")
    print(f"  {model} on {arch}: {time.monotonic() - start:.0f} s", file=sys.stderr)
    predicted = {}
    with open(run_dir / "estimate.csv") as f:
        table = list(csv.DictReader(f))
    for r in rows:
        match = [t for t in table if t["topology"] == r["topology"]
                 and int(t["replicas"]) == r["replicas"]
                 and int(t["gradient_accumulation"]) == r["gradient_accumulation"]
                 and int(t["device_iterations"]) == r["device_iterations"]]
        if len(match) != 1:
            fail(f"{r['id']}: {len(match)} rows of {run_dir / 'estimate.csv'} match it")
        predicted[r["id"]] = {"samples_per_s": float(match[0]["predicted_samples_per_s"]),
                              "bound": match[0]["bound"], "fits": match[0]["fits"]}
    return predicted


def evaluate(rows, overrides=None, ipupod=None, work=None):
    """{row id: prediction} for the rows, with the preset overrides."""
    ipupod = ipupod or str(ROOT / "build" / "release" / "pod" / "ipupod")
    work = Path(work or "calibration-work")
    work.mkdir(parents=True, exist_ok=True)
    predicted = {}
    for key, group in groups_of(rows).items():
        predicted.update(estimate_group(ipupod, key, group, overrides or {}, work))
    return predicted


def error(row, predicted):
    return predicted[row["id"]]["samples_per_s"] / row["published_samples_per_s"] - 1


def table(rows, predicted):
    """The report as markdown lines, and the median absolute error."""
    lines = ["| figure | configuration | published | predicted | error | bound |",
             "|---|---|---|---|---|---|"]
    errors = []
    for r in rows:
        p = predicted[r["id"]]
        e = error(r, predicted)
        errors.append(abs(e))
        config = (f"{r['model']} {r['arch']} {r['topology']}: {r['replicas']} x {r['stages']} IPUs, "
                  f"mb {r['micro_batch']}, GA {r['gradient_accumulation']}, "
                  f"{r['precision']}/{r['partials_type']} partials")
        lines.append(f"| {r['id']} | {config} | {r['published_samples_per_s']:,.0f} | "
                     f"{p['samples_per_s']:,.0f} | {100 * e:+.1f}% | {p['bound']} |")
    median = statistics.median(errors) if errors else float("nan")
    lines.append("")
    lines.append(f"Median absolute error: {100 * median:.1f}% over {len(errors)} figures.")
    # The scaling trend: throughput relative to the group's smallest pod, published vs predicted.
    trend = ["", "| figure | published vs smallest pod | predicted vs smallest pod |", "|---|---|---|"]
    for (model, arch), group in sorted({(r["model"], r["arch"]): None for r in rows}.items()):
        members = sorted((r for r in rows if r["model"] == model and r["arch"] == arch),
                         key=lambda r: r["replicas"] * r["stages"])
        if len(members) < 2:
            continue
        base = members[0]
        for r in members[1:]:
            trend.append(f"| {r['id']} | {r['published_samples_per_s'] / base['published_samples_per_s']:.2f}x | "
                         f"{predicted[r['id']]['samples_per_s'] / predicted[base['id']]['samples_per_s']:.2f}x |")
    if len(trend) > 3:
        lines += trend
    return lines, median


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ipupod", default=str(ROOT / "build" / "release" / "pod" / "ipupod"),
                        help="the ipupod binary (default: build/release/pod/ipupod)")
    parser.add_argument("--published", default=str(HERE / "published.json"))
    parser.add_argument("--work", default="calibration-work",
                        help="directory for the estimates' run directories")
    parser.add_argument("--set", action="append", metavar="FIELD=VALUE",
                        help="override an architecture preset field for every row")
    parser.add_argument("--only", nargs="+", metavar="ID", help="only these rows")
    parser.add_argument("--markdown", help="also write the table to this file")
    args = parser.parse_args()
    if not Path(args.ipupod).is_file():
        fail(f"no ipupod binary at {args.ipupod}; build it or give --ipupod")
    rows = load_rows(args.published, args.only)
    predicted = evaluate(rows, parse_overrides(args.set), args.ipupod, args.work)
    lines, _ = table(rows, predicted)
    print("\n".join(lines))
    if args.markdown:
        Path(args.markdown).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
