#!/usr/bin/env python3
"""The peer of `ipupod bench input`: decodes every image file of a folder with Pillow, converts it
to planar float32 in [0, 1] with NumPy, normalises each channel and flips half of them at random,
as a PyTorch DataLoader's workers do with ToTensor, Normalize and RandomHorizontalFlip; with
--threads N, in N worker processes. Prints "seconds S images N" (the decoding only, not Python's
start). Exit 3 when Pillow or NumPy is missing."""
import argparse
import os
import sys
import time

try:
    import numpy as np
    from PIL import Image
except ImportError as e:  # the benchmark says what to install
    print(f"missing: {e}", file=sys.stderr)
    sys.exit(3)

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32).reshape(3, 1, 1)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32).reshape(3, 1, 1)


def load(path):
    with Image.open(path) as image:
        rgb = np.asarray(image.convert("RGB"))
    planar = np.ascontiguousarray(rgb.transpose(2, 0, 1), dtype=np.float32)  # ToTensor
    planar /= 255.0
    planar -= MEAN  # Normalize, in place as torchvision's does
    planar /= STD
    if np.random.randint(2):  # RandomHorizontalFlip
        planar = np.ascontiguousarray(planar[:, :, ::-1])
    return float(planar[:, planar.shape[1] // 2, 0].sum())


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--folder", required=True)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    files = sorted(os.path.join(args.folder, f) for f in os.listdir(args.folder))
    if args.threads > 1:
        import multiprocessing

        with multiprocessing.Pool(args.threads) as pool:
            pool.map(load, files[: args.threads])  # workers started, as a DataLoader's are
            start = time.perf_counter()
            pool.map(load, files, chunksize=1)
            seconds = time.perf_counter() - start
    else:
        load(files[0])  # untimed: Pillow's plugins and NumPy's first calls, as in a warm worker
        start = time.perf_counter()
        for f in files:
            load(f)
        seconds = time.perf_counter() - start
    print(f"seconds {seconds:.6f} images {len(files)}")


if __name__ == "__main__":
    main()
