#!/usr/bin/env python3
"""Plain-PyTorch FedAvg reference (McMahan et al. 2017) for `orchard simulate`'s Fashion-MNIST proof.

Same setup as `orchard simulate --dataset fashion-mnist --model mlp2nn --clients 100 --fraction 0.1
--local-epochs 1 --batch-size 10 --lr 0.05 --partition iid --availability always`: 100 clients holding 600
IID training images each, 10 clients per round chosen uniformly without replacement, each training one local
epoch of plain SGD (batch 10, lr 0.05) from the current global 2NN (784-200-200-10, ReLU), the server averaging
the client models weighted by sample count. Prints one JSON object: test accuracy per round and wall time.
Not run by CI; a benchmark only.
"""
import argparse
import gzip
import json
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--fraction", type=float, default=0.1)
    parser.add_argument("--local-epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    x_train = torch.from_numpy(read_idx(f"{args.data}/train-images-idx3-ubyte.gz").reshape(-1, 784).astype(np.float32) / 255)
    y_train = torch.from_numpy(read_idx(f"{args.data}/train-labels-idx1-ubyte.gz").astype(np.int64))
    x_test = torch.from_numpy(read_idx(f"{args.data}/t10k-images-idx3-ubyte.gz").reshape(-1, 784).astype(np.float32) / 255)
    y_test = torch.from_numpy(read_idx(f"{args.data}/t10k-labels-idx1-ubyte.gz").astype(np.int64))

    order = rng.permutation(len(x_train))
    shards = np.array_split(order, args.clients)

    model = nn.Sequential(nn.Linear(784, 200), nn.ReLU(), nn.Linear(200, 200), nn.ReLU(), nn.Linear(200, 10))
    local = nn.Sequential(nn.Linear(784, 200), nn.ReLU(), nn.Linear(200, 200), nn.ReLU(), nn.Linear(200, 10))
    per_round = max(1, int(round(args.fraction * args.clients)))
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
        with torch.no_grad():
            accuracy[r] = float((model(x_test).argmax(1) == y_test).float().mean())
    wall = time.perf_counter() - start
    print(json.dumps({
        "framework": f"pytorch {torch.__version__}", "threads": torch.get_num_threads(), "rounds": args.rounds,
        "wall_seconds": round(wall, 3), "accuracy": {str(k): round(v, 4) for k, v in accuracy.items()},
        "accuracy_at": {str(k): round(accuracy[k], 4) for k in (20, 50, 100) if k in accuracy},
    }))


if __name__ == "__main__":
    main()
