#!/usr/bin/env python3
"""Builds updatable Core ML models with coremltools' NeuralNetworkBuilder for Orchard's import tests.

For every model NAME it writes, into the output directory:
  NAME.mlmodel              the Core ML model, saved by coremltools
  NAME.reference.safetensors  the weights in Orchard's layouts (`<layer>.weight`, `<layer>.bias`), computed here with
                            NumPy independently of Orchard; `input.<feature>` random inputs with a leading batch axis;
                            `expected` the NumPy forward pass of the same weights on those inputs
and prints a JSON manifest describing each model's training settings.

Usage: build_models.py OUTPUT_DIR [SEED]
"""

import json
import os
import sys

import numpy as np

try:
    import coremltools  # noqa: F401
    from coremltools.models import datatypes
    from coremltools.models.neural_network import AdamParams, NeuralNetworkBuilder, SgdParams
    from safetensors.numpy import save_file
except ImportError as error:  # pragma: no cover - reported to the Swift test
    sys.stderr.write(f"missing Python package: {error}. Install with: python3 -m pip install coremltools numpy safetensors\n")
    sys.exit(3)

OUT = sys.argv[1]
rng = np.random.default_rng(int(sys.argv[2]) if len(sys.argv) > 2 else 7)
BATCH = 5
manifest = {}


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32) * 0.5


def relu(x):
    return np.maximum(x, 0)


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def save(name, builder, reference, inputs, expected, info):
    path = os.path.join(OUT, name + ".mlmodel")
    coremltools.models.utils.save_spec(builder.spec, path)
    tensors = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in reference.items()}
    for key, value in inputs.items():
        tensors["input." + key] = np.ascontiguousarray(value, dtype=np.float32)
    tensors["expected"] = np.ascontiguousarray(expected, dtype=np.float32)
    save_file(tensors, os.path.join(OUT, name + ".reference.safetensors"))
    manifest[name] = info


def quiet(call, *args, **kwargs):
    # The builder prints notes about targets on stdout, which carries the manifest.
    stdout = sys.stdout
    sys.stdout = sys.stderr
    try:
        return call(*args, **kwargs)
    finally:
        sys.stdout = stdout


# 1. A neural-network regressor: dense -> relu -> dense -> sigmoid -> dense, MSE, SGD with momentum.
def mse_sgd():
    b = NeuralNetworkBuilder([("x", datatypes.Array(8))], [("y", datatypes.Array(2))], mode="regressor")
    w1, b1, w2, b2, w3, b3 = f32(16, 8), f32(16), f32(6, 16), f32(6), f32(2, 6), f32(2)
    b.add_inner_product("fc1", w1, b1, 8, 16, True, "x", "fc1")
    b.add_activation("act1", "RELU", "fc1", "act1")
    b.add_inner_product("fc2", w2, b2, 16, 6, True, "act1", "fc2")
    b.add_activation("act2", "SIGMOID", "fc2", "act2")
    b.add_inner_product("out", w3, b3, 6, 2, True, "act2", "y")
    quiet(b.make_updatable, ["fc1", "out"])
    quiet(b.set_mean_squared_error_loss, "loss", input_feature=("y", datatypes.Array(2)))
    sgd = SgdParams(lr=0.05, batch=8, momentum=0.9)
    sgd.set_batch(8, [4, 8, 16])
    b.set_sgd_optimizer(sgd)
    b.set_epochs(5)
    x = f32(BATCH, 8) * 2
    y = sigmoid(relu(x @ w1.T + b1) @ w2.T + b2) @ w3.T + b3
    save("mse_sgd", b, {"fc1.weight": w1, "fc1.bias": b1, "fc2.weight": w2, "fc2.bias": b2, "out.weight": w3, "out.bias": b3},
         {"x": x}, y,
         {"loss": "mse", "optimizer": "sgd", "learningRate": 0.05, "batchSize": 8, "momentum": 0.9, "epochs": 5,
          "batchSizes": [4, 8, 16], "updatable": ["fc1", "out"], "frozen": ["fc2"], "output": "out"})


# 2. Classification with an embedding: embedding + concat -> dense -> tanh -> dense (no bias) -> softmax, CE, Adam.
def ce_adam():
    b = NeuralNetworkBuilder([("x", datatypes.Array(6)), ("kind", datatypes.Array(1))], [("probs", datatypes.Array(3))])
    table = f32(3, 5)  # Core ML layout: outputChannels x inputDim
    w1, b1, w2 = f32(10, 9), f32(10), f32(3, 10)
    b.add_embedding("emb", table, None, 5, 3, False, "kind", "emb")
    b.add_elementwise("joined", ["x", "emb"], "joined", "CONCAT")
    b.add_inner_product("fc1", w1, b1, 9, 10, True, "joined", "fc1")
    b.add_activation("act1", "TANH", "fc1", "act1")
    b.add_inner_product("fc2", w2, None, 10, 3, False, "act1", "fc2")
    b.add_softmax("probs", "fc2", "probs")
    quiet(b.make_updatable, ["fc1", "fc2"])
    quiet(b.set_categorical_cross_entropy_loss, "loss", input="probs")
    adam = AdamParams(lr=0.002, batch=16, beta1=0.85, beta2=0.995, eps=1e-7)
    adam.set_lr(0.002, 0.0001, 0.5)
    b.set_adam_optimizer(adam)
    b.set_epochs(10, [5, 10, 20])
    x = f32(BATCH, 6) * 2
    kind = rng.integers(0, 5, size=(BATCH, 1)).astype(np.float32)
    joined = np.concatenate([x, table.T[kind[:, 0].astype(int)]], axis=1)
    y = softmax(np.tanh(joined @ w1.T + b1) @ w2.T)
    save("ce_adam", b, {"emb.weight": table.T, "fc1.weight": w1, "fc1.bias": b1, "fc2.weight": w2},
         {"x": x, "kind": kind}, y,
         {"loss": "crossEntropy", "optimizer": "adam", "learningRate": 0.002, "batchSize": 16, "beta1": 0.85,
          "beta2": 0.995, "epsilon": 1e-7, "epochs": 10, "epochSet": [5, 10, 20], "learningRateRange": [0.0001, 0.5],
          "updatable": ["fc1", "fc2"], "frozen": ["emb"], "categorical": ["kind"], "output": "probs"})


def conv_numpy(x, w, bias, stride, pad_top, pad_bottom, pad_left, pad_right):
    n, c, h, wd = x.shape
    f, _, kh, kw = w.shape
    padded = np.pad(x, ((0, 0), (0, 0), (pad_top, pad_bottom), (pad_left, pad_right)))
    oh = (h + pad_top + pad_bottom - kh) // stride[0] + 1
    ow = (wd + pad_left + pad_right - kw) // stride[1] + 1
    out = np.zeros((n, f, oh, ow), dtype=np.float64)
    for i in range(oh):
        for j in range(ow):
            patch = padded[:, :, i * stride[0]:i * stride[0] + kh, j * stride[1]:j * stride[1] + kw]
            out[:, :, i, j] = np.einsum("nchw,fchw->nf", patch, w)
    return out + bias[None, :, None, None]


def maxpool_numpy(x, k, s):
    n, c, h, w = x.shape
    oh, ow = (h - k[0]) // s[0] + 1, (w - k[1]) // s[1] + 1
    out = np.zeros((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            out[:, :, i, j] = x[:, :, i * s[0]:i * s[0] + k[0], j * s[1]:j * s[1] + k[1]].max(axis=(2, 3))
    return out


# 3. Convolutions: same padding with stride 2 (TensorFlow's split), explicit padding, max pooling, flatten.
def conv():
    b = NeuralNetworkBuilder([("image", datatypes.Array(2, 9, 9))], [("probs", datatypes.Array(3))])
    k1, c1 = f32(3, 3, 2, 4), f32(4)  # builder layout: kh, kw, in, out
    k2, c2 = f32(2, 2, 4, 5), f32(5)
    b.add_convolution("conv1", 2, 4, 3, 3, 2, 2, "same", 1, k1, c1, True, input_name="image", output_name="conv1")
    b.add_activation("act1", "RELU", "conv1", "act1")
    b.add_convolution("conv2", 4, 5, 2, 2, 1, 1, "valid", 1, k2, c2, True, input_name="act1", output_name="conv2",
                      padding_top=1, padding_bottom=1, padding_left=1, padding_right=1)
    b.add_pooling("pool", 2, 2, 2, 2, "MAX", "VALID", "conv2", "pool")
    b.add_flatten("flat", 0, "pool", "flat")
    wf, bf = f32(3, 5 * 3 * 3), f32(3)
    b.add_inner_product("fc", wf, bf, 45, 3, True, "flat", "fc")
    b.add_softmax("probs", "fc", "probs")
    quiet(b.make_updatable, ["conv2", "fc"])
    quiet(b.set_categorical_cross_entropy_loss, "loss", input="probs")
    b.set_sgd_optimizer(SgdParams(lr=0.01, batch=4))
    b.set_epochs(3)
    w1, w2 = k1.transpose(3, 2, 0, 1), k2.transpose(3, 2, 0, 1)
    image = f32(BATCH, 2, 9, 9) * 2
    # Same padding, input 9, kernel 3, stride 2: output 5, total padding 2, split 1 before and 1 after.
    h = relu(conv_numpy(image, w1, c1, (2, 2), 1, 1, 1, 1))
    h = conv_numpy(h, w2, c2, (1, 1), 1, 1, 1, 1)
    h = maxpool_numpy(h, (2, 2), (2, 2))
    y = softmax(h.reshape(BATCH, -1) @ wf.T + bf)
    save("conv", b, {"conv1.weight": w1, "conv1.bias": c1, "conv2.weight": w2, "conv2.bias": c2, "fc.weight": wf, "fc.bias": bf},
         {"image": image}, y,
         {"loss": "crossEntropy", "optimizer": "sgd", "learningRate": 0.01, "batchSize": 4, "momentum": 0.0, "epochs": 3,
          "updatable": ["conv2", "fc"], "frozen": ["conv1"], "output": "probs",
          "padding": {"conv1": "same", "conv2": [1, 1], "pool": "valid"}, "strides": {"conv1": [2, 2], "conv2": [1, 1], "pool": [2, 2]}})


# 4. A neural-network classifier wrapper with string labels; the identity linear activation is dropped on import.
def classifier():
    b = NeuralNetworkBuilder([("features", datatypes.Array(4))], [("classProbs", None)], mode="classifier")
    w1, b1, w2, b2 = f32(7, 4), f32(7), f32(3, 7), f32(3)
    # Core ML cannot back-propagate through a linear activation, so it must come before every updatable layer.
    b.add_activation("ident", "LINEAR", "features", "ident", params=[1.0, 0.0])
    b.add_inner_product("fc1", w1, b1, 4, 7, True, "ident", "fc1")
    b.add_activation("act", "SIGMOID", "fc1", "act")
    b.add_inner_product("fc2", w2, b2, 7, 3, True, "act", "fc2")
    b.add_softmax("classProbs", "fc2", "classProbs")
    b.set_class_labels(["cat", "dog", "eel"], predicted_feature_name="label", prediction_blob="classProbs")
    quiet(b.make_updatable, ["fc1", "fc2"])
    quiet(b.set_categorical_cross_entropy_loss, "loss", input="classProbs")
    b.set_sgd_optimizer(SgdParams(lr=0.1, batch=2))
    b.set_epochs(2)
    x = f32(BATCH, 4) * 2
    y = softmax(sigmoid(x @ w1.T + b1) @ w2.T + b2)
    save("classifier", b, {"fc1.weight": w1, "fc1.bias": b1, "fc2.weight": w2, "fc2.bias": b2}, {"features": x}, y,
         {"loss": "crossEntropy", "optimizer": "sgd", "learningRate": 0.1, "batchSize": 2, "momentum": 0.0, "epochs": 2,
          "updatable": ["fc1", "fc2"], "frozen": [], "labels": ["cat", "dog", "eel"], "output": "classProbs"})


# 5. A layer Orchard does not have (batch normalization), to check the error names it.
def unsupported():
    b = NeuralNetworkBuilder([("x", datatypes.Array(3, 4, 4))], [("y", datatypes.Array(3, 4, 4))])
    b.add_batchnorm("norm", 3, np.ones(3), np.zeros(3), np.zeros(3), np.ones(3), "x", "y")
    coremltools.models.utils.save_spec(b.spec, os.path.join(OUT, "unsupported.mlmodel"))


# 6. A 3x3 convolution from one input channel to four (its channel counts must not be swapped on import).
def conv_1to4():
    b = NeuralNetworkBuilder([("image", datatypes.Array(1, 5, 5))], [("probs", datatypes.Array(2))])
    k, c = f32(3, 3, 1, 4), f32(4)
    b.add_convolution("conv", 1, 4, 3, 3, 1, 1, "valid", 1, k, c, True, input_name="image", output_name="conv")
    b.add_activation("act", "RELU", "conv", "act")
    b.add_flatten("flat", 0, "act", "flat")
    wf, bf = f32(2, 4 * 3 * 3), f32(2)
    b.add_inner_product("fc", wf, bf, 36, 2, True, "flat", "fc")
    b.add_softmax("probs", "fc", "probs")
    quiet(b.make_updatable, ["conv", "fc"])
    quiet(b.set_categorical_cross_entropy_loss, "loss", input="probs")
    b.set_sgd_optimizer(SgdParams(lr=0.02, batch=3))
    b.set_epochs(4)
    w = k.transpose(3, 2, 0, 1)
    image = f32(BATCH, 1, 5, 5)
    h = relu(conv_numpy(image, w, c, (1, 1), 0, 0, 0, 0))
    y = softmax(h.reshape(BATCH, -1) @ wf.T + bf)
    save("conv_1to4", b, {"conv.weight": w, "conv.bias": c, "fc.weight": wf, "fc.bias": bf}, {"image": image}, y,
         {"loss": "crossEntropy", "optimizer": "sgd", "learningRate": 0.02, "batchSize": 3, "momentum": 0.0, "epochs": 4,
          "updatable": ["conv", "fc"], "frozen": [], "output": "probs"})


# 7-9. Exact array shape mapping (iOS 13+): inputs keep their own rank, [C], [1, C] or [1, C, H, W].
def exact_mse_sgd():
    b = NeuralNetworkBuilder([("x", datatypes.Array(8))], [("y", datatypes.Array(2))], mode="regressor",
                             disable_rank5_shape_mapping=True)
    w1, b1, w2, b2 = f32(5, 8), f32(5), f32(2, 5), f32(2)
    b.add_inner_product("fc1", w1, b1, 8, 5, True, "x", "fc1")
    b.add_activation("act", "RELU", "fc1", "act")
    b.add_inner_product("out", w2, b2, 5, 2, True, "act", "y")
    quiet(b.make_updatable, ["fc1", "out"])
    quiet(b.set_mean_squared_error_loss, "loss", input_feature=("y", datatypes.Array(2)))
    b.set_sgd_optimizer(SgdParams(lr=0.03, batch=4, momentum=0.5))
    b.set_epochs(6)
    x = f32(BATCH, 8)
    y = relu(x @ w1.T + b1) @ w2.T + b2
    save("exact_mse_sgd", b, {"fc1.weight": w1, "fc1.bias": b1, "out.weight": w2, "out.bias": b2}, {"x": x}, y,
         {"loss": "mse", "optimizer": "sgd", "learningRate": 0.03, "batchSize": 4, "momentum": 0.5, "epochs": 6,
          "updatable": ["fc1", "out"], "frozen": [], "output": "out", "exact": True})


def exact_classifier():
    b = NeuralNetworkBuilder([("x", datatypes.Array(1, 6))], [("probs", datatypes.Array(1, 3))],
                             disable_rank5_shape_mapping=True)
    w1, b1, w2, b2 = f32(7, 6), f32(7), f32(3, 7), f32(3)
    b.add_inner_product("fc1", w1, b1, 6, 7, True, "x", "fc1")
    b.add_activation("act", "TANH", "fc1", "act")
    b.add_inner_product("fc2", w2, b2, 7, 3, True, "act", "fc2")
    b.add_softmax("probs", "fc2", "probs")
    quiet(b.make_updatable, ["fc2"])
    quiet(b.set_categorical_cross_entropy_loss, "loss", input="probs")
    b.set_adam_optimizer(AdamParams(lr=0.004, batch=8, beta1=0.9, beta2=0.999, eps=1e-8))
    b.set_epochs(3)
    x = f32(BATCH, 6)
    y = softmax(np.tanh(x @ w1.T + b1) @ w2.T + b2)
    save("exact_classifier", b, {"fc1.weight": w1, "fc1.bias": b1, "fc2.weight": w2, "fc2.bias": b2}, {"x": x}, y,
         {"loss": "crossEntropy", "optimizer": "adam", "learningRate": 0.004, "batchSize": 8, "epochs": 3,
          "updatable": ["fc2"], "frozen": ["fc1"], "output": "probs", "exact": True})


def exact_conv():
    b = NeuralNetworkBuilder([("image", datatypes.Array(1, 2, 7, 7))], [("probs", datatypes.Array(1, 3, 1, 1))],
                             disable_rank5_shape_mapping=True)
    k, c = f32(3, 3, 2, 4), f32(4)
    b.add_convolution("conv", 2, 4, 3, 3, 1, 1, "valid", 1, k, c, True, input_name="image", output_name="conv")
    b.add_activation("act", "RELU", "conv", "act")
    b.add_pooling("pool", 2, 2, 2, 2, "MAX", "VALID", "act", "pool")
    b.add_flatten("flat", 0, "pool", "flat")
    wf, bf = f32(3, 4 * 2 * 2), f32(3)
    b.add_inner_product("fc", wf, bf, 16, 3, True, "flat", "fc")
    b.add_softmax("probs", "fc", "probs")
    quiet(b.make_updatable, ["conv", "fc"])
    quiet(b.set_categorical_cross_entropy_loss, "loss", input="probs")
    b.set_sgd_optimizer(SgdParams(lr=0.05, batch=2))
    b.set_epochs(2)
    w = k.transpose(3, 2, 0, 1)
    image = f32(BATCH, 2, 7, 7)
    h = maxpool_numpy(relu(conv_numpy(image, w, c, (1, 1), 0, 0, 0, 0)), (2, 2), (2, 2))
    y = softmax(h.reshape(BATCH, -1) @ wf.T + bf)
    save("exact_conv", b, {"conv.weight": w, "conv.bias": c, "fc.weight": wf, "fc.bias": bf}, {"image": image}, y,
         {"loss": "crossEntropy", "optimizer": "sgd", "learningRate": 0.05, "batchSize": 2, "momentum": 0.0, "epochs": 2,
          "updatable": ["conv", "fc"], "frozen": [], "output": "probs", "exact": True})


# 10. Average pooling: valid, and same padding whose padded positions are left out of the average (coremltools'
# default exclude_pad_area=True).
def avgpool_numpy(x, k, s, pad_bottom=0, pad_right=0):
    n, c, h, w = x.shape
    oh, ow = (h + pad_bottom - k[0]) // s[0] + 1, (w + pad_right - k[1]) // s[1] + 1
    out = np.zeros((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            window = x[:, :, i * s[0]:min(h, i * s[0] + k[0]), j * s[1]:min(w, j * s[1] + k[1])]
            out[:, :, i, j] = window.mean(axis=(2, 3))
    return out


def avgpool():
    b = NeuralNetworkBuilder([("image", datatypes.Array(2, 7, 7))], [("probs", datatypes.Array(3))])
    k, c = f32(3, 3, 2, 3), f32(3)
    b.add_convolution("conv", 2, 3, 3, 3, 1, 1, "valid", 1, k, c, True, input_name="image", output_name="conv")
    b.add_pooling("pool", 2, 2, 2, 2, "AVERAGE", "SAME", "conv", "pool")
    b.add_pooling("pool2", 2, 2, 1, 1, "AVERAGE", "VALID", "pool", "pool2")
    b.add_flatten("flat", 0, "pool2", "flat")
    wf, bf = f32(3, 3 * 2 * 2), f32(3)
    b.add_inner_product("fc", wf, bf, 12, 3, True, "flat", "fc")
    b.add_softmax("probs", "fc", "probs")
    quiet(b.make_updatable, ["conv", "fc"])
    quiet(b.set_categorical_cross_entropy_loss, "loss", input="probs")
    b.set_sgd_optimizer(SgdParams(lr=0.01, batch=2))
    b.set_epochs(1)
    w = k.transpose(3, 2, 0, 1)
    image = f32(BATCH, 2, 7, 7)
    h = conv_numpy(image, w, c, (1, 1), 0, 0, 0, 0)                 # 5x5
    h = avgpool_numpy(h, (2, 2), (2, 2), pad_bottom=1, pad_right=1)  # same: 3x3, the last row and column average fewer
    h = avgpool_numpy(h, (2, 2), (1, 1))                             # 2x2
    y = softmax(h.reshape(BATCH, -1) @ wf.T + bf)
    save("avgpool", b, {"conv.weight": w, "conv.bias": c, "fc.weight": wf, "fc.bias": bf}, {"image": image}, y,
         {"loss": "crossEntropy", "optimizer": "sgd", "learningRate": 0.01, "batchSize": 2, "momentum": 0.0, "epochs": 1,
          "updatable": ["conv", "fc"], "frozen": [], "output": "probs"})


# 11. Exact mapping with a rank-3 input (Core ML reads it as a sequence of vectors), to check the refusal names it.
def exact_rank3():
    b = NeuralNetworkBuilder([("x", datatypes.Array(2, 3, 4))], [("y", datatypes.Array(2, 3, 5))],
                             disable_rank5_shape_mapping=True)
    b.add_inner_product("fc", f32(5, 4), None, 4, 5, False, "x", "y")
    coremltools.models.utils.save_spec(b.spec, os.path.join(OUT, "refused_exact_rank3.mlmodel"))


os.makedirs(OUT, exist_ok=True)
mse_sgd()
ce_adam()
conv()
classifier()
conv_1to4()
exact_mse_sgd()
exact_classifier()
exact_conv()
avgpool()
unsupported()
exact_rank3()
print(json.dumps(manifest, sort_keys=True))
