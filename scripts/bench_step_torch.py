#!/usr/bin/env python3
# The PyTorch peer of `ipupod bench step`: one training step (forward, backward, AdamW) of the
# zoo's small CNN, HAE or MLP in PyTorch on a given number of CPU threads, on one fixed
# micro-batch. A benchmark, not a test: the test suite never imports it and never needs torch.
#
# Needs Debian's PyTorch (scripts/install-deps.sh --bench installs python3-torch) and runs with
# the system interpreter it is installed for, /usr/bin/python3:
#   /usr/bin/python3 scripts/bench_step_torch.py --model cnn --threads 1 --repeats 7
# prints the seconds of each timed step and their median. `ipupod bench step` starts it with
# --serve and the model's configuration (micro-batch, width, hidden widths) and asks for steps
# in turn with its own, over a line protocol on standard input and output:
#   peer -> "ready parameters=P torch=VERSION threads=N"   after building the model and a warm-up
#   "run K" -> "seconds S1 ... SK loss L"                  K timed steps, the last step's loss
# It exits at the end of its input. The models mirror models/zoo_classifiers.cpp and
# models/zoo_hae.cpp (scripts/bench_interpreter_vs_torch.py uses them too).
import argparse
import statistics
import sys
import time
import warnings

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:
    sys.stderr.write("bench_step_torch.py: PyTorch is missing for %s (%s): install Debian's "
                     "python3-torch with scripts/install-deps.sh --bench\n" % (sys.executable, e))
    sys.exit(3)

# The HAE's 4x4 "same" convolution pads by a copy in PyTorch; the warning says only that.
warnings.filterwarnings("ignore", message="Using padding='same'")


class Mlp(nn.Module):
    def __init__(self, features, hidden, classes):
        super().__init__()
        layers, width = [nn.Flatten()], features
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)


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


def make_step(model, micro_batch, width=1.0, hidden=(128,), classes=10):
    """The model's training step on one fixed micro-batch, as a function returning the loss, and
    its parameter count. The configurations come from the caller (ipupod bench step passes its
    own)."""
    torch.manual_seed(0)
    if model == "cnn":
        if width != 1.0:
            raise ValueError("the PyTorch CNN has width 1 only, got %g" % width)
        net = Cnn()
        x, y = torch.rand(micro_batch, 1, 28, 28), torch.randint(0, classes, (micro_batch,))
        loss_fn = lambda: F.cross_entropy(net(x), y)
    elif model == "hae":
        net = Hae(width)
        x, mask = torch.rand(micro_batch, 1, 64, 64), torch.ones(micro_batch, 1, 64, 64)
        loss_fn = lambda: net(x, mask)
    elif model == "mlp":
        net = Mlp(28 * 28, hidden, classes)
        x, y = torch.rand(micro_batch, 1, 28, 28), torch.randint(0, classes, (micro_batch,))
        loss_fn = lambda: F.cross_entropy(net(x), y)
    else:
        raise ValueError("--model: expected cnn, hae or mlp, got '%s'" % model)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=0)

    def step():
        opt.zero_grad()
        loss = loss_fn()
        loss.backward()
        opt.step()
        return float(loss)

    return step, sum(p.numel() for p in net.parameters())


def timed(step):
    t0 = time.perf_counter()
    loss = step()
    return time.perf_counter() - t0, loss


def serve(step, params, threads):
    step()  # warm-up: allocator pools, kernel selection
    print("ready parameters=%d torch=%s threads=%d" % (params, torch.__version__, threads), flush=True)
    for line in sys.stdin:
        words = line.split()
        if len(words) != 2 or words[0] != "run" or not words[1].isdigit():
            sys.exit("bench_step_torch.py: expected 'run K', got %r" % line)
        seconds, loss = [], 0.0
        for _ in range(int(words[1])):
            s, loss = timed(step)
            seconds.append(s)
        print("seconds %s loss %.6f" % (" ".join("%.9f" % s for s in seconds), loss), flush=True)


def main():
    p = argparse.ArgumentParser(description="The PyTorch peer of `ipupod bench step`.")
    p.add_argument("--model", choices=("cnn", "hae", "mlp"), default="cnn")
    p.add_argument("--micro-batch", type=int, default=0, help="0: 16 for cnn and mlp, 2 for hae")
    p.add_argument("--width", type=float, default=0, help="hae: channel width (0: 0.125)")
    p.add_argument("--hidden", type=int, nargs="+", default=[128], help="mlp: hidden widths")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    p.add_argument("--repeats", type=int, default=7, help="timed steps after one warm-up")
    p.add_argument("--serve", action="store_true", help="answer 'run K' lines (ipupod bench step)")
    a = p.parse_args()
    if a.threads < 1 or a.repeats < 1 or a.micro_batch < 0 or a.width < 0:
        p.error("--threads and --repeats must be at least 1, --micro-batch and --width not negative")
    micro_batch = a.micro_batch or (2 if a.model == "hae" else 16)
    width = a.width or (0.125 if a.model == "hae" else 1.0)
    torch.set_num_threads(a.threads)
    step, params = make_step(a.model, micro_batch, width, a.hidden)
    if a.serve:
        try:
            serve(step, params, a.threads)
        except BrokenPipeError:  # ipupod stopped first (an error of its own, already reported)
            sys.stderr.close()
        return
    step()  # warm-up
    seconds = [timed(step)[0] for _ in range(a.repeats)]
    print("model=%s micro_batch=%d parameters=%d threads=%d seconds=%s median_step_s=%.6f"
          % (a.model, micro_batch, params, a.threads, ",".join("%.6f" % s for s in seconds),
             statistics.median(seconds)))


if __name__ == "__main__":
    main()
