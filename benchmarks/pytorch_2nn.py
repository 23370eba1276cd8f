#!/usr/bin/env python3
"""PyTorch reference for `orchard bench train --model mlp2nn`: the FedAvg paper's 2NN (784-200-200-10, ReLU,
softmax cross-entropy, plain SGD) on seeded synthetic data of the same size. Prints one JSON line with the same
keys. The first epoch warms up; the reported figure is the median over the following --repeats epochs."""
import argparse
import json
import resource
import statistics
import time

import numpy as np
import torch


def peak_rss_mib():
    """Peak resident set size in MiB (VmHWM is in KiB), as `orchard bench` reports it."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="mlp2nn")
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--samples", type=int, default=6000)
    parser.add_argument("--threads", type=int, default=None, help="default: PyTorch's own (the machine's cores), as `orchard bench train`")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if args.model != "mlp2nn":
        parser.error("only mlp2nn is available")

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    x = torch.from_numpy(rng.random((args.samples, 784), dtype=np.float32))
    y = torch.from_numpy(rng.integers(0, 10, size=args.samples)).long()
    dataset_mib = (x.numel() * 4 + args.samples * 4) / 1048576

    model = torch.nn.Sequential(
        torch.nn.Linear(784, 200), torch.nn.ReLU(),
        torch.nn.Linear(200, 200), torch.nn.ReLU(),
        torch.nn.Linear(200, 10),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = torch.nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(args.seed)

    seconds = []
    last_loss = 0.0
    for epoch in range(args.repeats + 1):
        start = time.perf_counter()
        order = torch.randperm(args.samples, generator=generator)
        for i in range(0, args.samples, args.batch):
            idx = order[i:i + args.batch]
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(x[idx]), y[idx])
            loss.backward()
            optimizer.step()
        last_loss = loss.item()
        if epoch > 0:
            seconds.append(time.perf_counter() - start)

    median = statistics.median(seconds)
    peak = peak_rss_mib()
    print(json.dumps({
        "model": args.model,
        "samples_per_second": round(args.samples / median),
        "batch": args.batch,
        "threads": torch.get_num_threads(),
        "samples": args.samples,
        "epochs": args.repeats,
        "steps_per_epoch": (args.samples + args.batch - 1) // args.batch,
        "backend": "torch " + torch.__version__,
        "peak_rss_mib": round(peak, 1),
        "dataset_mib": round(dataset_mib, 1),
        "peak_rss_minus_dataset_mib": round(peak - dataset_mib, 1),
        "epoch_seconds": [round(s, 4) for s in seconds],
        "final_loss": last_loss,
        "engine": "pytorch",
    }, sort_keys=True))


if __name__ == "__main__":
    main()
