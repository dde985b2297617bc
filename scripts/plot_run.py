#!/usr/bin/env python3
"""Draws the plots of a finished `ipupod train` run directory, beside it (or into --out-dir):

  loss.png            the training loss of every host step (metrics.csv) with each epoch's mean
                      train loss and test loss, the other columns of metrics.csv (measured
                      samples/s) and each epoch's test scores (accuracy, PSNR, ...; summary.json),
                      one panel per quantity against the host step
  memory-ipu<N>.png   per IPU, every pipeline stage (memory.json): a per-tile memory map in the
                      manner of PopVision's memory view, bytes per category stacked per tile
                      (code, vertex state, weights, optimizer state, the not-always-live bytes
                      live at the tile's peak, and the gaps of the liveness-aware layout, which
                      add up to the tile's total) against the tile capacity

    /usr/bin/python3 scripts/plot_run.py RUN_DIR [--out-dir DIR] [--max-ipus N]

Bad input (a missing directory, a missing, empty or malformed metrics.csv or memory.json) is
reported on one line and exits with code 2.
"""
import argparse
import csv
import json
import sys
from pathlib import Path

PROG = "plot_run.py"


def fail(message):
    print(f"{PROG}: error: {message}", file=sys.stderr)
    sys.exit(2)


try:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
except ImportError as e:
    fail(f"cannot import matplotlib ({e}); install Debian's python3-matplotlib and run this "
         "script with /usr/bin/python3")

FIXED_COLUMNS = ("epoch", "step")  # metrics.csv's position columns; the rest are plotted
# The stack of a tile, bottom to top: (key, label, colour). Keys other than code, vertex_state
# and gaps are memory categories, taken at the tile's peak of live bytes.
STACK = [("code", "code", "#7f7f7f"),
         ("vertex_state", "vertex state", "#bcbd22"),
         ("weight", "weights", "#1f77b4"),
         ("optimizer_state", "optimizer state", "#17becf"),
         ("activation", "activations (live at peak)", "#ff7f0e"),
         ("stream", "stream buffers (live at peak)", "#9467bd"),
         ("temporary", "temporaries (live at peak)", "#d62728"),
         ("gaps", "gaps (layout fragmentation)", "#e7ba52")]
# Scores drawn as a dashed reference on another score's panel.
REFERENCE_OF = {"mean_predictor_mae": "test_mae", "input_psnr_db": "test_psnr_db"}
# The scores' panels in this order (others after them, by name).
SCORE_LABELS = {"test_accuracy": "test accuracy (%)", "test_psnr_db": "test PSNR (dB)",
                "test_mae": "test MAE", "test_mse": "test MSE",
                "compression_ratio": "compression ratio (x)",
                "input_psnr_db": "the input's PSNR (dB)",
                "mean_predictor_mae": "MAE predicting the mean"}
COLUMN_LABELS = {"measured_samples_per_s": "measured samples/s\n(emulator, cumulative)"}
EPOCH_FIELDS = {"epoch", "train_loss", "test_loss", "test_samples", "measured_samples_per_s",
                "predicted_samples_per_s"}


def size_text(n):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def missing(path):
    return "not a regular file" if path.exists() else "no such file"


def read_metrics(path):
    """Returns the columns of metrics.csv by name, as lists of floats, checked."""
    hint = "a finished `ipupod train --run-dir DIR` writes it"
    if not path.is_file():
        fail(f"{path}: {missing(path)} (expected the per-step metrics.csv; {hint})")
    try:
        with path.open(newline="") as f:
            rows = list(csv.reader(f))
    except (OSError, ValueError, csv.Error) as e:
        fail(f"cannot read {path}: {getattr(e, 'strerror', None) or e} (expected a readable "
             "text CSV; check its permissions, or re-run the training)")
    if not rows or not any(field.strip() for field in rows[0]):
        fail(f"{path} is empty (expected a header such as epoch,step,loss,... and one row per "
             f"host step; {hint}, re-run it or check the disk)")
    header = [name.strip() for name in rows[0]]
    if not set(header) - set(FIXED_COLUMNS):
        fail(f"{path}: header {','.join(header)} has no quantity to plot (expected e.g. "
             "epoch,step,loss,measured_samples_per_s)")
    columns = {name: [] for name in header}
    for line, row in enumerate(rows[1:], start=2):
        if not row:
            continue
        if len(row) != len(header):
            fail(f"{path}:{line}: expected {len(header)} fields ({','.join(header)}), got "
                 f"{len(row)}: '{','.join(row)[:60]}' (a truncated file? re-run the training)")
        for name, value in zip(header, row):
            try:
                columns[name].append(float(value))
            except ValueError:
                fail(f"{path}:{line}: column {name}: expected a number, got '{value[:40]}'")
    if not columns[header[0]]:
        fail(f"{path} has the header {','.join(header)} but no rows (expected one per host "
             "step; did the run stop before its first step?)")
    return columns


def read_summary(path):
    """summary.json's per-epoch metrics and configuration, or ([], {}) with a note: optional."""
    try:
        summary = json.loads(path.read_text())
        epochs = summary.get("epochs", [])
        if isinstance(epochs, list) and all(isinstance(e, dict) for e in epochs):
            return epochs, summary.get("config", {})
        reason = "its 'epochs' is not a list of objects"
    except FileNotFoundError:
        reason = "no such file"
    except (OSError, ValueError, AttributeError) as e:
        reason = f"unreadable: {e}"
    print(f"{PROG}: note: {path}: {reason}; loss.png shows the train loss per step only",
          file=sys.stderr)
    return [], {}


def epoch_ends(epochs_column):
    """The host step (1-based) that ends each epoch, by metrics.csv's 0-based epoch number."""
    ends = {}
    for index, epoch in enumerate(epochs_column, start=1):
        ends[int(epoch)] = index
    return ends


def plot_loss(run_dir, metrics, out):
    epochs, config = read_summary(run_dir / "summary.json")
    steps = list(range(1, len(next(iter(metrics.values()))) + 1))
    ends = epoch_ends(metrics["epoch"]) if "epoch" in metrics else {}
    quantities = [name for name in metrics if name not in FIXED_COLUMNS]
    loss_column = "loss" if "loss" in quantities else quantities[0]
    quantities.remove(loss_column)
    order = list(SCORE_LABELS)
    scores = sorted({k for e in epochs for k, v in e.items() if is_number(v)} - EPOCH_FIELDS -
                    set(REFERENCE_OF),
                    key=lambda k: (order.index(k) if k in order else len(order), k))
    # The epochs of summary.json at the host step that ends them (epoch k = metrics.csv's k-1).
    at_end = [(ends[e["epoch"] - 1], e) for e in epochs
              if isinstance(e.get("epoch"), int) and e["epoch"] - 1 in ends]

    panels = 1 + len(quantities) + len(scores)
    fig, axes = plt.subplots(panels, 1, figsize=(9, 1.2 + 2.4 * panels), sharex=True,
                             squeeze=False)
    axes = [row[0] for row in axes]
    ax = axes[0]
    ax.plot(steps, metrics[loss_column], color="C0", linewidth=0.8, alpha=0.6,
            label=f"train {loss_column}, per host step")
    for key, marker, colour in (("train_loss", "o", "C0"), ("test_loss", "s", "C3")):
        points = [(x, e[key]) for x, e in at_end if is_number(e.get(key))]
        if points:
            ax.plot(*zip(*points), marker=marker, color=colour, linewidth=1.5,
                    label=f"{key.replace('_', ' ')}, per epoch")
    ax.set_ylabel("loss")
    ax.legend(fontsize=8)
    for ax, name in zip(axes[1:], quantities):
        ax.plot(steps, metrics[name], color="C2", linewidth=1)
        ax.set_ylabel(COLUMN_LABELS.get(name, name.replace("_", " ")))
    for ax, name in zip(axes[1 + len(quantities):], scores):
        scale = 100 if name == "test_accuracy" else 1
        for key, style in [(name, "o-")] + [(r, "s--") for r, of in REFERENCE_OF.items()
                                            if of == name]:
            points = [(x, e[key] * scale) for x, e in at_end if is_number(e.get(key))]
            if points:
                ax.plot(*zip(*points), style, color="C1" if key == name else "grey",
                        label=SCORE_LABELS.get(key, key.replace("_", " ")) + ", per epoch")
        ax.set_ylabel(SCORE_LABELS.get(name, name.replace("_", " ")))
        if len(ax.get_lines()) > 1:
            ax.legend(fontsize=8)
    for ax in axes:
        ax.grid(True, alpha=0.3)
        for end in list(ends.values())[:-1]:
            ax.axvline(end + 0.5, color="grey", linestyle=":", linewidth=0.8)
    batch = config.get("global_batch")
    axes[-1].set_xlabel("host step" + (f" ({batch} samples each)" if batch else "") +
                        ("; dotted lines: epoch ends" if len(ends) > 1 else ""))
    what = ", ".join(f"{config[k]}" for k in ("model", "arch") if k in config)
    layout = (f", {config['replicas']} replica(s) x {config['stages']} stage(s)"
              if "replicas" in config and "stages" in config else "")
    title = f"{run_dir.name}: {what}{layout}" if what else run_dir.name
    fig.suptitle(title)
    fig.tight_layout()
    save(fig, out, f"loss and metrics of {title}")


def field(obj, key, kind, where):
    """obj[key], checked to be of `kind`; a clear error otherwise."""
    if not isinstance(obj, dict):
        fail(f"{where}: expected a JSON object, got {type(obj).__name__}")
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, kind):
        got = "nothing" if key not in obj else f"{type(value).__name__} {str(value)[:30]}"
        fail(f"{where}: expected '{key}' ({kind.__name__}), got {got} (is it ipupod's "
             "memory.json?)")
    return value


def read_memory(path):
    """Returns [(ipu, replica or None, stage, report)] for every IPU of memory.json, every
    stage of a pipelined replica included (its later stages sit in "later_stages")."""
    hint = "a finished `ipupod train --run-dir DIR` writes it"
    if not path.is_file():
        fail(f"{path}: {missing(path)} (expected the per-IPU memory reports; {hint})")
    try:
        text = path.read_text()
    except (OSError, ValueError) as e:
        fail(f"cannot read {path}: {getattr(e, 'strerror', None) or e} (expected readable "
             "JSON text; check its permissions, or re-run the training)")
    if not text.strip():
        fail(f"{path} is empty (expected a JSON list of per-IPU memory reports; {hint})")
    try:
        reports = json.loads(text)
    except json.JSONDecodeError as e:
        fail(f"{path}: expected a JSON list of per-IPU memory reports, got invalid JSON at line "
             f"{e.lineno} column {e.colno} ({e.msg}; a truncated file? re-run the training)")
    if not isinstance(reports, list) or not reports:
        got = "an empty list" if reports == [] else type(reports).__name__
        fail(f"{path}: expected a non-empty JSON list of per-IPU memory reports, got {got}")
    ipus = []
    for index, report in enumerate(reports):
        where = f"{path} entry {index}"
        if not isinstance(report, dict):
            fail(f"{where}: expected a JSON object (one IPU's report), got "
                 f"{type(report).__name__}")
        stage = field(report, "stage", int, where) if "stage" in report else 0
        ipu = field(report, "ipu", int, where) if "ipu" in report else len(ipus)
        replica = field(report, "replica", int, where) if "replica" in report else None
        ipus.append((ipu, replica, stage, report))
        later = report.get("later_stages", [])
        if not isinstance(later, list):
            fail(f"{where}: expected 'later_stages' to be a list, got {type(later).__name__}")
        for k, stage_report in enumerate(later):
            s = field(stage_report, "stage", int, f"{where} later_stages {k}")
            ipus.append((ipu + s - stage, replica, s, stage_report))
    for ipu, replica, stage, report in ipus:
        where = f"{path} IPU {ipu}"
        for key in ("bytes_per_tile", "total_bytes", "capacity_bytes", "busiest_tile",
                    "busiest_tile_bytes"):
            field(report, key, int, where)
        field(report, "arch", str, where)
        tiles = field(report, "per_tile", list, where)
        if not tiles:
            fail(f"{where}: expected per-tile entries in 'per_tile', got an empty list")
        for tile in tiles:
            for key in ("tile", "total", "code", "vertex_state", "not_always_live", "peak_live"):
                field(tile, key, int, f"{where} per_tile")
            for key in ("peak_by_category", "by_category"):
                field(tile, key, dict, f"{where} per_tile")
    return sorted(ipus, key=lambda entry: entry[0])


def tile_stack(tile):
    """The bytes of one tile by STACK key, adding up to its total ("other" takes any rest)."""
    parts = {"code": tile["code"], "vertex_state": tile["vertex_state"],
             "gaps": max(tile["not_always_live"] - tile["peak_live"], 0)}
    for category, size in tile["peak_by_category"].items():
        parts[category] = parts.get(category, 0) + size
    parts["other"] = max(tile["total"] - sum(parts.values()), 0)
    return parts


def draw_stack(ax, x, stacks, keys):
    """Stacked bars of KiB per tile; returns each tile's top and the stack's legend handles."""
    bars = len(x) <= 128 and x == list(range(x[0], x[0] + len(x)))  # else one area per category
    edges = [x[0] - 0.5] + [t + 0.5 for t in x]  # of the areas (fast for thousands of tiles)
    bottom, handles = [0.0] * len(x), []
    for key, label, colour in keys:
        heights = [s.get(key, 0) / 1024 for s in stacks]
        if not any(heights):
            continue
        top = [b + h for b, h in zip(bottom, heights)]
        if bars:
            handles.append(ax.bar(x, heights, width=0.85, bottom=bottom, color=colour,
                                  linewidth=0, label=label))
        else:
            handles.append(ax.stairs(top, edges, baseline=bottom, fill=True, color=colour,
                                     label=label))
        bottom = top
    ax.set_xlim(min(x) - 0.5, max(x) + 0.5)
    ax.set_ylabel("KiB per tile")
    ax.grid(True, axis="y", alpha=0.3)
    return bottom, handles


def plot_memory(ipu, replica, stage, stages, report, out):
    tiles = sorted(report["per_tile"], key=lambda t: t["tile"])
    stacks = [tile_stack(t) for t in tiles]
    x = [t["tile"] for t in tiles]
    keys = list(STACK)
    keys += [(k, k.replace("_", " "), None) for k in sorted({k for s in stacks for k in s})
             if k not in {entry[0] for entry in STACK}]
    capacity = report["bytes_per_tile"]
    busiest = report["busiest_tile_bytes"]
    highest = max(t["total"] for t in tiles)
    zoom = 0 < highest < capacity / 2  # the bars are low against the capacity: zoom in below
    fig, axes = plt.subplots(2 if zoom else 1, 1, sharex=True, squeeze=False,
                             figsize=(min(16, 8 + len(x) / 200), 8 if zoom else 5.2))
    ax = axes[0][0]
    tops, stack = draw_stack(ax, x, stacks, keys)
    legend = [ax.axhline(capacity / 1024, color="black", linestyle="--", linewidth=1,
                         label=f"tile capacity ({size_text(capacity)})")]
    over = [t["tile"] for t in tiles if t["total"] > capacity]
    if over:  # marked: a single tile among thousands is thinner than a pixel
        legend += ax.plot(over, [max(tops) * 1.04] * len(over), "v", color="red", markersize=6,
                          label=f"over capacity ({len(over)} tile(s))")
    ax.set_ylim(0, max(max(tops), capacity / 1024) * 1.1)
    ax.legend(handles=legend + stack[::-1], fontsize=8, loc="upper left",
              bbox_to_anchor=(1.01, 1.0))  # the lines, then the stack top down
    if zoom:
        low = axes[1][0]
        draw_stack(low, x, stacks, keys)
        low.set_ylim(0, max(tops) * 1.1)
        low.set_title("the same, zoomed in (the capacity is off this scale)", fontsize=9)
    axes[-1][0].set_xlabel("tile")
    who = f"IPU {ipu}" + (f", replica {replica}" if replica is not None else "")
    who += f", pipeline stage {stage} (of {stages})" if stages > 1 else ""
    layers = report.get("layers")
    if isinstance(layers, list) and layers:
        who += f" ({', '.join(map(str, layers[:4]))}{', ...' if len(layers) > 4 else ''})"
    total, ipu_capacity = report["total_bytes"], report["capacity_bytes"]
    title = (f"{who} - arch {report['arch']}, {len(tiles)} tiles x {size_text(capacity)}\n"
             f"total {size_text(total)} of {size_text(ipu_capacity)} "
             f"({100 * total / max(ipu_capacity, 1):.1f}%); busiest tile "
             f"{report['busiest_tile']}: {size_text(busiest)} "
             f"({100 * busiest / max(capacity, 1):.0f}% of its capacity)"
             + (f"; {len(over)} tile(s) OVER capacity" if over else ""))
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    save(fig, out, "tile memory of " + title.replace("\n", "; "))


def save(fig, out, title):
    try:  # the title is also the PNG's Title text: `strings FILE` shows what it is
        fig.savefig(out, dpi=100, metadata={"Title": title, "Software": "ipupod plot_run.py"})
    except OSError as e:
        fail(f"cannot write {out}: {e.strerror or e} (check --out-dir and its permissions)")
    plt.close(fig)
    print(f"{PROG}: wrote {out}")


def ranges(numbers):
    """'3-5, 9' for [3, 4, 5, 9]."""
    spans = []
    for n in numbers:
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def plot_run(args):
    run_dir = args.run_dir
    if not run_dir.is_dir():
        fail(f"{run_dir}: no such directory (expected a run directory of `ipupod train "
             "--run-dir DIR`; check the path)")
    if args.max_ipus < 0:
        fail(f"--max-ipus: expected 0 (every IPU) or more, got {args.max_ipus}")
    metrics = read_metrics(run_dir / "metrics.csv")  # both read first: no half-done output
    ipus = read_memory(run_dir / "memory.json")
    out_dir = args.out_dir or run_dir
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        fail(f"cannot create --out-dir {out_dir}: {e.strerror or e} (choose a writable directory)")

    plot_loss(run_dir, metrics, out_dir / "loss.png")
    stages = {}
    for ipu, replica, stage, report in ipus:
        stages[replica] = max(stages.get(replica, 1), stage + 1)
    shown = ipus if args.max_ipus == 0 else ipus[:args.max_ipus]
    for ipu, replica, stage, report in shown:
        plot_memory(ipu, replica, stage, stages[replica], report,
                    out_dir / f"memory-ipu{ipu}.png")
    if len(shown) < len(ipus):
        skipped = [entry[0] for entry in ipus[len(shown):]]
        print(f"{PROG}: skipped the memory maps of {len(skipped)} of {len(ipus)} IPUs "
              f"(IPU {ranges(skipped)}): --max-ipus {args.max_ipus}; --max-ipus 0 draws every one")


def main():
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", metavar="RUN_DIR", type=Path,
                        help="the run directory (ipupod train --run-dir) with metrics.csv, "
                             "memory.json and, optionally, summary.json")
    parser.add_argument("--out-dir", type=Path, help="where the PNGs go (default: RUN_DIR)")
    parser.add_argument("--max-ipus", type=int, default=16, metavar="N",
                        help="memory maps of the first N IPUs only (default 16; 0: every IPU)")
    parser.error = lambda message: fail(f"{message} (see --help)")  # one line, exit 2
    args = parser.parse_args()
    try:
        plot_run(args)
    except Exception as e:  # noqa: BLE001 (one line, never a traceback)
        fail(f"unexpected {type(e).__name__} while plotting {args.run_dir}: {e} (are "
             "metrics.csv and memory.json ipupod's? check them, or report this)")


if __name__ == "__main__":
    main()
