"""FedAvg over the MLP; writes every round's aggregated replies and the final arrays to `output` (JSON)."""
import json

from flwr.app import Array, ArrayRecord, ConfigRecord, Context
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
                seen.append({"node_id": reply.metadata.src_node_id, "error": reply.error.reason})
                continue
            arrays = reply.content["arrays"]
            seen.append({
                "node_id": reply.metadata.src_node_id,
                "num_examples": int(reply.content["metrics"]["num-examples"]),
                "arrays": {name: arrays[name].numpy().astype(float).ravel().tolist() for name in arrays.keys()},
            })
        self.rounds.append({"round": server_round, "replies": seen})
        return super().aggregate_train(server_round, replies)


@app.main()
def main(grid: Grid, context: Context) -> None:
    config = context.run_config
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
