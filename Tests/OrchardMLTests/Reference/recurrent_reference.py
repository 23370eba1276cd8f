"""Writes the PyTorch reference values of RecurrentReferenceTests.swift (run with PyTorch 2.x; prints Swift literals).

Three recurrent layers on a batch of 2 sequences of 5 steps of 3 features, hidden size 4, with the MSE loss (mean over
every value) against fixed targets: the output, the loss, and the gradients of the loss with respect to every
parameter (the input's gradient is checked against finite differences in GradientCheckTests).

- `lstm`: torch.nn.LSTM(3, 4, batch_first=True), the whole sequence returned.
- `gru`: torch.nn.GRU(3, 4, batch_first=True), the last step returned.
- `cifg`: an LSTM with coupled input and forget gates (f = 1 - i; gates i, g, o), written out in torch (PyTorch has no
  such layer), the last step returned.

Parameters are named as Orchard names them (`weight_ih`, `weight_hh`, `bias_ih`, `bias_hh`: nn.LSTM's and nn.GRU's
`*_l0` tensors as they are). Inputs, weights and targets are closed-form (no random numbers), so the Swift test builds
the same ones.
"""
import math
import torch

torch.set_default_dtype(torch.float64)
B, T, I, H = 2, 5, 3, 4


def values(shape, phase, scale=0.5):
    count = math.prod(shape)
    return torch.tensor([math.cos(0.7 * k + phase) * scale for k in range(count)]).reshape(shape)


def inputs():
    return torch.tensor([[[math.sin(0.3 * (b * 15 + t * 3 + i) + 0.1 * i) for i in range(I)] for t in range(T)] for b in range(B)], requires_grad=True)


def target(shape):
    count = math.prod(shape)
    return torch.tensor([0.05 * k - 0.3 for k in range(count)]).reshape(shape)


def parameters(gates):
    return {
        "weight_ih": values((gates * H, I), 0.0).requires_grad_(),
        "weight_hh": values((gates * H, H), 1.0).requires_grad_(),
        "bias_ih": values((gates * H,), 2.0, 0.2).requires_grad_(),
        "bias_hh": values((gates * H,), 3.0, 0.2).requires_grad_(),
    }


def swift(name, tensor):
    text = ", ".join(f"{v:.9g}" for v in tensor.detach().flatten().tolist())
    print(f"    static let {name}: [Double] = [{text}]")


def report(prefix, output, loss, x, p, module=None):
    """Prints the output, the loss and the parameters' gradients (a PyTorch module's `*_l0` ones when given)."""
    loss.backward()
    if module is not None:
        for name in p:
            p[name].grad = getattr(module, name + "_l0").grad
    swift(f"{prefix}Output", output)
    print(f"    static let {prefix}Loss = {loss.item():.12g}")
    for name in ["weight_ih", "weight_hh", "bias_ih", "bias_hh"]:
        camel = "".join(part.capitalize() for part in name.split("_"))
        swift(f"{prefix}{camel}Gradient", p[name].grad)


# LSTM, whole sequence.
x = inputs()
p = parameters(4)
lstm = torch.nn.LSTM(I, H, batch_first=True)
with torch.no_grad():
    for name, value in p.items():
        getattr(lstm, name + "_l0").copy_(value)
y, _ = lstm(x)
report("lstm", y, torch.nn.functional.mse_loss(y, target((B, T, H))), x, p, lstm)

# GRU, last step.
x = inputs()
p = parameters(3)
gru = torch.nn.GRU(I, H, batch_first=True)
with torch.no_grad():
    for name, value in p.items():
        getattr(gru, name + "_l0").copy_(value)
y, _ = gru(x)
last = y[:, -1, :]
report("gru", last, torch.nn.functional.mse_loss(last, target((B, H))), x, p, gru)

# CIFG LSTM, last step, written out.
x = inputs()
p = parameters(3)
h = torch.zeros(B, H)
c = torch.zeros(B, H)
for t in range(T):
    a = x[:, t, :] @ p["weight_ih"].T + p["bias_ih"] + h @ p["weight_hh"].T + p["bias_hh"]
    i = torch.sigmoid(a[:, 0:H])
    g = torch.tanh(a[:, H:2 * H])
    o = torch.sigmoid(a[:, 2 * H:3 * H])
    c = (1 - i) * c + i * g
    h = o * torch.tanh(c)
loss = torch.nn.functional.mse_loss(h, target((B, H)))
report("cifg", h, loss, x, p)

# A next-character model: embedding (6 symbols, width 3) of 5 indices, viewed as [5, 3], an LSTM over the whole
# sequence, a linear layer over the last axis to 6 classes, softmax; per-step cross-entropy with -1 marking padding.
# A sample's loss is the mean over its steps that are not padding; the batch's, the mean over samples.
V, E = 6, 3
indices = torch.tensor([[(b * 5 + t * 2) % V for t in range(T)] for b in range(B)])
labels = torch.tensor([[1, 4, 0, 5, 2], [3, -1, 2, -1, -1]])
embedding = values((V, E), 4.0).requires_grad_()
p = parameters(4)
p["weight_ih"] = values((4 * H, E), 0.0).requires_grad_()
dense_w = values((V, H), 5.0).requires_grad_()
dense_b = values((V,), 6.0, 0.1).requires_grad_()
lstm = torch.nn.LSTM(E, H, batch_first=True)
with torch.no_grad():
    for name, value in p.items():
        getattr(lstm, name + "_l0").copy_(value)
x = embedding[indices]
y, _ = lstm(x)
logits = y @ dense_w.T + dense_b
per_step = torch.nn.functional.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), ignore_index=-1, reduction="none").reshape(B, T)
mask = (labels != -1).double()
loss = ((per_step * mask).sum(1) / mask.sum(1)).mean()
loss.backward()
swift("charProbabilities", torch.softmax(logits, -1))
print(f"    static let charLoss = {loss.item():.12g}")
swift("charEmbeddingGradient", embedding.grad)
swift("charWeightIhGradient", lstm.weight_ih_l0.grad)
swift("charDenseWeightGradient", dense_w.grad)
swift("charDenseBiasGradient", dense_b.grad)
