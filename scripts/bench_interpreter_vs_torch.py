#!/usr/bin/env python3
# Compares one training step (forward, backward, AdamW) of the reference interpreter with the
# same step in PyTorch on the same CPU thread, for the small CNN and a small HAE; prints the
# median seconds of each and their ratio. A benchmark, not a test: no pass/fail.
#
# Needs Debian's PyTorch (scripts/install-deps.sh --bench) and a built ipupod_models_bench:
#   /usr/bin/python3 scripts/bench_interpreter_vs_torch.py BUILD_DIR/models/ipupod_models_bench
# The configurations mirror bench_options() in pod/cli/bench_models.cpp.
import re
import statistics
import subprocess
import sys
import time

import torch

from bench_step_torch import make_step  # the PyTorch models, shared with `ipupod bench step`

REPEATS = 5
CONFIGS = {"cnn": (16, 1.0), "hae": (2, 0.25)}  # micro-batch, width


def torch_step_seconds(model):
    step, params = make_step(model, *CONFIGS[model])
    step()  # warm-up
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), params


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: bench_interpreter_vs_torch.py PATH/TO/ipupod_models_bench")
    torch.set_num_threads(1)  # the interpreter runs on one thread
    print("%-5s %12s %12s %10s %14s" % ("model", "interp_s", "torch_s", "ratio", "parameters"))
    for model in ("cnn", "hae"):
        out = subprocess.run([sys.argv[1], "step", "--model", model, "--repeats", str(REPEATS)],
                             check=True, capture_output=True, text=True).stdout
        interp = float(re.search(r"median_step_s=([0-9.eE+-]+)", out).group(1))
        interp_params = int(re.search(r"parameters=(\d+)", out).group(1))
        t, params = torch_step_seconds(model)
        note = "" if params == interp_params else "  (parameter counts differ: %d here)" % params
        print("%-5s %12.4f %12.4f %9.1fx %14d%s" % (model, interp, t, interp / t, interp_params, note))


if __name__ == "__main__":
    main()
