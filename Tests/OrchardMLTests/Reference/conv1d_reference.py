"""Writes the PyTorch reference values of Conv1DReferenceTests.swift (run with PyTorch 2.x; prints Swift literals).

A Conv1d(3 -> 4, kernel 3, stride 2) followed by MaxPool1d(2) on a batch of 2 sequences of 9 steps, with the
MSE loss (mean over every value) against fixed targets: the forward output and the gradients of the loss with
respect to the weight and the bias (the input's gradient is checked against finite differences in GradientCheckTests). Inputs, weights and targets are closed-form (no random numbers), so
the Swift test builds the same ones.
"""
import math
import torch

torch.set_default_dtype(torch.float64)
x = torch.tensor([[[math.sin(0.3 * (b * 27 + c * 9 + t) + 0.1 * c) for t in range(9)] for c in range(3)] for b in range(2)], requires_grad=True)
conv = torch.nn.Conv1d(3, 4, kernel_size=3, stride=2)
with torch.no_grad():
    conv.weight.copy_(torch.tensor([[[math.cos(0.7 * (f * 9 + c * 3 + k)) * 0.5 for k in range(3)] for c in range(3)] for f in range(4)]))
    conv.bias.copy_(torch.tensor([0.1 * f - 0.15 for f in range(4)]))
y = conv(x)                          # [2, 4, 4]
z = torch.nn.functional.max_pool1d(y, 2)  # [2, 4, 2]
target = torch.tensor([[[0.05 * (b * 8 + f * 2 + t) - 0.3 for t in range(2)] for f in range(4)] for b in range(2)])
loss = torch.nn.functional.mse_loss(z, target)
loss.backward()


def swift(name, tensor):
    values = ", ".join(f"{v:.9g}" for v in tensor.detach().flatten().tolist())
    print(f"    static let {name}: [Double] = [{values}]")


swift("output", z)
swift("weightGradient", conv.weight.grad)
swift("biasGradient", conv.bias.grad)
print(f"    static let loss = {loss.item():.12g}")
