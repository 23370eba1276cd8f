"""The Python SuperNode's ClientApp: the same MLP in NumPy, on partition `partition-id` of the node config."""
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from . import mlp

app = ClientApp()


def _arrays(message: Message):
    record = message.content["arrays"]
    return [record[name].numpy() for name in record.keys()], list(record.keys())


@app.train()
def train(message: Message, context: Context) -> Message:
    weights, names = _arrays(message)
    config = message.content["config"]
    x, y = mlp.data(int(context.node_config["partition-id"]))
    trained, loss = mlp.train(weights, x, y, float(config["lr"]), int(config["local-epochs"]), int(config["batch-size"]))
    reply = RecordDict({
        "arrays": ArrayRecord({name: Array(a) for name, a in zip(names, trained)}),
        "metrics": MetricRecord({"num-examples": len(x), "train_loss": loss}),
    })
    return Message(content=reply, reply_to=message)


@app.evaluate()
def evaluate(message: Message, context: Context) -> Message:
    weights, _ = _arrays(message)
    x, y = mlp.data(int(context.node_config["partition-id"]))
    _, p = mlp.forward(weights, x)
    loss = float(-mlp.np.log(mlp.np.maximum(p[mlp.np.arange(len(y)), y], 1e-12)).mean())
    accuracy = float((p.argmax(axis=1) == y).mean())
    return Message(content=RecordDict({"metrics": MetricRecord({"num-examples": len(x), "eval_loss": loss, "eval_acc": accuracy})}), reply_to=message)
