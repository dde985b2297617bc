#!/usr/bin/env python3
# Compares one training step (forward, backward, AdamW) of the reference interpreter with the
# same step in PyTorch on the same CPU thread, for the small CNN and a small HAE; prints the
# median seconds of each and their ratio. A benchmark, not a test: no pass/fail.
#
# Needs Debian's PyTorch (sudo apt-get install python3-torch) and a built ipupod_models_bench:
#   /usr/bin/python3 scripts/bench_interpreter_vs_torch.py BUILD_DIR/models/ipupod_models_bench
# The configurations mirror bench_options() in pod/cli/bench_models.cpp.
import math
import re
import statistics
import subprocess
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

REPEATS = 5


class Cnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Dropout(0.25),
                                  nn.Linear(128, 10))

    def forward(self, x):
        return self.head(self.features(x))


class Gdn(nn.Module):
    def __init__(self, ch, inverse):
        super().__init__()
        self.inverse = inverse
        self.beta = nn.Parameter(torch.ones(ch))
        self.gamma = nn.Parameter(0.1 * torch.eye(ch))

    def forward(self, x):
        norm = F.conv2d(x * x, self.gamma[:, :, None, None], self.beta)
        return x * torch.sqrt(norm) if self.inverse else x * torch.rsqrt(norm)


class ResBlock(nn.Module):
    def __init__(self, cin, cout, k, s, up):
        super().__init__()
        self.gdn = Gdn(cin, up)
        if up:
            self.shortcut = nn.ConvTranspose2d(cin, cout, 1, s, output_padding=s - 1, bias=False)
            self.conv1 = nn.ConvTranspose2d(cin, cout, k, s, k // 2, output_padding=s - 1, bias=False)
        else:
            self.shortcut = nn.Conv2d(cin, cout, 1, s, bias=False)
            self.conv1 = nn.Conv2d(cin, cout, k, s, k // 2, bias=False)
        self.conv2 = nn.Conv2d(cout, 4 * cout, 1, bias=False)
        self.conv3 = nn.Conv2d(4 * cout, cout, 1, bias=False)

    def forward(self, x):
        h = self.gdn(x)
        return self.shortcut(h) + self.conv3(F.gelu(self.conv2(self.conv1(h))))


class Quantizer(nn.Module):
    def __init__(self, codes, dim, decay=0.99):
        super().__init__()
        self.decay = decay
        self.register_buffer("codebook", (torch.rand(codes, dim) * 2 - 1) / codes)
        self.register_buffer("cluster", torch.zeros(codes))
        self.register_buffer("embed_sum", torch.zeros(codes, dim))

    def forward(self, z):
        n, d, h, w = z.shape
        flat = z.permute(0, 2, 3, 1).reshape(-1, d)
        idx = torch.cdist(flat.detach(), self.codebook).argmin(1)
        q = self.codebook[idx].reshape(n, h, w, d).permute(0, 3, 1, 2)
        with torch.no_grad():
            onehot = F.one_hot(idx, self.codebook.shape[0]).float()
            self.cluster.mul_(self.decay).add_(onehot.sum(0), alpha=1 - self.decay)
            self.embed_sum.mul_(self.decay).add_(onehot.t() @ flat, alpha=1 - self.decay)
            total = self.cluster.sum()
            smoothed = (self.cluster + 1e-5) / (total + self.codebook.shape[0] * 1e-5) * total
            used = self.cluster > 0
            self.codebook[used] = self.embed_sum[used] / smoothed[used, None]
        loss = 0.25 * ((z - q.detach()) ** 2).mean()
        return z + (q - z).detach(), loss


class Hae(nn.Module):
    def __init__(self, width):
        super().__init__()
        c, code, codes, c32 = round(64 * width), round(128 * width), max(8, round(256 * width)), round(32 * width)
        self.pre = nn.Sequential(nn.Conv2d(1, c32, 1), nn.GELU(), nn.Conv2d(c32, c, 4, padding="same"), nn.GELU(),
                                 nn.Conv2d(c, c, 3, padding=1))
        self.encoder0 = nn.Sequential(*[ResBlock(c, c, 5, 2, False) for _ in range(3)])
        self.encoder0_out = nn.Conv2d(c, code, 3, padding=1)
        self.encoder1 = ResBlock(c, code, 5, 2, False)
        self.encoder1_out = nn.Conv2d(code, code, 3, padding=1)
        self.vq1, self.vq0 = Quantizer(codes, code), Quantizer(codes, code)
        self.prior_up = nn.ConvTranspose2d(code, code, 5, 2, 2, output_padding=1)
        self.decoder1_in = nn.ConvTranspose2d(code, code, 3, 1, 1)
        self.decoder1_up = ResBlock(code, c, 3, 2, True)
        self.decoder0_in = nn.ConvTranspose2d(code, c, 3, 1, 1)
        self.decoder0 = nn.Sequential(*[ResBlock(c, c, 3, 2, True) for _ in range(3)])
        self.post = nn.Sequential(nn.GELU(), nn.ConvTranspose2d(c, c32, 3, 1, 1), nn.GELU(), nn.ConvTranspose2d(c32, 1, 1))

    def forward(self, x, mask):
        h = self.encoder0(self.pre(x))
        zq, l1 = self.vq1(self.encoder1_out(self.encoder1(h)))
        yq, l0 = self.vq0(self.encoder0_out(h) + self.prior_up(zq))
        d = self.decoder1_up(self.decoder1_in(zq)) + self.decoder0_in(yq)
        out = self.post(self.decoder0(d))
        mse = ((out - x) ** 2 * mask).sum() / mask.sum()
        return 3 * mse + l0 + l1


def torch_step_seconds(model):
    torch.manual_seed(0)
    if model == "cnn":
        net, x, y = Cnn(), torch.rand(16, 1, 28, 28), torch.randint(0, 10, (16,))
        loss_fn = lambda: F.cross_entropy(net(x), y)
    else:
        net, x, mask = Hae(0.25), torch.rand(2, 1, 64, 64), torch.ones(2, 1, 64, 64)
        loss_fn = lambda: net(x, mask)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=0)
    params = sum(p.numel() for p in net.parameters())
    times = []
    for i in range(REPEATS + 1):
        t0 = time.perf_counter()
        opt.zero_grad()
        loss_fn().backward()
        opt.step()
        if i:  # the first step is a warm-up
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
