#!/usr/bin/env python3
"""The PyTorch peer of examples/mnist_infer (benchmarks/inference_vs_torch.sh runs both).

    mnist_infer_torch.py CHECKPOINT.npz MNIST_DIR [--batch B] [--runs N] [--threads T]
    mnist_infer_torch.py CHECKPOINT.npz MNIST_DIR --numpy

The same 784-256-128-10 ReLU MLP as nn.Sequential of nn.Linear, its weights read from the
gradus checkpoint with numpy: gradus' nn::dense holds "fcK/w" as [in, out] and computes
x @ w + b, PyTorch's nn.Linear holds its weight as [out, in] and computes x @ weight.T +
bias, so weight = w.T. It measures what mnist_infer measures, the same way: the test
accuracy, the latency of one image at batch 1 (median and p99 over --runs single-image
runs after 10 warm-up runs) and the throughput at --batch (the median of 3 timed passes
over the test set after a warm-up pass), under torch.inference_mode() with
torch.set_num_threads(--threads); one JSON line on stdout, mnist_infer's fields.

--numpy: no PyTorch; the test accuracy of the same weights through the same [out, in]
layout, computed with numpy (a check of the layout where PyTorch is not installed).
"""
import argparse
import json
import struct
import sys
import time

import numpy as np


def idx(path):
    with open(path, "rb") as f:
        data = f.read()
    zero, kind, rank = struct.unpack(">HBB", data[:4])
    if zero != 0 or kind != 0x08:
        sys.exit(f"mnist_infer_torch: {path}: not an IDX file of unsigned bytes")
    dims = struct.unpack(">" + "I" * rank, data[4 : 4 + 4 * rank])
    return np.frombuffer(data, np.uint8, offset=4 + 4 * rank).reshape(dims)


def torch_layout(ckpt):
    """[(weight [out, in], bias [out])] of fc1, fc2, fc3: nn.Linear's layout."""
    f = np.load(ckpt)
    return [(np.ascontiguousarray(f[f"fc{k}/w"].T), f[f"fc{k}/b"]) for k in (1, 2, 3)]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("checkpoint")
    p.add_argument("data")
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--runs", type=int, default=1000)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--numpy", action="store_true")
    a = p.parse_args()
    images = idx(f"{a.data}/t10k-images-idx3-ubyte").reshape(-1, 784).astype(np.float32) / np.float32(255)
    labels = idx(f"{a.data}/t10k-labels-idx1-ubyte").astype(np.int64)
    layers = torch_layout(a.checkpoint)

    if a.numpy:
        h = images
        for k, (w, b) in enumerate(layers):
            h = h @ w.T + b
            if k < 2:
                h = np.maximum(h, 0)
        print(json.dumps({"example": "numpy", "test_accuracy": float((h.argmax(1) == labels).mean())}))
        return

    import torch

    torch.set_num_threads(a.threads)
    model = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128),
                                torch.nn.ReLU(), torch.nn.Linear(128, 10))
    with torch.no_grad():
        for lin, (w, b) in zip((model[0], model[2], model[4]), layers):
            lin.weight.copy_(torch.from_numpy(w))
            lin.bias.copy_(torch.from_numpy(b))
    model.eval()
    x_all, y_all = torch.from_numpy(images), torch.from_numpy(labels)
    n = x_all.shape[0]

    with torch.inference_mode():
        def classify_all():
            hits = 0
            for b0 in range(0, n, a.batch):
                hits += int((model(x_all[b0 : b0 + a.batch]).argmax(1) == y_all[b0 : b0 + a.batch]).sum())
            return hits

        hits = classify_all()  # (the warm-up)
        passes = []
        for _ in range(3):
            t0 = time.perf_counter()
            classify_all()
            passes.append(time.perf_counter() - t0)
        passes.sort()
        ms = []
        for r in range(-10, a.runs):
            i = (r + 10) % n
            t0 = time.perf_counter()
            out = model(x_all[i : i + 1])
            float(out[0, 0])  # the result read, as mnist_infer reads it
            if r >= 0:
                ms.append((time.perf_counter() - t0) * 1e3)
    ms.sort()

    def quantile(q):
        rank = int(np.ceil(q * len(ms)))
        return ms[min(len(ms) - 1, max(rank - 1, 0))]

    print(json.dumps({"example": "pytorch", "torch": torch.__version__, "batch": a.batch, "threads": a.threads,
                      "test_images": n, "test_accuracy": hits / n, "latency_runs": a.runs,
                      "latency_ms_median": quantile(0.5), "latency_ms_p99": quantile(0.99),
                      "images_per_second": n / passes[1]}))


if __name__ == "__main__":
    main()
