#!/usr/bin/env python3
# Writes the golden fixtures of the layer library (tests/models/golden/*.h5) from PyTorch, and
# prints the full-size parameter counts of the zoo models (also stored in the fixture file).
#
# Needs Debian's PyTorch, h5py and NumPy (not needed to build or run the tests):
#   sudo apt-get install python3-torch python3-h5py python3-numpy python3-torchvision
# Run with Debian's interpreter (another python3 on PATH may not see Debian's packages):
#   /usr/bin/python3 scripts/make_golden_fixtures.py [output.h5]
#
# Layout of the file: one group per case, with attributes `op` (what to build) and the layer's
# options; datasets `x` (the input, differentiated like a parameter), `param/<name>` (named
# like the C++ layer library's parameters), `input/<name>` (non-differentiated inputs),
# `state/<name>` (state before) and `state_after/<name>`, `y` (output), `dy` (the weights of
# the objective sum(y * dy)), `grad/<name>` (gradients of the objective, `grad/x` for the input).
# Scalars are stored as 1-element vectors. Shapes are deliberately awkward (odd, non-square).
import math
import os
import sys

import h5py
import numpy as np
import torch
import torch.nn.functional as F

torch.manual_seed(1234)
torch.set_default_dtype(torch.float32)
GEN = torch.Generator().manual_seed(42)


def rand(*shape, lo=-1.0, hi=1.0):
    return (torch.rand(tuple(shape), generator=GEN) * (hi - lo) + lo).float()


def np1(t):
    a = t.detach().cpu().numpy().astype(np.float32 if t.dtype.is_floating_point else np.int32)
    return a.reshape(1) if a.ndim == 0 else a


class Case:
    def __init__(self, f, name, op, **attrs):
        self.g = f.create_group(name)
        self.g.attrs["op"] = op
        for k, v in attrs.items():
            self.g.attrs[k] = v
        self.params = {}

    def x(self, t):
        t = t.clone().requires_grad_(True)
        self.params["x"] = t
        self.g["x"] = np1(t)
        return t

    def param(self, name, t):
        t = t.clone().requires_grad_(True)
        self.params[name] = t
        self.g["param/" + name] = np1(t)
        return t

    def input(self, name, t):
        self.g["input/" + name] = np1(t)
        return t

    def state(self, name, t, after=False):
        self.g[("state_after/" if after else "state/") + name] = np1(t)

    def finish(self, y, extra_loss=None):
        dy = rand(*y.shape)
        objective = (y * dy).sum()
        if extra_loss is not None:
            objective = objective + extra_loss
        objective.backward()
        self.g["y"] = np1(y)
        self.g["dy"] = np1(dy)
        for name, t in self.params.items():
            self.g[("grad/x" if name == "x" else "grad/" + name)] = np1(t.grad)


# ---- layers as the C++ library composes them ------------------------------------------------

def conv_params(c, prefix, cin, cout, k, groups=1, bias=True):
    bound = 1 / math.sqrt(cin // groups * k * k)
    w = c.param(prefix + "weight", rand(cout, cin // groups, k, k, lo=-bound, hi=bound))
    b = c.param(prefix + "bias", rand(cout, lo=-bound, hi=bound)) if bias else None
    return w, b


def bn_train(c, prefix, x, eps, momentum=0.1):
    ch = x.shape[1]
    w = c.param(prefix + "weight", rand(ch, lo=0.5, hi=1.5))
    b = c.param(prefix + "bias", rand(ch))
    rm, rv = torch.zeros(ch), torch.ones(ch)
    return F.batch_norm(x, rm, rv, w, b, training=True, momentum=momentum, eps=eps)


def gdn(c, prefix, x, inverse):
    ch = x.shape[1]
    beta = c.param(prefix + "beta", rand(ch, lo=0.5, hi=1.5))
    gamma = c.param(prefix + "gamma", 0.1 * torch.eye(ch) + rand(ch, ch, lo=0.0, hi=0.05))
    norm = F.conv2d(x * x, gamma[:, :, None, None], beta)
    return x * torch.sqrt(norm) if inverse else x / torch.sqrt(norm)


def se(c, prefix, x, squeeze):
    ch = x.shape[1]
    w1, b1 = conv_params(c, prefix + "fc1.", ch, squeeze, 1)
    w2, b2 = conv_params(c, prefix + "fc2.", squeeze, ch, 1)
    s = F.adaptive_avg_pool2d(x, 1)
    s = torch.sigmoid(F.conv2d(F.silu(F.conv2d(s, w1, b1)), w2, b2))
    return x * s


def linear(c, prefix, x, out, bias=True):
    bound = 1 / math.sqrt(x.shape[-1])
    w = c.param(prefix + "weight", rand(out, x.shape[-1], lo=-bound, hi=bound))
    b = c.param(prefix + "bias", rand(out, lo=-bound, hi=bound)) if bias else None
    return F.linear(x, w, b)


def layer_norm(c, prefix, x, eps=1e-5):
    d = x.shape[-1]
    w = c.param(prefix + "weight", rand(d, lo=0.5, hi=1.5))
    b = c.param(prefix + "bias", rand(d))
    return F.layer_norm(x, (d,), w, b, eps)


def attention(c, prefix, x, heads):
    n, t, d = x.shape
    qkv = linear(c, prefix + "qkv.", x, 3 * d).reshape(n, t, 3, heads, d // heads)
    q, k, v = qkv.permute(2, 0, 3, 1, 4)
    a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d // heads), dim=-1)
    out = (a @ v).permute(0, 2, 1, 3).reshape(n, t, d)
    return linear(c, prefix + "proj.", out, d)


def transformer_block(c, prefix, x, heads, ratio):
    x = x + attention(c, prefix + "attn.", layer_norm(c, prefix + "norm1.", x), heads)
    h = linear(c, prefix + "mlp.fc1.", layer_norm(c, prefix + "norm2.", x), x.shape[-1] * ratio)
    return x + linear(c, prefix + "mlp.fc2.", F.gelu(h), x.shape[-1])


# ---- the cases ---------------------------------------------------------------------------------

def layer_cases(f):
    conv_cases = [
        ("conv2d_pad_bias", (2, 3, 7, 6), dict(out=5, kernel=3, stride=1, padding=1, dilation=1, groups=1, bias=1, same=0)),
        ("conv2d_stride_dilation", (2, 4, 9, 8), dict(out=6, kernel=3, stride=2, padding=2, dilation=2, groups=1, bias=0, same=0)),
        ("conv2d_groups", (1, 6, 7, 7), dict(out=9, kernel=3, stride=2, padding=1, dilation=1, groups=3, bias=1, same=0)),
        ("conv2d_depthwise", (2, 5, 6, 5), dict(out=5, kernel=5, stride=1, padding=2, dilation=1, groups=5, bias=0, same=0)),
        ("conv2d_same_even_kernel", (1, 3, 7, 8), dict(out=4, kernel=4, stride=1, padding=0, dilation=1, groups=1, bias=1, same=1)),
    ]
    for name, shape, a in conv_cases:
        c = Case(f, name, "conv2d", **a)
        x = c.x(rand(*shape))
        w, b = conv_params(c, "", shape[1], a["out"], a["kernel"], a["groups"], bool(a["bias"]))
        pad = "same" if a["same"] else a["padding"]
        c.finish(F.conv2d(x, w, b, stride=a["stride"], padding=pad, dilation=a["dilation"], groups=a["groups"]))

    for name, shape, a in [
        ("conv_transpose2d_k5s2", (2, 4, 5, 4), dict(out=3, kernel=5, stride=2, padding=2, output_padding=1, bias=1)),
        ("conv_transpose2d_k3s1", (1, 3, 6, 5), dict(out=2, kernel=3, stride=1, padding=1, output_padding=0, bias=1)),
        ("conv_transpose2d_1x1s2", (1, 3, 4, 3), dict(out=5, kernel=1, stride=2, padding=0, output_padding=1, bias=0)),
    ]:
        c = Case(f, name, "conv_transpose2d", **a)
        x = c.x(rand(*shape))
        bound = 1 / math.sqrt(a["out"] * a["kernel"] ** 2)
        w = c.param("weight", rand(shape[1], a["out"], a["kernel"], a["kernel"], lo=-bound, hi=bound))
        b = c.param("bias", rand(a["out"], lo=-bound, hi=bound)) if a["bias"] else None
        c.finish(F.conv_transpose2d(x, w, b, stride=a["stride"], padding=a["padding"], output_padding=a["output_padding"]))

    c = Case(f, "batch_norm2d_train", "batch_norm2d", eps=1e-3, momentum=0.1, training=1)
    x = c.x(rand(3, 4, 5, 3, lo=-1, hi=2))
    w = c.param("weight", rand(4, lo=0.5, hi=1.5))
    b = c.param("bias", rand(4))
    rm, rv = torch.zeros(4), torch.ones(4)
    c.state("running_mean", rm)
    c.state("running_var", rv)
    y = F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1, eps=1e-3)
    c.state("running_mean", rm, after=True)
    c.state("running_var", rv, after=True)
    c.finish(y)

    c = Case(f, "batch_norm2d_eval", "batch_norm2d", eps=1e-5, momentum=0.1, training=0)
    x = c.x(rand(2, 3, 4, 4))
    w = c.param("weight", rand(3, lo=0.5, hi=1.5))
    b = c.param("bias", rand(3))
    rm, rv = rand(3), rand(3, lo=0.5, hi=2.0)
    c.state("running_mean", rm)
    c.state("running_var", rv)
    c.finish(F.batch_norm(x, rm, rv, w, b, training=False, eps=1e-5))

    c = Case(f, "layer_norm", "layer_norm", eps=1e-5)
    x = c.x(rand(3, 5, 7))
    c.finish(layer_norm(c, "", x))

    c = Case(f, "group_norm", "group_norm", groups=3, eps=1e-5)
    x = c.x(rand(2, 6, 3, 5))
    w = c.param("weight", rand(6, lo=0.5, hi=1.5))
    b = c.param("bias", rand(6))
    c.finish(F.group_norm(x, 3, w, b, 1e-5))

    for inverse in (0, 1):
        c = Case(f, "igdn" if inverse else "gdn", "gdn", inverse=inverse)
        x = c.x(rand(2, 4, 5, 3))
        c.finish(gdn(c, "", x, inverse))

    acts = {"relu": F.relu, "gelu": F.gelu, "silu": F.silu, "sigmoid": torch.sigmoid,
            "tanh": torch.tanh, "leaky_relu": lambda t: F.leaky_relu(t, 0.2)}
    for name, fn in acts.items():
        c = Case(f, "activation_" + name, "activation", fn=name, slope=0.2)
        x = c.x(rand(3, 7, lo=-3, hi=3))
        c.finish(fn(x))

    c = Case(f, "max_pool2d", "max_pool2d", kernel=3, stride=2, padding=1)
    x = c.x(rand(2, 3, 9, 7))
    c.finish(F.max_pool2d(x, 3, 2, 1))
    for name, inc in (("avg_pool2d_include_pad", 1), ("avg_pool2d_exclude_pad", 0)):
        c = Case(f, name, "avg_pool2d", kernel=3, stride=2, padding=1, count_include_pad=inc)
        x = c.x(rand(2, 3, 8, 7))
        c.finish(F.avg_pool2d(x, 3, 2, 1, count_include_pad=bool(inc)))
    c = Case(f, "adaptive_avg_pool2d", "adaptive_avg_pool2d", out_h=5, out_w=3)
    x = c.x(rand(2, 3, 11, 7))
    c.finish(F.adaptive_avg_pool2d(x, (5, 3)))

    c = Case(f, "squeeze_excitation", "squeeze_excitation", squeeze=3)
    x = c.x(rand(2, 8, 5, 5))
    c.finish(se(c, "", x, 3))

    c = Case(f, "pixel_shuffle", "pixel_shuffle", r=2)
    x = c.x(rand(2, 12, 3, 4))
    c.finish(F.pixel_shuffle(x, 2))

    c = Case(f, "attention", "attention", heads=2)
    x = c.x(rand(2, 5, 8))
    c.finish(attention(c, "", x, 2))

    c = Case(f, "transformer_block", "transformer_block", heads=2, mlp_ratio=4)
    x = c.x(rand(2, 5, 8))
    c.finish(transformer_block(c, "", x, 2, 4))

    c = Case(f, "embedding", "embedding", rows=7, dim=5)
    idx = c.input("indices", torch.tensor([[6, 0, 3], [3, 3, 1]], dtype=torch.int32))
    table = c.param("weight", rand(7, 5))
    c.finish(F.embedding(idx.long(), table))

    # Vector quantisation with EMA codebook updates and the straight-through gradient.
    c = Case(f, "vector_quantizer", "vector_quantizer", codes=6, decay=0.9, commitment=0.25)
    z = c.x(rand(2, 4, 3, 3))
    codebook = rand(6, 4, lo=-0.8, hi=0.8)
    cluster, embed_sum = torch.zeros(6), torch.zeros(6, 4)
    for n, t in (("codebook", codebook), ("cluster_size", cluster), ("embed_sum", embed_sum)):
        c.state(n, t)
    flat = z.permute(0, 2, 3, 1).reshape(-1, 4)
    dist = ((flat.detach()[:, None, :] - codebook[None, :, :]) ** 2).sum(-1)
    idx = dist.argmin(1)
    q = codebook[idx].reshape(2, 3, 3, 4).permute(0, 3, 1, 2)
    loss = 0.25 * ((z - q.detach()) ** 2).mean()
    st = z + (q - z).detach()
    onehot = F.one_hot(idx, 6).float()
    cluster = 0.9 * cluster + 0.1 * onehot.sum(0)
    embed_sum = 0.9 * embed_sum + 0.1 * onehot.t() @ flat.detach()
    total = cluster.sum()
    smoothed = (cluster + 1e-5) / (total + 6 * 1e-5) * total
    updated = torch.where(cluster[:, None] > 0, embed_sum / smoothed[:, None], codebook)
    for n, t in (("codebook", updated), ("cluster_size", cluster), ("embed_sum", embed_sum)):
        c.state(n, t, after=True)
    c.finish(st, extra_loss=loss)

    # Losses: pred is differentiated, targets and masks are inputs.
    for name, masked in (("mse_loss", 0), ("mse_loss_masked", 1)):
        c = Case(f, name, "mse_loss", masked=masked)
        p = c.x(rand(2, 1, 5, 3))
        t = c.input("target", rand(2, 1, 5, 3))
        if masked:
            m = c.input("mask", (rand(2, 1, 5, 3) > 0).float())
            c.finish(((p - t) ** 2 * m).sum() / m.sum())
        else:
            c.finish(F.mse_loss(p, t))
    c = Case(f, "l1_loss", "l1_loss")
    p = c.x(rand(3, 1))
    t = c.input("target", rand(3, 1))
    c.finish(F.l1_loss(p, t))
    c = Case(f, "cross_entropy", "cross_entropy")
    p = c.x(rand(5, 7, lo=-3, hi=3))
    t = c.input("labels", torch.tensor([6, 0, 3, 3, 1], dtype=torch.int32))
    c.finish(F.cross_entropy(p, t.long()))
    c = Case(f, "lsgan_loss", "lsgan_loss", target=1.0)
    p = c.x(rand(4, 1))
    c.finish(((p - 1.0) ** 2).mean())


def composite_cases(f):
    # MBConv (expansion 4, depthwise 3x3, SE with squeeze = in/4, project, residual), in training
    # mode (batch statistics), BN eps 1e-3, no stochastic depth.
    c = Case(f, "mbconv", "mbconv", expansion=4, kernel=3, out=8)
    x = c.x(rand(2, 8, 6, 5))
    w, _ = conv_params(c, "block.0.0.", 8, 32, 1, bias=False)
    h = F.silu(bn_train(c, "block.0.1.", F.conv2d(x, w), 1e-3))
    w, _ = conv_params(c, "block.1.0.", 32, 32, 3, groups=32, bias=False)
    h = F.silu(bn_train(c, "block.1.1.", F.conv2d(h, w, padding=1, groups=32), 1e-3))
    h = se(c, "block.2.", h, 2)
    w, _ = conv_params(c, "block.3.0.", 32, 8, 1, bias=False)
    h = bn_train(c, "block.3.1.", F.conv2d(h, w), 1e-3)
    c.finish(h + x)

    c = Case(f, "fused_mbconv", "fused_mbconv", expansion=4, kernel=3, out=6, stride=2)
    x = c.x(rand(2, 4, 7, 6))
    w, _ = conv_params(c, "block.0.0.", 4, 16, 3, bias=False)
    h = F.silu(bn_train(c, "block.0.1.", F.conv2d(x, w, stride=2, padding=1), 1e-3))
    w, _ = conv_params(c, "block.1.0.", 16, 6, 1, bias=False)
    c.finish(bn_train(c, "block.1.1.", F.conv2d(h, w), 1e-3))

    # HAE DownResBlock: GDN, then 1x1 stride-s shortcut + (kxk stride s, 1x1 x4, GELU, 1x1).
    c = Case(f, "down_res_block", "down_res_block", out=6, kernel=5, stride=2)
    x = c.x(rand(2, 4, 8, 7))
    h = gdn(c, "gdn.", x, False)
    ws, _ = conv_params(c, "shortcut.", 4, 6, 1, bias=False)
    w1, _ = conv_params(c, "conv1.", 4, 6, 5, bias=False)
    w2, _ = conv_params(c, "conv2.", 6, 24, 1, bias=False)
    w3, _ = conv_params(c, "conv3.", 24, 6, 1, bias=False)
    y = F.conv2d(F.gelu(F.conv2d(F.conv2d(h, w1, stride=2, padding=2), w2)), w3)
    c.finish(F.conv2d(h, ws, stride=2) + y)


def lamb_step(p, g, m, v, t, lr, b1, b2, eps, wd):
    m.mul_(b1).add_(g, alpha=1 - b1)
    v.mul_(b2).addcmul_(g, g, value=1 - b2)
    u = (m / (1 - b1 ** t)) / ((v / (1 - b2 ** t)).sqrt() + eps) + wd * p
    pn, un = p.norm(), u.norm()
    trust = (pn / un).item() if pn > 0 and un > 0 else 1.0
    p.sub_(lr * trust * u)


def optimizer_cases(f):
    configs = [
        ("optimizer_sgd_momentum", dict(kind="sgd_momentum", lr=0.1, momentum=0.9, nesterov=0, weight_decay=0.01)),
        ("optimizer_sgd_nesterov", dict(kind="sgd_momentum", lr=0.05, momentum=0.8, nesterov=1, weight_decay=0.0)),
        ("optimizer_adam", dict(kind="adam", lr=0.01, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01)),
        ("optimizer_adamw_cosine_clip", dict(kind="adamw", lr=4e-3, beta1=0.9, beta2=0.95, eps=1e-8,
                                             weight_decay=1e-1, warmup=2, total=5, clip=0.5)),
        ("optimizer_lamb", dict(kind="lamb", lr=0.02, beta1=0.9, beta2=0.999, eps=1e-6, weight_decay=0.01)),
    ]
    steps = 4
    for name, a in configs:
        c = Case(f, name, "optimizer", steps=steps, **a)
        p = rand(4, 3)
        q = rand(5)
        c.g["p/init"], c.g["q/init"] = np1(p), np1(q)
        p, q = p.clone().requires_grad_(True), q.clone().requires_grad_(True)
        params = [p, q]
        kind = a["kind"]
        if kind == "sgd_momentum":
            opt = torch.optim.SGD(params, lr=a["lr"], momentum=a["momentum"], nesterov=bool(a["nesterov"]),
                                  weight_decay=a["weight_decay"])
        elif kind == "adam":
            opt = torch.optim.Adam(params, lr=a["lr"], betas=(a["beta1"], a["beta2"]), eps=a["eps"],
                                   weight_decay=a["weight_decay"])
        elif kind == "adamw":
            opt = torch.optim.AdamW(params, lr=a["lr"], betas=(a["beta1"], a["beta2"]), eps=a["eps"],
                                    weight_decay=a["weight_decay"])
        else:
            opt = None
            moments = [(torch.zeros_like(t), torch.zeros_like(t)) for t in params]
        sched = None
        if "warmup" in a:
            w, total = a["warmup"], a["total"]

            def factor(k, w=w, total=total):
                if k < w:
                    return (k + 1) / w
                return 0.5 * (1 + math.cos(math.pi * min(1.0, (k - w) / max(1, total - w))))
            sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
        for t in range(steps):
            gp, gq = rand(4, 3, lo=-2, hi=2), rand(5, lo=-2, hi=2)
            c.g["p/grad%d" % t], c.g["q/grad%d" % t] = np1(gp), np1(gq)
            with torch.no_grad():
                p.grad, q.grad = gp.clone(), gq.clone()
                if "clip" in a:
                    torch.nn.utils.clip_grad_norm_(params, a["clip"])
                if opt is not None:
                    opt.step()
                else:
                    for prm, (m, v) in zip(params, moments):
                        lamb_step(prm, prm.grad, m, v, t + 1, a["lr"], a["beta1"], a["beta2"], a["eps"], a["weight_decay"])
            if sched is not None:
                sched.step()
            c.g["p/after%d" % t], c.g["q/after%d" % t] = np1(p), np1(q)


# ---- full-size reference models, for parameter counts ------------------------------------------

def count(m):
    return sum(p.numel() for p in m.parameters())


class GDN(torch.nn.Module):
    def __init__(self, ch):
        super().__init__()
        self.beta = torch.nn.Parameter(torch.ones(ch))
        self.gamma = torch.nn.Parameter(0.1 * torch.eye(ch))


def hae_reference():
    nn = torch.nn

    class Down(nn.Module):
        def __init__(self, cin, cout, k, s):
            super().__init__()
            self.gdn = GDN(cin)
            self.shortcut = nn.Conv2d(cin, cout, 1, s, bias=False)
            self.conv1 = nn.Conv2d(cin, cout, k, s, k // 2, bias=False)
            self.conv2 = nn.Conv2d(cout, 4 * cout, 1, bias=False)
            self.conv3 = nn.Conv2d(4 * cout, cout, 1, bias=False)

    class Up(nn.Module):
        def __init__(self, cin, cout, k, s):
            super().__init__()
            self.igdn = GDN(cin)
            self.shortcut = nn.ConvTranspose2d(cin, cout, 1, s, output_padding=s - 1, bias=False)
            self.conv1 = nn.ConvTranspose2d(cin, cout, k, s, k // 2, output_padding=s - 1, bias=False)
            self.conv2 = nn.Conv2d(cout, 4 * cout, 1, bias=False)
            self.conv3 = nn.Conv2d(4 * cout, cout, 1, bias=False)

    m = nn.Module()
    m.pre = nn.Sequential(nn.Conv2d(1, 32, 1), nn.GELU(), nn.Conv2d(32, 64, 4, padding="same"), nn.GELU(),
                          nn.Conv2d(64, 64, 3, padding=1))
    m.encoder0 = nn.Sequential(*[Down(64, 64, 5, 2) for _ in range(3)])
    m.encoder0_out = nn.Conv2d(64, 128, 3, padding=1)
    m.encoder1 = Down(64, 128, 5, 2)
    m.encoder1_out = nn.Conv2d(128, 128, 3, padding=1)
    m.prior_up = nn.ConvTranspose2d(128, 128, 5, 2, 2, output_padding=1)
    m.decoder1_in = nn.ConvTranspose2d(128, 128, 3, 1, 1)
    m.decoder1_up = Up(128, 64, 3, 2)
    m.decoder0_in = nn.ConvTranspose2d(128, 64, 3, 1, 1)
    m.decoder0 = nn.Sequential(*[Up(64, 64, 3, 2) for _ in range(3)])
    m.post = nn.Sequential(nn.GELU(), nn.ConvTranspose2d(64, 32, 3, 1, 1), nn.GELU(), nn.ConvTranspose2d(32, 1, 1))
    # The codebooks (2 x 256 x 128) are EMA buffers, not parameters.
    return m


def transcyclegan_reference():
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.attn = nn.MultiheadAttention(d, 4)
            self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    class Generator(nn.Module):
        def __init__(self):
            super().__init__()
            self.patch_embed = nn.Conv2d(3, 1024, 4, 4)
            self.pos0 = nn.Parameter(torch.zeros(1, 256, 1024))
            self.pos1 = nn.Parameter(torch.zeros(1, 1024, 256))
            self.pos2 = nn.Parameter(torch.zeros(1, 4096, 64))
            self.stage0 = nn.ModuleList([Block(1024) for _ in range(5)])
            self.stage1 = nn.ModuleList([Block(256) for _ in range(4)])
            self.stage2 = nn.ModuleList([Block(64) for _ in range(3)])
            self.to_rgb = nn.Conv2d(64, 3, 1)

    class Discriminator(nn.Module):
        def __init__(self, d=384):
            super().__init__()
            self.embeds = nn.ModuleList([nn.Conv2d(3, d // 4, 2, 2), nn.Conv2d(3, d // 4, 4, 4), nn.Conv2d(3, d // 2, 8, 8)])
            self.pos = nn.ParameterList([nn.Parameter(torch.zeros(1, 1024, d // 4)), nn.Parameter(torch.zeros(1, 256, d // 2)),
                                         nn.Parameter(torch.zeros(1, 64, d))])
            self.stages = nn.ModuleList([nn.ModuleList([Block(w) for _ in range(3)]) for w in (d // 4, d // 2, d)])
            self.cls_token = nn.Parameter(torch.zeros(1, 1, d))
            self.last = Block(d)
            self.norm = nn.LayerNorm(d)
            self.head = nn.Linear(d, 1)

    m = nn.Module()
    m.g_ab, m.g_ba, m.d_a, m.d_b = Generator(), Generator(), Discriminator(), Discriminator()
    return m


def cnn_reference():
    nn = torch.nn
    return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Dropout(0.25), nn.Linear(128, 10))


def parameter_counts():
    counts = {"cnn": count(cnn_reference()), "hae": count(hae_reference()),
              "transcyclegan": count(transcyclegan_reference())}
    try:
        import torchvision
        counts["resnet50"] = count(torchvision.models.resnet50())
        eff = torchvision.models.efficientnet_v2_s()
        eff.classifier = torch.nn.Sequential(torch.nn.Linear(1280, 320), torch.nn.Linear(320, 1))
        counts["efficientnetv2_s"] = count(eff)
    except ImportError:
        print("torchvision is missing: resnet50 / efficientnetv2_s counts not written "
              "(sudo apt-get install python3-torchvision)", file=sys.stderr)
    return counts


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "tests", "models", "golden", "layers.h5")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with h5py.File(out, "w", libver="latest") as f:
        f.attrs["generator"] = "scripts/make_golden_fixtures.py, torch " + torch.__version__
        layer_cases(f)
        composite_cases(f)
        optimizer_cases(f)
        counts = f.create_group("parameter_counts")
        for name, n in parameter_counts().items():
            counts.attrs[name] = n
            print("%-18s %12d parameters (PyTorch, full size)" % (name, n))
        print("%d cases" % (len(f.keys()) - 1))
    print("wrote", out, os.path.getsize(out), "bytes")


if __name__ == "__main__":
    main()
