#!/usr/bin/env python3
"""Plain-PyTorch FedAvg reference (McMahan et al. 2017) for `orchard simulate`'s Fashion-MNIST proof.

Same setup as `orchard simulate --dataset fashion-mnist --model mlp2nn --clients 100 --fraction 0.1
--local-epochs 1 --batch-size 10 --lr 0.05 --partition iid --availability always --transport memory`:
K = 100 clients holding 600 IID training images each (pixels scaled to [0, 1], no standardisation); every round
m = max(ceil(C·K), 1) clients chosen uniformly without replacement, each running E local epochs of plain minibatch
SGD (batch B, a fresh shuffle per epoch) from the current global 2NN (784-200-200-10, ReLU, softmax
cross-entropy averaged over the batch); the server replaces the global weights with the clients' weights averaged
by sample count n_k. The global model is evaluated on the 10 000 test images after every round (`--eval-every N`:
after every N-th round and the last, as `orchard simulate --eval-every N`).

`--init pytorch` (default) keeps PyTorch's own initialisation (weights and biases uniform in ±1/√fan_in), as a
PyTorch framework (Flower, FedML, pfl with torch) runs the paper; `--init he` uses He-uniform weights
(±√(6/fan_in)) and zero biases instead, to compare initialisations.

Prints one JSON line: test accuracy after each round, at rounds 20/50/100, and the wall time of the rounds (data
loading excluded). Not run by CI; a benchmark only (see docs/benchmarks.md).
"""
import argparse
import gzip
import json
import math
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def mlp2nn():
    return nn.Sequential(nn.Linear(784, 200), nn.ReLU(), nn.Linear(200, 200), nn.ReLU(), nn.Linear(200, 10))


def he_uniform_(model):
    with torch.no_grad():
        for layer in model:
            if isinstance(layer, nn.Linear):
                bound = math.sqrt(6 / layer.in_features)
                layer.weight.uniform_(-bound, bound)
                layer.bias.zero_()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--fraction", type=float, default=0.1)
    parser.add_argument("--local-epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--init", choices=["pytorch", "he"], default="pytorch")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: PyTorch's default)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--eval-every", type=int, default=1, help="evaluate after every N-th round and the last")
    args = parser.parse_args()

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)

    def images(name):
        return torch.from_numpy(read_idx(f"{args.data}/{name}-images-idx3-ubyte.gz").reshape(-1, 784).astype(np.float32) / 255)

    def labels(name):
        return torch.from_numpy(read_idx(f"{args.data}/{name}-labels-idx1-ubyte.gz").astype(np.int64))

    x_train, y_train, x_test, y_test = images("train"), labels("train"), images("t10k"), labels("t10k")
    shards = np.array_split(rng.permutation(len(x_train)), args.clients)

    model = mlp2nn()
    if args.init == "he":
        he_uniform_(model)
    local = mlp2nn()
    per_round = max(1, math.ceil(args.fraction * args.clients - 1e-9))
    accuracy = {}
    start = time.perf_counter()
    for r in range(1, args.rounds + 1):
        chosen = rng.choice(args.clients, per_round, replace=False)
        global_state = {k: v.clone() for k, v in model.state_dict().items()}
        total = {k: torch.zeros_like(v) for k, v in global_state.items()}
        weight = 0
        for c in chosen:
            local.load_state_dict(global_state)
            opt = torch.optim.SGD(local.parameters(), lr=args.lr)
            idx = shards[c]
            for _ in range(args.local_epochs):
                perm = rng.permutation(idx)
                for b in range(0, len(perm), args.batch_size):
                    batch = perm[b:b + args.batch_size]
                    opt.zero_grad()
                    F.cross_entropy(local(x_train[batch]), y_train[batch]).backward()
                    opt.step()
            for k, v in local.state_dict().items():
                total[k] += v * len(idx)
            weight += len(idx)
        model.load_state_dict({k: v / weight for k, v in total.items()})
        if r % args.eval_every == 0 or r == args.rounds:
            with torch.no_grad():
                accuracy[r] = float((model(x_test).argmax(1) == y_test).float().mean())
    wall = time.perf_counter() - start
    print(json.dumps({
        "framework": f"pytorch {torch.__version__}", "init": args.init, "threads": torch.get_num_threads(),
        "seed": args.seed, "rounds": args.rounds, "eval_every": args.eval_every, "wall_seconds": round(wall, 3),
        "accuracy_at": {str(k): round(accuracy[k], 4) for k in (20, 50, 100) if k in accuracy},
        "accuracy": {str(k): round(accuracy[k], 4) for k in sorted(accuracy)},
    }, separators=(",", ":")))


if __name__ == "__main__":
    main()
