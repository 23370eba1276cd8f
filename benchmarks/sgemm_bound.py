#!/usr/bin/env python3
"""The arithmetic bound of the 2NN (784-200-200-10) on this machine, from the vendor BLAS NumPy loads (OpenBLAS here).

Times, with `--threads` BLAS threads, the eight matrix products of one training step at `--batch` (forward: three
layers; backward: the input gradients of layers 2 and 3 — none for the first layer, whose input is the data — and the
three weight gradients), the three forward products of one evaluation pass over `--eval-rows` test images, and a
2048³ product, the machine's sgemm peak that `orchard bench train`'s roofline is measured against. Each figure is the
median of seven timed runs of many repetitions; the products run into preallocated outputs, so the step time is the
products alone: no activation, loss, update or data loading. The figures say how fast the recipe could run if it
were nothing but matrix products at the vendor library's speed:

    python3 benchmarks/sgemm_bound.py --batch 10 --threads 1    # a device's step, one core each
    python3 benchmarks/sgemm_bound.py --batch 256 --threads 2   # `orchard bench train --batch 256`'s step

Prints one JSON line (snake_case keys). Not run by CI; a benchmark only (see docs/benchmarks.md).
"""
import os
import sys


def _threads_from_argv(default="1"):
    for i, arg in enumerate(sys.argv):
        if arg == "--threads" and i + 1 < len(sys.argv):
            return sys.argv[i + 1]
        if arg.startswith("--threads="):
            return arg.split("=", 1)[1]
    return default


# Before NumPy is imported: the BLAS reads its thread count once.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = _threads_from_argv()

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

LAYERS = [(784, 200), (200, 200), (200, 10)]


def median_seconds(m, k, n, rng, budget=0.05):
    """Median seconds of one (m × k)·(k × n) product over seven runs of about `budget` seconds each."""
    a = rng.random((m, k), dtype=np.float32)
    b = rng.random((k, n), dtype=np.float32)
    c = np.empty((m, n), dtype=np.float32)
    for _ in range(5):
        np.matmul(a, b, out=c)
    start = time.perf_counter()
    np.matmul(a, b, out=c)
    reps = max(1, int(budget / max(time.perf_counter() - start, 1e-7)))
    runs = []
    for _ in range(7):
        start = time.perf_counter()
        for _ in range(reps):
            np.matmul(a, b, out=c)
        runs.append((time.perf_counter() - start) / reps)
    return statistics.median(runs)


def step_shapes(batch):
    """(name, (m, k, n)) of one training step's products at `batch`."""
    forward = [(f"forward_{i + 1}", (batch, fan_in, fan_out)) for i, (fan_in, fan_out) in enumerate(LAYERS)]
    input_grads = [(f"input_grad_{i + 2}", (batch, fan_out, fan_in)) for i, (fan_in, fan_out) in enumerate(LAYERS[1:])]
    weight_grads = [(f"weight_grad_{i + 1}", (fan_out, batch, fan_in)) for i, (fan_in, fan_out) in enumerate(LAYERS)]
    return forward + input_grads + weight_grads


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1, help="BLAS threads (set before NumPy loads)")
    parser.add_argument("--eval-rows", type=int, default=10000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.batch < 1 or args.threads < 1 or args.eval_rows < 1:
        parser.error("--batch, --threads and --eval-rows must be positive")
    rng = np.random.default_rng(args.seed)

    named = step_shapes(args.batch)
    shapes = [shape for _, shape in named]
    times = [median_seconds(m, k, n, rng) for m, k, n in shapes]
    step_flop = sum(2 * m * k * n for m, k, n in shapes)
    step_seconds = sum(times)
    eval_shapes = [(args.eval_rows, fan_in, fan_out) for fan_in, fan_out in LAYERS]
    eval_seconds = sum(median_seconds(m, k, n, rng, budget=0.2) for m, k, n in eval_shapes)
    eval_flop = sum(2 * m * k * n for m, k, n in eval_shapes)
    peak_seconds = median_seconds(2048, 2048, 2048, rng, budget=0.3)
    peak = 2 * 2048**3 / peak_seconds / 1e9
    step_gflops = step_flop / step_seconds / 1e9
    print(json.dumps({
        "engine": "numpy",
        "blas": np.show_config(mode="dicts").get("Build Dependencies", {}).get("blas", {}).get("name", "unknown"),
        "batch": args.batch,
        "threads": args.threads,
        "step_seconds": step_seconds,
        "step_flop_per_sample": step_flop / args.batch,
        "step_gflops": round(step_gflops, 1),
        "step_samples_per_second": round(args.batch / step_seconds),
        "per_product_gflops": {
            f"{name}_{m}x{k}x{n}": round(2 * m * k * n / t / 1e9, 1) for (name, (m, k, n)), t in zip(named, times)
        },
        "eval_rows": args.eval_rows,
        "eval_seconds": eval_seconds,
        "eval_gflops": round(eval_flop / eval_seconds / 1e9, 1),
        "peak_gflops": round(peak, 1),
        "step_fraction_of_peak": round(step_gflops / peak, 3),
    }, sort_keys=True))


if __name__ == "__main__":
    main()
