#!/usr/bin/env python3
"""Exports a PyTorch model to ONNX for `ipupod train|compile|estimate --model FILE.onnx`: the
porting path of a GPU model. Needs Debian's python3-torch (scripts/install-deps.sh --bench) and,
for --torchvision and --efficientnet-v2-blocks, python3-torchvision.

  scripts/export_pytorch_model.py --torchvision resnet50 --input-shape 3,224,224 --out r50.onnx
  scripts/export_pytorch_model.py --module mypkg.models:Net --input-shape 1,28,28 --out net.onnx
  scripts/export_pytorch_model.py --cnn-width 0.25 --input-shape 1,12,12 --out cnn.onnx \\
      --fixture tests/models/onnx   # also the inputs and PyTorch's outputs, for the tests
  scripts/export_pytorch_model.py --efficientnet-v2-blocks --classes 1 --input-shape 3,32,32 \\
      --out effv2_blocks.onnx --fixture tests/models/onnx
  scripts/export_pytorch_model.py --upsampling --input-shape 1,16,16 --out upsampling.onnx \\
      --fixture tests/models/onnx
  scripts/export_pytorch_model.py --attention --input-shape 1,8,8 --out attention.onnx \\
      --fixture tests/models/onnx
  scripts/export_pytorch_model.py --attention --input-shape 1,8,8 --opset 17 \\
      --out attention_opset17.onnx --fixture tests/models/onnx
  scripts/export_pytorch_model.py --mobile --input-shape 3,8,8 --out mobile.onnx \\
      --fixture tests/models/onnx
  scripts/export_pytorch_model.py --autoencoder --input-shape 1,8,8 --out autoencoder.onnx \\
      --fixture tests/models/onnx
  scripts/export_pytorch_model.py --efficientnet-v2-s-width 0.0625 --classes 1 \\
      --input-shape 3,32,32 --out effv2s_w00625.onnx --fixture tests/models/onnx
  scripts/export_pytorch_model.py --resnet50-width 0.0625 --input-shape 3,32,32 \\
      --out resnet50_w00625.onnx --fixture tests/models/onnx

The model is exported as it trains on an IPU: BatchNormalization kept as its own node with its
running statistics (not folded into the convolution), Dropout left out (inference form), a
fixed micro-batch and input shape, opset 13 (or --opset 17, where LayerNorm is one node).
ipupod starts training from the exported weights.
"""
import argparse
import importlib
import os
import sys

try:
    import torch
    from torch import nn
except ImportError:
    print("export_pytorch_model.py needs PyTorch: apt-get install python3-torch "
          "(scripts/install-deps.sh --bench)", file=sys.stderr)
    sys.exit(3)


class Cnn(nn.Module):
    """The zoo's Fashion-MNIST CNN (models/zoo_classifiers.cpp), channels scaled by `width`."""

    def __init__(self, width=1.0, in_channels=1, size=28, classes=10):
        super().__init__()
        c1, c2, hidden = (max(1, round(c * width)) for c in (32, 64, 128))
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, c1, 3, padding=1, bias=False), nn.BatchNorm2d(c1), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, 3, padding=1, bias=False), nn.BatchNorm2d(c2), nn.ReLU(),
            nn.MaxPool2d(2))
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(c2 * (size // 4) ** 2, hidden),
                                  nn.ReLU(), nn.Dropout(0.25), nn.Linear(hidden, classes))

    def forward(self, x):
        return self.head(self.features(x))


def efficientnet_v2_blocks(classes):
    """EfficientNetV2-S's building blocks at a small size, from torchvision's own classes:
    Fused-MBConv, MBConv with squeeze-and-excitation, SiLU, batch norm with eps 1e-3 and
    stochastic depth; classes=1 gives a one-value regression head (torchvision's Dropout and
    Linear)."""
    from functools import partial
    from torchvision.models.efficientnet import EfficientNet, FusedMBConvConfig, MBConvConfig
    blocks = [FusedMBConvConfig(1, 3, 1, 8, 8, 1), FusedMBConvConfig(4, 3, 2, 8, 16, 2),
              MBConvConfig(4, 3, 2, 16, 24, 2, 1.0, 1.0), MBConvConfig(6, 3, 1, 24, 32, 1, 1.0, 1.0)]
    return EfficientNet(blocks, dropout=0.2, stochastic_depth_prob=0.2, num_classes=classes,
                        last_channel=64, norm_layer=partial(nn.BatchNorm2d, eps=1e-3))


class Upsampling(nn.Module):
    """Down and up again as a generator does (TransCycleGAN's decoder, the HAE's): strided
    convolutions, then transposed convolutions (stride 2, padding 1, output padding 1, with
    bias; one grouped), batch norm, ReLU and Tanh, and a classifier head."""

    def __init__(self, in_channels=1, size=16, classes=10):
        super().__init__()
        self.down = nn.Sequential(
            nn.Conv2d(in_channels, 8, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(8),
            nn.ReLU(), nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU())
        self.up = nn.Sequential(
            nn.ConvTranspose2d(16, 8, 3, stride=2, padding=1, output_padding=1),
            nn.BatchNorm2d(8), nn.ReLU(),
            nn.ConvTranspose2d(8, 4, 4, stride=2, padding=1, groups=2), nn.Tanh())
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(4 * size * size, classes))

    def forward(self, x):
        return self.head(self.up(self.down(x)))


class Attention(nn.Module):
    """A transformer encoder block on a sample's rows (of every channel) as tokens, as a ViT or TransCycleGAN's
    transformer has it: layer norm, multi-head self-attention, a GELU MLP (the exact GELU, which
    exports as Erf), residuals, then the mean token beside the first one and a classifier head
    behind a tanh-GELU (which exports as Tanh, Pow and products). Shapes are constants here (not
    read from the tensors), so the export holds no shape arithmetic."""

    def __init__(self, tokens=8, size=8, dim=16, heads=2, classes=10):
        super().__init__()
        self.tokens, self.size, self.dim, self.heads = tokens, size, dim, heads
        self.embed = nn.Linear(size, dim)
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(),
                                 nn.Linear(2 * dim, dim))
        self.head = nn.Linear(2 * dim, classes)

    def forward(self, x):
        t, d, h = self.tokens, self.dim, self.heads
        x = self.embed(x.reshape(-1, t, self.size))  # [n, tokens, dim]
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
        q, k, v = (z.reshape(-1, t, h, d // h).transpose(1, 2) for z in (q, k, v))
        a = torch.softmax(q @ k.transpose(-2, -1) / (d // h) ** 0.5, dim=-1) @ v
        x = x + self.proj(a.transpose(1, 2).reshape(-1, t, d))
        x = x + self.mlp(self.norm2(x))
        pooled = torch.cat([x.mean(dim=1), x[:, 0:1].squeeze(1)], dim=-1)
        return self.head(nn.functional.gelu(pooled, approximate="tanh"))


class Mobile(nn.Module):
    """MobileNetV3's pieces at a small size: HardSwish, a depthwise convolution with ReLU6 (ONNX
    Clip), a squeeze-and-excitation gate with HardSigmoid, then the positions as tokens with an
    embedding of fixed positions (Gather of a parameter) and picked tokens (Gather of
    activations: the first, the last, three others) pooled for the head."""

    def __init__(self, in_channels=3, size=16, classes=10):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, 8, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(8),
            nn.Hardswish())
        self.depthwise = nn.Sequential(
            nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False), nn.BatchNorm2d(8), nn.ReLU6())
        self.gate = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(8, 4, 1), nn.ReLU(),
                                  nn.Conv2d(4, 8, 1), nn.Hardsigmoid())
        self.project = nn.Conv2d(8, 16, 1)
        tokens = (size // 2) ** 2
        self.position = nn.Embedding(tokens, 16)
        self.register_buffer("positions", torch.arange(tokens), persistent=False)
        self.head = nn.Linear(48, classes)

    def forward(self, x):
        x = self.depthwise(self.stem(x))
        x = self.project(x * self.gate(x))
        t = x.flatten(2).transpose(1, 2) + self.position(self.positions)  # [n, tokens, 16]
        picked = t[:, [1, 2, 5]].mean(dim=1)
        return self.head(torch.cat([t[:, 0] + t[:, -1], picked, t.mean(dim=1)], dim=-1))


class Autoencoder(nn.Module):
    """A field's autoencoder, as the climate compressors are: strided convolutions down to a
    code, transposed convolutions back to the input's shape (train it with --loss mse)."""

    def __init__(self, in_channels=1):
        super().__init__()
        self.encode = nn.Sequential(
            nn.Conv2d(in_channels, 8, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(8, 4, 3, stride=2, padding=1))
        self.decode = nn.Sequential(
            nn.ConvTranspose2d(4, 8, 3, stride=2, padding=1, output_padding=1), nn.ReLU(),
            nn.ConvTranspose2d(8, in_channels, 3, stride=2, padding=1, output_padding=1))

    def forward(self, x):
        return self.decode(self.encode(x))


def efficientnet_v2_s(classes, width):
    """torchvision's efficientnet_v2_s, every block, with its channels scaled by `width` (1: the
    full model, 21.5 M parameters with 1000 classes); classes=1 gives the conductivity paper's
    regression head (arXiv 2404.10730), as the zoo's efficientnetv2_s has it."""
    from functools import partial
    from torchvision.models.efficientnet import EfficientNet, _efficientnet_conf
    blocks, last = _efficientnet_conf("efficientnet_v2_s")
    scaled = lambda c: max(4, int(round(c * width)))  # noqa: E731
    for b in blocks:
        b.input_channels, b.out_channels = scaled(b.input_channels), scaled(b.out_channels)
    model = EfficientNet(blocks, dropout=0.2, stochastic_depth_prob=0.2, num_classes=classes,
                         last_channel=scaled(last), norm_layer=partial(nn.BatchNorm2d, eps=1e-3))
    if classes == 1:  # the conductivity paper's head: Linear(1280 -> 320), Linear(320 -> 1)
        model.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(scaled(last), scaled(320)),
                                         nn.Linear(scaled(320), 1))
    return model


def resnet50(classes, width):
    """torchvision's resnet50 (its Bottleneck blocks, [3, 4, 6, 3], its module names), the
    channels of the stem and of every layer scaled by `width` (1: the full model)."""
    from torchvision.models.resnet import Bottleneck, ResNet
    model = ResNet(Bottleneck, [3, 4, 6, 3], num_classes=classes)
    if width == 1:
        return model
    scaled = lambda c: max(1, int(round(c * width)))  # noqa: E731
    model.inplanes = scaled(64)
    model.conv1 = nn.Conv2d(3, scaled(64), kernel_size=7, stride=2, padding=3, bias=False)
    model.bn1 = nn.BatchNorm2d(scaled(64))
    for i, (planes, blocks) in enumerate(zip((64, 128, 256, 512), (3, 4, 6, 3))):
        setattr(model, f"layer{i + 1}",
                model._make_layer(Bottleneck, scaled(planes), blocks, stride=1 if i == 0 else 2))
    model.fc = nn.Linear(scaled(512) * Bottleneck.expansion, classes)
    return model


def build(args, shape):
    if args.resnet50_width:
        return resnet50(args.classes, args.resnet50_width)
    if args.mobile:
        return Mobile(shape[0], shape[1], args.classes)
    if args.autoencoder:
        return Autoencoder(shape[0])
    if args.efficientnet_v2_s_width:
        return efficientnet_v2_s(args.classes, args.efficientnet_v2_s_width)
    if args.attention:
        return Attention(shape[0] * shape[1], shape[2], classes=args.classes)
    if args.upsampling:
        return Upsampling(shape[0], shape[1], args.classes)
    if args.efficientnet_v2_blocks:
        return efficientnet_v2_blocks(args.classes)
    if args.torchvision:
        import torchvision
        return getattr(torchvision.models, args.torchvision)(num_classes=args.classes)
    if args.module:
        module, _, name = args.module.partition(":")
        return getattr(importlib.import_module(module), name)()
    return Cnn(args.cnn_width, shape[0], shape[1], args.classes)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--torchvision", help="a torchvision.models constructor, e.g. resnet50")
    which.add_argument("--module", help="MODULE:CLASS of your own nn.Module (no arguments)")
    which.add_argument("--efficientnet-v2-blocks", action="store_true",
                       help="a small network of EfficientNetV2-S's blocks (torchvision's); "
                       "--classes 1 for a regressor")
    which.add_argument("--attention", action="store_true",
                       help="a small transformer encoder block whose tokens are the "
                       "sample's rows (of every channel)")
    which.add_argument("--upsampling", action="store_true",
                       help="a small down-and-up network with transposed convolutions")
    which.add_argument("--mobile", action="store_true",
                       help="a small network of MobileNetV3's pieces (HardSwish, ReLU6, "
                       "HardSigmoid) with a fixed-position embedding and picked tokens (Gather)")
    which.add_argument("--autoencoder", action="store_true",
                       help="a small convolutional autoencoder: its output is the input's shape")
    which.add_argument("--efficientnet-v2-s-width", type=float,
                       help="torchvision's efficientnet_v2_s, its channels scaled (1: full size)")
    which.add_argument("--resnet50-width", type=float,
                       help="torchvision's resnet50, its channels scaled (1: full size)")
    which.add_argument("--cnn-width", type=float, default=1.0,
                       help="the zoo's CNN with its channels scaled (default; 1.0: full size)")
    parser.add_argument("--input-shape", default="1,28,28", help="one sample: C,H,W")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--micro-batch", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--opset", type=int, default=13, choices=range(13, 18),
                        help="ONNX opset (default 13; at 17 LayerNorm exports as one node)")
    parser.add_argument("--out", required=True, help="the .onnx file to write")
    parser.add_argument("--fixture", help="also write DIR/<name>.input.f32 and "
                        "<name>.output.f32: a fixed input and PyTorch's eval output (raw float32)")
    args = parser.parse_args()
    shape = [int(d) for d in args.input_shape.split(",")]
    torch.manual_seed(args.seed)
    model = build(args, shape)
    # Running statistics that are not the initial 0 and 1, so that the import is checked on them.
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 1.5)
    model.eval()
    # The exporter merges initializers of equal values (a fresh model's batch-norm weights are
    # all ones) unless the model it is given says it trains; then it merges only shared ones.
    # The root module's own flag is read for that, its layers' flags for how they run.
    model.training = True
    x = torch.rand(args.micro_batch, *shape)
    # TrainingMode.PRESERVE with an eval-mode model keeps BatchNormalization a node of its own
    # (EVAL would fold it into the convolution before it).
    torch.onnx.export(model, x, args.out, opset_version=args.opset, input_names=["input"],
                      output_names=["logits"], training=torch.onnx.TrainingMode.PRESERVE,
                      do_constant_folding=False)
    params = sum(p.numel() for p in model.parameters())
    print(f"wrote {args.out}: {params} parameters, input {[args.micro_batch] + shape}")
    if args.fixture:
        os.makedirs(args.fixture, exist_ok=True)
        stem = os.path.join(args.fixture, os.path.splitext(os.path.basename(args.out))[0])
        with torch.no_grad():
            y = model(x)
        x.numpy().astype("float32").tofile(stem + ".input.f32")
        y.numpy().astype("float32").tofile(stem + ".output.f32")
        print(f"wrote {stem}.input.f32 and {stem}.output.f32 (PyTorch {torch.__version__})")


if __name__ == "__main__":
    main()
