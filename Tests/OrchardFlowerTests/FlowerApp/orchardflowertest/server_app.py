"""FedAvg over the MLP; writes every round's aggregated replies and the final arrays to `output` (JSON).

With `mode = "probe"` it instead sends one node a series of bad messages (and a good one last) and records each
reply's error or metrics.
"""
import json
import time

import numpy as np
import flwr.superlink.grid.http_grid as http_grid
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from . import mlp

app = ServerApp()


class RecordingFedAvg(FedAvg):
    """FedAvg that keeps, per round, the arrays and `num-examples` of every reply it aggregates."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.rounds = []

    def aggregate_train(self, server_round, replies):
        replies = list(replies)
        seen = []
        for reply in replies:
            if reply.has_error():
                seen.append({"node_id": str(reply.metadata.src_node_id), "error": reply.error.reason})
                continue
            arrays = reply.content["arrays"]
            seen.append({
                "node_id": str(reply.metadata.src_node_id),
                "num_examples": int(reply.content["metrics"]["num-examples"]),
                "arrays": {name: arrays[name].numpy().astype(float).ravel().tolist() for name in arrays.keys()},
            })
        self.rounds.append({"round": server_round, "replies": seen})
        return super().aggregate_train(server_round, replies)


def _arrays(weights) -> ArrayRecord:
    return ArrayRecord({name: Array(a) for name, a in zip(mlp.NAMES, weights)})


class Withhold:
    """The grid's `push_objects`, except that the ids in `ids` are never pushed: the SuperLink lists them in the
    message's tree but never has their bytes (a missing object, as a crashed or malicious server would leave)."""

    def __init__(self, original):
        self.original = original
        self.ids = set()

    def __call__(self, objects, push_object_fn, *, object_ids_to_push=None, **kwargs):
        wanted = set(objects) if object_ids_to_push is None else set(object_ids_to_push)
        return self.original(objects, push_object_fn, object_ids_to_push=wanted - self.ids, **kwargs)


def probe(grid: Grid, config) -> None:
    """Sends bad messages to the first node, one at a time, and records the replies."""
    deadline = time.time() + 120
    while not list(grid.get_node_ids()):
        if time.time() > deadline:
            raise RuntimeError("no node connected")
        time.sleep(0.5)
    node = sorted(grid.get_node_ids())[0]
    good = mlp.initial(int(config["seed"]))
    train_config = ConfigRecord({"lr": 0.1, "local-epochs": 1, "batch-size": 8})
    wrong_shape = [a.copy() for a in good]
    wrong_shape[0] = np.zeros((4, 8), dtype=np.float32)
    cases = {
        "unknown_type": RecordDict({"config": ConfigRecord({"x": 1})}),
        "wrong_shape": RecordDict({"arrays": _arrays(wrong_shape), "config": train_config}),
        "wrong_count": RecordDict({"arrays": _arrays(good[:3]), "config": train_config}),
        "wrong_dtype": RecordDict({"arrays": ArrayRecord({n: Array(a.astype(np.int64)) for n, a in zip(mlp.NAMES, good)}), "config": train_config}),
        "no_arrays": RecordDict({"config": train_config}),
        "bad_learning_rate": RecordDict({"arrays": _arrays(good), "config": ConfigRecord({"lr": -1.0})}),
        "missing_object": RecordDict({"arrays": _arrays(good), "config": train_config}),
        "too_many_objects": RecordDict({"arrays": ArrayRecord({f"a{i}": Array(np.full(1, i, dtype=np.float32)) for i in range(40)}), "config": train_config}),
        "good": RecordDict({"arrays": _arrays(good), "config": train_config}),
    }
    withhold = Withhold(http_grid.push_objects)
    http_grid.push_objects = withhold
    results = {}
    for name, content in cases.items():
        message_type = "query" if name == "unknown_type" else "train"
        withhold.ids = {content["arrays"]["fc1.weight"].object_id} if name == "missing_object" else set()
        replies = list(grid.send_and_receive([Message(content, dst_node_id=node, message_type=message_type)], timeout=120))
        if not replies:
            results[name] = {"missing": True}
        elif replies[0].has_error():
            results[name] = {"error_code": replies[0].error.code, "error": replies[0].error.reason}
        else:
            results[name] = {"metrics": dict(replies[0].content["metrics"])}
    with open(str(config["output"]), "w") as f:
        json.dump({"node_id": str(node), "cases": results}, f)


@app.main()
def main(grid: Grid, context: Context) -> None:
    config = context.run_config
    if config["mode"] == "probe":
        probe(grid, config)
        return
    nodes = int(config["min-nodes"])
    strategy = RecordingFedAvg(fraction_train=1.0, fraction_evaluate=1.0, min_train_nodes=nodes, min_evaluate_nodes=nodes, min_available_nodes=nodes)
    initial = ArrayRecord({name: Array(a) for name, a in zip(mlp.NAMES, mlp.initial(int(config["seed"])))})
    train_config = ConfigRecord({"lr": float(config["lr"]), "local-epochs": int(config["local-epochs"]), "batch-size": int(config["batch-size"])})
    result = strategy.start(grid=grid, initial_arrays=initial, num_rounds=int(config["num-server-rounds"]), train_config=train_config)
    if config["output"]:
        final = {name: result.arrays[name].numpy().astype(float).ravel().tolist() for name in result.arrays.keys()}
        evaluate = {str(k): dict(v) for k, v in result.evaluate_metrics_clientapp.items()}
        with open(str(config["output"]), "w") as f:
            json.dump({"initial": {n: a.astype(float).ravel().tolist() for n, a in zip(mlp.NAMES, mlp.initial(int(config["seed"])))},
                       "rounds": strategy.rounds, "final": final, "evaluate": evaluate}, f)
