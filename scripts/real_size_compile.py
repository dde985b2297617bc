#!/usr/bin/env python3
"""Compiles the full-size models of the real-size goals and prints, per stage, the tile memory
beside the emulator's own compile time and peak host memory, as a Markdown table.

    real_size_compile.py [--ipupod BIN] [--only SUBSTRING] [--out DIR]

Each configuration is one `ipupod compile` (all its stages in one process; each stage's host
peak is its own), on one thread (`--threads 1`: the goal is for one core). The goal per
stage: at most 60 s, and a host peak of at most twice the stage's tile memory + 512 MiB.
"""
import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MIB = 1 << 20
EFFNET = ["--model", "efficientnetv2_s", "--micro-batch", "2", "--arch", "mk2"]
RESNET = ["--model", "resnet50", "--classes", "1000", "--stages", "4", "--arch", "mk2",
          "--precision", "fp16"]
CONFIGS = [
    ("ResNet-50 mb1 /4", RESNET + ["--micro-batch", "1"]),
    ("ResNet-50 mb4 /4", RESNET + ["--micro-batch", "4"]),
    ("EfficientNetV2-S fp16 /2", EFFNET + ["--stages", "2", "--precision", "fp16"]),
    ("EfficientNetV2-S fp32 /2", EFFNET + ["--stages", "2", "--precision", "fp32"]),
    ("EfficientNetV2-S fp16 /4", EFFNET + ["--stages", "4", "--precision", "fp16"]),
    ("EfficientNetV2-S fp16 /8", EFFNET + ["--stages", "8", "--precision", "fp16"]),
    ("EfficientNetV2-S fp16 /2 --recompute",
     EFFNET + ["--stages", "2", "--precision", "fp16", "--recompute"]),
    ("EfficientNetV2-S fp32 /2 --recompute",
     EFFNET + ["--stages", "2", "--precision", "fp32", "--recompute"]),
]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ipupod", default="build/release/pod/ipupod",
                        help="the ipupod binary (default: %(default)s)")
    parser.add_argument("--only", default="", help="run the configurations naming this")
    parser.add_argument("--out", help="keep each configuration's run directory under DIR")
    args = parser.parse_args()
    if not Path(args.ipupod).is_file():
        print(f"real_size_compile.py: error: no ipupod binary at {args.ipupod}; build it "
              "(cmake --build) or pass --ipupod", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="ipupod-real-size-"))
    print("| configuration | stage | tile memory | fits | compile s | host peak | budget | "
          "within |")
    print("|---|---|---|---|---|---|---|---|")
    failed = False
    for name, options in CONFIGS:
        if args.only not in name:
            continue
        run_dir = out / name.replace(" ", "_").replace("/", "of").replace("--", "")
        start = time.monotonic()
        done = subprocess.run([args.ipupod, "compile", *options, "--threads", "1",
                               "--run-dir", str(run_dir)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if not (run_dir / "compile.json").is_file():  # a stage that does not fit is no failure
            failed = True
            last = done.stderr.strip().splitlines()[-1:] or ["(nothing on stderr)"]
            print(f"| {name} | - | failed ({done.returncode}): {last[0]} | | "
                  f"{time.monotonic() - start:.0f} | | | |")
            continue
        report = json.loads((run_dir / "compile.json").read_text())
        for s in report["stages"]:
            tile = s["total_bytes"] / MIB
            seconds = s["compile_seconds"]["lower"] + s["compile_seconds"]["engine"]
            peak = s["host_memory"]["peak_resident_bytes"] / MIB
            budget = 2 * tile + 512
            within = seconds <= 60 and peak <= budget
            print(f"| {name} | {s['stage']} | {tile:,.1f} MiB | {'yes' if s['fits'] else 'no'} | "
                  f"{seconds:.1f} | {peak:,.0f} MiB | {budget:,.0f} MiB | "
                  f"{'yes' if within else 'no'} |", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
