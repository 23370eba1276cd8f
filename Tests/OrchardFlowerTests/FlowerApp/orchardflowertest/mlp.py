"""The model shared with the tests' Orchard model: dense 4→8 (ReLU) → dense 8→3 → softmax, cross-entropy.

Arrays in Orchard's positional order, PyTorch's layout: fc1.weight [8, 4], fc1.bias [8], fc2.weight [3, 8],
fc2.bias [3]. Data: a seeded synthetic 3-class problem per partition.
"""
import numpy as np

NAMES = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]


def initial(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [
        (rng.standard_normal((8, 4)) * 0.5).astype(np.float32),
        np.zeros(8, dtype=np.float32),
        (rng.standard_normal((3, 8)) * 0.5).astype(np.float32),
        np.zeros(3, dtype=np.float32),
    ]


def data(partition: int, samples: int = 40) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1000 + partition)
    y = rng.integers(0, 3, samples)
    centres = np.array([[1, 0, 0, 1], [0, 1, 1, 0], [1, 1, 0, 0]], dtype=np.float32)
    x = centres[y] + rng.standard_normal((samples, 4)).astype(np.float32) * 0.3
    return x.astype(np.float32), y.astype(np.int64)


def forward(w, x):
    h = np.maximum(x @ w[0].T + w[1], 0)
    z = h @ w[2].T + w[3]
    z = z - z.max(axis=1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    return h, p


def train(w, x, y, lr: float, epochs: int, batch: int) -> tuple[list[np.ndarray], float]:
    w = [a.copy() for a in w]
    loss = 0.0
    for _ in range(epochs):
        total = 0.0
        for s in range(0, len(x), batch):
            xb, yb = x[s : s + batch], y[s : s + batch]
            h, p = forward(w, xb)
            total += -np.log(np.maximum(p[np.arange(len(yb)), yb], 1e-12)).sum()
            g = p.copy()
            g[np.arange(len(yb)), yb] -= 1
            g /= len(yb)
            gw2, gb2 = g.T @ h, g.sum(axis=0)
            gh = (g @ w[2]) * (h > 0)
            gw1, gb1 = gh.T @ xb, gh.sum(axis=0)
            for a, d in zip(w, [gw1, gb1, gw2, gb2]):
                a -= (lr * d).astype(np.float32)
        loss = total / len(x)
    return w, float(loss)
