#!/usr/bin/env python3
"""pfl-research reference for `orchard simulate`'s benchmarks: FedAvg on Fashion-MNIST in Apple's pfl (PyTorch).

The same recipe as `orchard simulate --dataset fashion-mnist --model mlp2nn` (and `fedavg_reference.py`), run by
pfl 0.6.0's own simulation loop: `FederatedAveraging.run` on a `SimulatedBackend` over a `FederatedDataset`, the
2NN wrapped in `PyTorchModel`, test accuracy from a `CentralEvaluationCallback`. K = `--clients` users hold an IID
partition (a seeded permutation of the 60 000 training images split as `np.array_split`, pixels scaled to [0, 1]);
every round m = max(ceil(C·K), 1) users are drawn uniformly without replacement, each runs `--local-epochs` epochs
of plain minibatch SGD (batch B, reshuffled every epoch, last partial batch included, `--lr`) from the global 2NN
(784-200-200-10, ReLU, softmax cross-entropy averaged over the batch, PyTorch's default initialisation, seeded);
the model differences are weighted by sample count (`WeightByDatapoints`), summed, averaged and applied by a
central `torch.optim.SGD` with learning rate 1, i.e. plain FedAvg. The global model is evaluated on the 10 000 test
images after every `--eval-every`-th round and the last.

Where pfl's defaults differ from the recipe, the script plugs in its own pieces through pfl's interfaces:
- user sampler: pfl's 'random' sampler draws with replacement and 'minimize_reuse' cycles in a fixed order, so a
  small callable draws each round's cohort with `Generator.choice(K, m, replace=False)`;
- user dataset: `Dataset.iter` yields the batches in a fixed order, so `ShuffledDataset` reshuffles per call
  (once per local epoch; a single full batch, as in evaluation, is left unshuffled);
- central evaluation: `CentralEvaluationCallback` evaluates before training and skips central iteration 0 (so
  with frequency N it evaluates after rounds N+1, 2N+1, …); `RoundEvaluation` drops the round-0 evaluation and
  evaluates after round r = iteration + 1 when r % N == 0 or r is the last round.
pfl itself still evaluates the 10 sampled users on their own training data before and after local training in
central iteration 0 (`iteration % evaluation_frequency == 0` holds there for any frequency); it changes nothing.

`wall_seconds` is `algorithm.run` (all rounds and evaluations); data loading, partitioning and building pfl's
objects are `setup_seconds`. Threads: `torch.set_num_threads(--threads)` (default 1). pfl's per-iteration metric
printing is off (`send_metrics_to_platform=False`); stdout gets exactly one JSON line at the end.

    pip install pfl==0.6.0   # with torch
    python benchmarks/pfl_fedavg.py --threads 1

Not run by CI; a benchmark only (see docs/benchmarks.md).
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

import pfl
from pfl.aggregate.simulate import SimulatedBackend
from pfl.aggregate.weighting import WeightByDatapoints
from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
from pfl.callback.central_evaluation import CentralEvaluationCallback
from pfl.data.dataset import Dataset
from pfl.data.federated_dataset import FederatedDataset
from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
from pfl.metrics import Metrics, Weighted
from pfl.model.pytorch import PyTorchModel


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


class MLP2NN(nn.Sequential):
    """The 2NN with the `loss` and `metrics` methods `PyTorchModel` calls with a batch unpacked."""

    def __init__(self):
        super().__init__(nn.Linear(784, 200), nn.ReLU(), nn.Linear(200, 200), nn.ReLU(), nn.Linear(200, 10))

    def loss(self, x, y):
        return F.cross_entropy(self(x), y)

    @torch.no_grad()
    def metrics(self, x, y):
        out = self(x)
        return {"loss": Weighted(float(F.cross_entropy(out, y, reduction="sum")), len(y)),
                "accuracy": Weighted(float((out.argmax(1) == y).sum()), len(y))}


class ShuffledDataset(Dataset):
    """A user's tensors, batched in a fresh random order on every `iter` call (one call per local epoch)."""

    def __init__(self, x, y, user_id, rng):
        super().__init__((x, y), user_id=user_id)
        self._rng = rng

    def iter(self, batch_size):  # noqa: A003
        n = len(self)
        if batch_size is None or batch_size >= n:
            yield self.raw_data
            return
        order = torch.from_numpy(self._rng.permutation(n))
        for b in range(0, n, batch_size):
            idx = order[b:b + batch_size]
            yield tuple(t[idx] for t in self.raw_data)


class CohortSampler:
    """pfl user sampler (a callable returning one user id): each round's m ids drawn without replacement."""

    def __init__(self, num_users, per_round, rng):
        self.num_users, self.per_round, self.rng, self.queue = num_users, per_round, rng, []

    def __call__(self):
        if not self.queue:
            self.queue = list(self.rng.choice(self.num_users, self.per_round, replace=False))
        return int(self.queue.pop(0))


class RoundEvaluation(CentralEvaluationCallback):
    """Central evaluation after round r = central iteration + 1 when r % every == 0 or r == rounds; records it."""

    def __init__(self, dataset, every, rounds):
        super().__init__(dataset, model_eval_params=NNEvalHyperParams(local_batch_size=None), frequency=1)
        self.every, self.rounds, self.accuracy = every, rounds, {}

    def on_train_begin(self, *, model):
        return Metrics()

    def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
        r = central_iteration + 1
        if r % self.every and r != self.rounds:
            return False, Metrics()
        stop, metrics = super().after_central_iteration(aggregate_metrics, model, central_iteration=r)
        self.accuracy[r] = metrics.to_simple_dict()["Central val | accuracy"]
        return stop, metrics


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--fraction", type=float, default=0.1)
    parser.add_argument("--local-epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--eval-every", type=int, default=1, help="evaluate after every N-th round and the last")
    args = parser.parse_args()
    if not 0 < args.fraction <= 1:
        parser.error("--fraction must be in (0, 1]")
    if min(args.clients, args.rounds, args.eval_every, args.threads, args.local_epochs, args.batch_size) < 1:
        parser.error("--clients, --rounds, --eval-every, --threads, --local-epochs, --batch-size must be positive")

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)  # pfl's internal seeds (algorithm, dataset, backend) come from NumPy's global state
    rng = np.random.default_rng(args.seed)

    # --- setup: data loading, partitioning, pfl objects ---
    setup_start = time.perf_counter()

    def images(name):
        return torch.from_numpy(read_idx(f"{args.data}/{name}-images-idx3-ubyte.gz").reshape(-1, 784).astype(np.float32) / 255)

    def labels(name):
        return torch.from_numpy(read_idx(f"{args.data}/{name}-labels-idx1-ubyte.gz").astype(np.int64))

    x_train, y_train, x_test, y_test = images("train"), labels("train"), images("t10k"), labels("t10k")
    shards = [torch.from_numpy(s) for s in np.array_split(rng.permutation(len(x_train)), args.clients)]
    user_data = [(x_train[s], y_train[s]) for s in shards]
    if any(len(s) == 0 for s in shards):
        parser.error("--clients exceeds the number of training images")

    per_round = max(1, math.ceil(args.fraction * args.clients - 1e-9))
    train_data = FederatedDataset(lambda uid: ShuffledDataset(*user_data[uid], user_id=uid, rng=rng),
                                  CohortSampler(args.clients, per_round, rng))
    net = MLP2NN()  # seeded by torch.manual_seed: the same initial model as fedavg_reference.py --seed S
    model = PyTorchModel(model=net, local_optimizer_create=torch.optim.SGD,
                         central_optimizer=torch.optim.SGD(net.parameters(), lr=1.0))
    backend = SimulatedBackend(training_data=train_data, val_data=train_data, postprocessors=[WeightByDatapoints()])
    algorithm_params = NNAlgorithmParams(central_num_iterations=args.rounds, evaluation_frequency=args.rounds + 1,
                                         train_cohort_size=per_round, val_cohort_size=None)
    train_params = NNTrainHyperParams(local_num_epochs=args.local_epochs, local_learning_rate=args.lr,
                                      local_batch_size=args.batch_size)
    evaluation = RoundEvaluation(Dataset((x_test, y_test)), args.eval_every, args.rounds)
    algorithm = FederatedAveraging()
    setup_seconds = time.perf_counter() - setup_start

    start = time.perf_counter()
    algorithm.run(algorithm_params=algorithm_params, backend=backend, model=model, model_train_params=train_params,
                  model_eval_params=NNEvalHyperParams(local_batch_size=None), callbacks=[evaluation],
                  send_metrics_to_platform=False)
    wall = time.perf_counter() - start

    accuracy = evaluation.accuracy
    print(json.dumps({
        "framework": "pfl", "engine": f"pfl {pfl.__version__}", "torch": torch.__version__, "init": "pytorch",
        "threads": torch.get_num_threads(), "clients": args.clients, "fraction": args.fraction,
        "clients_per_round": per_round, "rounds": args.rounds, "local_epochs": args.local_epochs,
        "batch_size": args.batch_size, "lr": args.lr, "eval_every": args.eval_every, "seed": args.seed,
        "wall_seconds": round(wall, 3), "setup_seconds": round(setup_seconds, 3),
        "accuracy_at": {str(k): round(accuracy[k], 4) for k in (20, 50, 100) if k in accuracy},
        "accuracy": {str(k): round(accuracy[k], 4) for k in sorted(accuracy)},
        "final_accuracy": round(accuracy[args.rounds], 4),
    }, separators=(",", ":")), flush=True)


if __name__ == "__main__":
    main()
