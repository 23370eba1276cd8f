#!/usr/bin/env python3
"""Flower reference for `orchard simulate`'s benchmarks: FedAvg on Fashion-MNIST in Flower's simulation engine.

The same recipe as `orchard simulate --dataset fashion-mnist --model mlp2nn` (and `fedavg_reference.py`), run as a
Flower 1.41 app with the Message API: a `ClientApp` whose `@app.train()` function runs the local SGD, a `ServerApp`
running `flwr.serverapp.strategy.FedAvg` with a centralised `evaluate_fn`, both driven by
`flwr.simulation.run_simulation` on the Ray backend with `--workers` actors of one CPU each. PyTorch is not needed:
the 2NN (784-200-200-10, ReLU, softmax cross-entropy averaged over the batch, PyTorch's default initialisation:
weights and biases uniform in ±1/√fan_in, seeded) and its SGD are written in NumPy (float32, pixels scaled to [0, 1]).

N = `--clients` virtual SuperNodes hold an IID partition: a seeded permutation of the 60 000 training images split
into N near-equal slices (as `np.array_split`; with N > 60 000 some nodes hold nothing and report 0 examples, which
the aggregation skips instead of dividing by zero). Every round FedAvg samples m = max(1, round(C·N)) nodes
(`fraction_train=C` with `min_train_nodes=m`; FedAvg alone would take max(int(C·N), 2)) through Flower's own
sampler, which is not seeded (node ids are random), so two runs with the same `--seed` draw different clients; the
seed fixes the initial model, the partition and the local shuffles. Each sampled node runs `--local-epochs` epochs
of plain minibatch SGD (batch `--batch-size`, reshuffled every epoch, last partial batch included, `--lr`) from the
global model; the server replaces the global model by the sample-weighted mean (FedAvg). Federated evaluation is
off (`fraction_evaluate=0`); `evaluate_fn` evaluates the global model on the 10 000 test images after every
`--eval-every`-th round and the last.

Data loading and partitioning happen before `run_simulation` (`setup_seconds`): the training images are written,
in partition order, to a temporary uint8 `.npy` that the Ray actors memory-map; `wall_seconds` is the whole of
`run_simulation` (Ray start-up, node registration, all rounds and evaluations, shutdown). OMP/OpenBLAS/MKL threads
are pinned to 1 (like `fedavg_reference.py --threads 1`). Flower's and Ray's logging goes to stderr; stdout gets
exactly one JSON line at the end.

Benchmark cases (needs `pip install "flwr[simulation]==1.41.0"`, which brings Ray; NumPy is the only other need):

    python benchmarks/flower_fedavg.py --clients 100 --fraction 0.1 --rounds 100 --workers 2
    python benchmarks/flower_fedavg.py --clients 10000 --fraction 0.01 --rounds 3 --workers 2

Not run by CI; a benchmark only (see docs/benchmarks.md).
"""
import os

# Before NumPy is imported, here and (inherited through Ray's raylet) in every actor.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

import argparse  # noqa: E402
import gzip  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from logging import WARNING  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import flwr  # noqa: E402
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.serverapp import Grid, ServerApp  # noqa: E402
from flwr.serverapp.strategy import FedAvg  # noqa: E402
from flwr.simulation import run_simulation  # noqa: E402
from flwr.supercore import log  # noqa: E402

KEYS = ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias")
SIZES = (784, 200, 200, 10)
N_TRAIN = 60_000


# ---------------------------------------------------------------------------------------------------------------
# Model: the 2NN in NumPy, weights stored (out, in) as PyTorch's nn.Linear does.
# ---------------------------------------------------------------------------------------------------------------

def init_params(seed):
    """PyTorch's default nn.Linear initialisation: weight and bias uniform in ±1/√fan_in."""
    rng = np.random.default_rng(seed)
    params = []
    for fan_in, fan_out in zip(SIZES[:-1], SIZES[1:]):
        bound = 1.0 / np.sqrt(fan_in)
        params.append(rng.uniform(-bound, bound, (fan_out, fan_in)).astype(np.float32))
        params.append(rng.uniform(-bound, bound, fan_out).astype(np.float32))
    return params


def logits(params, x):
    w1, b1, w2, b2, w3, b3 = params
    h1 = np.maximum(x @ w1.T + b1, 0)
    h2 = np.maximum(h1 @ w2.T + b2, 0)
    return h2 @ w3.T + b3


def sgd_step(params, x, y, lr):
    """One SGD step on the batch-mean softmax cross-entropy, in place; returns the batch loss."""
    w1, b1, w2, b2, w3, b3 = params
    n = len(y)
    rows = np.arange(n)
    h1 = np.maximum(x @ w1.T + b1, 0)
    h2 = np.maximum(h1 @ w2.T + b2, 0)
    z = h2 @ w3.T + b3
    z -= z.max(axis=1, keepdims=True)
    e = np.exp(z)
    s = e.sum(axis=1, keepdims=True)
    loss = float(np.mean(np.log(s[:, 0]) - z[rows, y]))
    g = e / s  # softmax
    g[rows, y] -= 1
    g /= n
    dh2 = g @ w3
    dh2 *= h2 > 0
    dh1 = dh2 @ w2
    dh1 *= h1 > 0
    w3 -= lr * (g.T @ h2)
    b3 -= lr * g.sum(axis=0)
    w2 -= lr * (dh2.T @ h1)
    b2 -= lr * dh2.sum(axis=0)
    w1 -= lr * (dh1.T @ x)
    b1 -= lr * dh1.sum(axis=0)
    return loss


def to_record(params):
    return ArrayRecord({k: Array(p) for k, p in zip(KEYS, params)})


def from_record(record):
    out = []
    for k in KEYS:
        a = record[k].numpy()
        out.append(a if a.flags.writeable else a.copy())
    return out


def partition_bounds(partition_id, num_partitions, total=N_TRAIN):
    """Row range of slice `partition_id` of `np.array_split(range(total), num_partitions)`."""
    q, r = divmod(total, num_partitions)
    start = partition_id * q + min(partition_id, r)
    return start, start + q + (1 if partition_id < r else 0)


# ---------------------------------------------------------------------------------------------------------------
# ClientApp. Ray pickles it by reference to this module (main() re-imports this file under its own name), so the
# per-process data cache below survives from one message to the next inside an actor.
# ---------------------------------------------------------------------------------------------------------------

_DATA = {}


def _train_data(data_dir):
    if data_dir not in _DATA:
        _DATA.clear()
        _DATA[data_dir] = (np.load(os.path.join(data_dir, "train_x.npy"), mmap_mode="r"),
                           np.load(os.path.join(data_dir, "train_y.npy"), mmap_mode="r"))
    return _DATA[data_dir]


app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    cfg = msg.content["config"]
    partition_id = int(context.node_config["partition-id"])
    num_partitions = int(context.node_config["num-partitions"])
    start, end = partition_bounds(partition_id, num_partitions)
    n = end - start
    params = from_record(msg.content["arrays"])
    loss_sum = 0.0
    if n > 0:
        xs, ys = _train_data(str(cfg["data-dir"]))
        x = xs[start:end].astype(np.float32) / np.float32(255)
        y = ys[start:end].astype(np.int64)
        lr, batch = float(cfg["lr"]), int(cfg["batch-size"])
        rng = np.random.default_rng([int(cfg["seed"]), int(cfg["server-round"]), partition_id])
        for _ in range(int(cfg["local-epochs"])):
            order = rng.permutation(n)
            for b in range(0, n, batch):
                idx = order[b:b + batch]
                loss_sum += sgd_step(params, x[idx], y[idx], lr) * len(idx)
    epochs = max(1, int(cfg["local-epochs"]))
    metrics = MetricRecord({"train-loss": loss_sum / (n * epochs) if n else 0.0, "num-examples": n})
    return Message(content=RecordDict({"arrays": to_record(params), "metrics": metrics}), reply_to=msg)


# ---------------------------------------------------------------------------------------------------------------
# Server side.
# ---------------------------------------------------------------------------------------------------------------

class ZeroSafeFedAvg(FedAvg):
    """FedAvg that leaves out replies with 0 examples (weight 0 in the mean anyway) and keeps the global model
    when a round's sampled nodes hold no data at all, instead of dividing by a zero total weight."""

    failures = 0

    def aggregate_train(self, server_round, replies):
        replies = list(replies)
        errors = [m for m in replies if m.has_error()]
        self.failures += len(errors)
        kept = [m for m in replies if not m.has_error() and m.content["metrics"]["num-examples"] > 0]
        if not kept:
            log(WARNING, "round %d: no sampled node held any examples; global model kept", server_round)
            return None, None
        return super().aggregate_train(server_round, kept + errors)


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--fraction", type=float, default=0.1)
    parser.add_argument("--local-epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--eval-every", type=int, default=1, help="evaluate after every N-th round and the last")
    parser.add_argument("--workers", type=int, default=2, help="Ray actors (one CPU each)")
    args = parser.parse_args()
    if not 0 < args.fraction <= 1:
        parser.error("--fraction must be in (0, 1]")
    if args.clients < 1 or args.rounds < 1 or args.eval_every < 1 or args.workers < 1:
        parser.error("--clients, --rounds, --eval-every and --workers must be positive")

    # Ray pickles the ClientApp for every message; taking it from this file imported as a module (instead of
    # __main__) makes that pickling by reference, so actors import the module once and keep its data cache.
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    client_app = importlib.import_module(Path(__file__).stem).app

    # --- setup: data loading and partitioning ---
    setup_start = time.perf_counter()
    x_train = read_idx(f"{args.data}/train-images-idx3-ubyte.gz").reshape(-1, 784)
    y_train = read_idx(f"{args.data}/train-labels-idx1-ubyte.gz")
    x_test = read_idx(f"{args.data}/t10k-images-idx3-ubyte.gz").reshape(-1, 784).astype(np.float32) / np.float32(255)
    y_test = read_idx(f"{args.data}/t10k-labels-idx1-ubyte.gz").astype(np.int64)
    assert len(x_train) == N_TRAIN
    perm = np.random.default_rng(args.seed).permutation(N_TRAIN)
    data_dir = tempfile.mkdtemp(prefix="flower_fedavg_")
    np.save(os.path.join(data_dir, "train_x.npy"), x_train[perm])  # node k holds rows partition_bounds(k, N)
    np.save(os.path.join(data_dir, "train_y.npy"), y_train[perm])
    del x_train, y_train
    initial = init_params(args.seed)
    setup_seconds = time.perf_counter() - setup_start

    per_round = max(1, round(args.fraction * args.clients))
    accuracy = {}

    def evaluate_fn(server_round: int, arrays: ArrayRecord):
        if server_round == 0 or (server_round % args.eval_every and server_round != args.rounds):
            return None
        pred = logits(from_record(arrays), x_test).argmax(axis=1)
        accuracy[server_round] = float(np.mean(pred == y_test))
        return MetricRecord({"accuracy": accuracy[server_round]})

    strategy = ZeroSafeFedAvg(fraction_train=args.fraction, fraction_evaluate=0.0, min_train_nodes=per_round,
                              min_available_nodes=args.clients)  # wait until every node is registered
    server_app = ServerApp()

    @server_app.main()
    def server_main(grid: Grid, context: Context) -> None:
        strategy.start(
            grid=grid,
            initial_arrays=to_record(initial),
            num_rounds=args.rounds,
            train_config=ConfigRecord({"lr": args.lr, "batch-size": args.batch_size,
                                       "local-epochs": args.local_epochs, "seed": args.seed,
                                       "data-dir": data_dir}),
            evaluate_fn=evaluate_fn,
        )

    backend_config = {
        "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
        "init_args": {"num_cpus": args.workers, "num_gpus": 0, "include_dashboard": False,
                      "logging_level": "ERROR", "log_to_driver": True},
    }

    # Everything Flower, Ray and the actors write to stdout goes to stderr (child processes inherit fd 1).
    sys.stdout.flush()
    saved_stdout = os.dup(1)
    os.dup2(2, 1)
    try:
        start = time.perf_counter()
        run_simulation(server_app=server_app, client_app=client_app, num_supernodes=args.clients,
                       backend_name="ray", backend_config=backend_config)
        wall = time.perf_counter() - start
    finally:
        sys.stdout.flush()
        os.dup2(saved_stdout, 1)
        os.close(saved_stdout)
        shutil.rmtree(data_dir, ignore_errors=True)

    if args.rounds not in accuracy:
        sys.exit(f"flower_fedavg: the run did not finish ({sorted(accuracy)} evaluated)")
    print(json.dumps({
        "framework": "flower", "flwr_version": flwr.__version__, "clients": args.clients,
        "fraction": args.fraction, "clients_per_round": per_round, "rounds": args.rounds,
        "local_epochs": args.local_epochs, "batch_size": args.batch_size, "lr": args.lr,
        "eval_every": args.eval_every, "workers": args.workers, "seed": args.seed,
        "wall_seconds": round(wall, 3), "setup_seconds": round(setup_seconds, 3),
        "client_failures": strategy.failures,
        "accuracy_at": {str(k): round(accuracy[k], 4) for k in (20, 50, 100) if k in accuracy},
        "accuracy": {str(k): round(accuracy[k], 4) for k in sorted(accuracy)},
        "final_accuracy": round(accuracy[args.rounds], 4),
    }, separators=(",", ":")), flush=True)
    if strategy.failures:
        sys.exit(f"flower_fedavg: {strategy.failures} client replies were errors (see the log above)")


if __name__ == "__main__":
    main()
