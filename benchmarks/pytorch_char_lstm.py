#!/usr/bin/env python3
"""PyTorch reference for `orchard bench train --model char-lstm`: a next-character model on seeded synthetic
sequences of the same size — embedding (64 symbols, width 8), nn.LSTM(8, 128, batch_first=True) over the whole
sequence, a per-step nn.Linear(128, 64), per-step softmax cross-entropy (mean over the characters of a sequence, then
over the batch; no padding here), plain SGD. Prints one JSON line with the keys `orchard bench train` prints. The
first epoch warms up; the reported figure is the median over the following --repeats epochs. Samples are sequences.

Tested with torch 2.13.0 (CPU wheel), NumPy 2.x.
"""
import argparse
import json
import resource
import statistics
import time

import numpy as np
import torch

VOCABULARY, WIDTH, UNITS = 64, 8, 128


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


class CharLSTM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCABULARY, WIDTH)
        self.lstm = torch.nn.LSTM(WIDTH, UNITS, batch_first=True)
        self.out = torch.nn.Linear(UNITS, VOCABULARY)

    def forward(self, x):
        h, _ = self.lstm(self.embed(x))
        return self.out(h)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="char-lstm")
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--samples", type=int, default=600)
    parser.add_argument("--sequence-length", type=int, default=80)
    parser.add_argument("--threads", type=int, default=None, help="default: PyTorch's own (the machine's cores), as `orchard bench train`")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if args.model != "char-lstm":
        parser.error("only char-lstm is available")

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    shape = (args.samples, args.sequence_length)
    x = torch.from_numpy(rng.integers(0, VOCABULARY, size=shape)).long()
    y = torch.from_numpy(rng.integers(0, VOCABULARY, size=shape)).long()
    dataset_mib = (2 * x.numel() * 4) / 1048576

    model = CharLSTM()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    generator = torch.Generator().manual_seed(args.seed)

    seconds = []
    last_loss = 0.0
    for epoch in range(args.repeats + 1):
        start = time.perf_counter()
        order = torch.randperm(args.samples, generator=generator)
        for i in range(0, args.samples, args.batch):
            idx = order[i:i + args.batch]
            optimizer.zero_grad(set_to_none=True)
            logits = model(x[idx])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCABULARY), y[idx].reshape(-1))
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
        "peak_rss_mib": round(peak, 1),
        "dataset_mib": round(dataset_mib, 1),
        "peak_rss_minus_dataset_mib": round(peak - dataset_mib, 1),
        "epoch_seconds": [round(s, 4) for s in seconds],
        "final_loss": last_loss,
        "engine": f"pytorch {torch.__version__}",
    }))


if __name__ == "__main__":
    main()
