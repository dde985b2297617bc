#!/usr/bin/env python3
"""Fits the architecture constants that have no public source (exchange_latency_cycles,
sync_cycles_internal, vertex_overhead_cycles: one value each for every model and architecture)
to the public throughputs of scripts/calibration/published.json, with `ipupod estimate` as the
model: no second formula.

    /usr/bin/python3 scripts/calibration/fit.py [--ipupod BIN] [--work DIR]
        [--params NAME ...] [--markdown FILE]

Method: one estimate of every published configuration at the presets' values, one more per
parameter with that parameter doubled (finite differences of log throughput), then the values
that minimise the squared log errors of the linearised model within [0, 8x the preset] (a grid
search), and a last estimate at the fitted values to report what they really give (the
linearisation is checked, not trusted). Prints the fitted values, to be written into the
presets of ipu_process/arch.cpp with the table of docs/calibration.md. It takes about
(2 + parameters) full-size compiles per architecture of the published set.
"""
import argparse
import itertools
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fidelity  # noqa: E402

# The fitted parameters and their preset values (ipu_process/arch.cpp, the same for every
# hardware preset).
PRIORS = {"exchange_latency_cycles": 30, "sync_cycles_internal": 150, "vertex_overhead_cycles": 60}


def log_errors(rows, predicted):
    return [math.log(predicted[r["id"]]["samples_per_s"] / r["published_samples_per_s"])
            for r in rows]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ipupod", default=str(fidelity.ROOT / "build" / "release" / "pod" / "ipupod"))
    parser.add_argument("--published", default=str(fidelity.HERE / "published.json"))
    parser.add_argument("--work", default="calibration-work")
    parser.add_argument("--params", nargs="+", default=list(PRIORS), choices=list(PRIORS),
                        help="the parameters to fit (default: all)")
    parser.add_argument("--markdown", help="write the fitted table to this file")
    args = parser.parse_args()
    if not Path(args.ipupod).is_file():
        fidelity.fail(f"no ipupod binary at {args.ipupod}; build it or give --ipupod")
    rows = [r for r in fidelity.load_rows(args.published, None) if r.get("fit")]
    if len(rows) < len(args.params):
        fidelity.fail(f"{len(rows)} figures cannot fit {len(args.params)} parameters")

    prior = {p: PRIORS[p] for p in args.params}
    print(f"presets: {prior}", file=sys.stderr)
    base = log_errors(rows, fidelity.evaluate(rows, prior, args.ipupod, args.work))
    slopes = {}
    for p in args.params:
        trial = dict(prior, **{p: 2 * prior[p]})
        print(f"trial: {trial}", file=sys.stderr)
        moved = log_errors(rows, fidelity.evaluate(rows, trial, args.ipupod, args.work))
        slopes[p] = [(m - b) / prior[p] for m, b in zip(moved, base)]

    # Grid search of the linearised squared log errors within [0, 8x prior].
    steps = 33
    grids = {p: [8 * prior[p] * i / (steps - 1) for i in range(steps)] for p in args.params}
    best, best_cost = None, math.inf
    for values in itertools.product(*(grids[p] for p in args.params)):
        point = dict(zip(args.params, values))
        cost = sum((b + sum(slopes[p][i] * (point[p] - prior[p]) for p in args.params)) ** 2
                   for i, b in enumerate(base))
        if cost < best_cost:
            best, best_cost = point, cost
    fitted = {p: int(round(v)) for p, v in best.items()}
    print(f"fitted (linearised): {fitted}, RMS log error {math.sqrt(best_cost / len(base)):.3f}",
          file=sys.stderr)
    predicted = fidelity.evaluate(rows, fitted, args.ipupod, args.work)
    lines, median = fidelity.table(rows, predicted)
    lines = [f"Fitted values: {', '.join(f'{k} = {v}' for k, v in fitted.items())} "
             f"(presets: {', '.join(f'{k} = {v}' for k, v in prior.items())})", ""] + lines
    print("\n".join(lines))
    if args.markdown:
        Path(args.markdown).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
