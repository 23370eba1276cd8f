#!/usr/bin/env python3
"""Loads a .mlmodel with coremltools and prints, as JSON, what Apple's own schema reads from it.

Used by Orchard's export tests: the file must load as an `MLModel` (on Linux coremltools loads and validates the
spec but cannot predict), and every layer, weight, flag and update parameter is reported as coremltools sees it.

Usage: describe_mlmodel.py MODEL.mlmodel
"""

import json
import sys

try:
    import coremltools
    from coremltools.models.neural_network import NeuralNetworkBuilder
except ImportError as error:  # pragma: no cover - reported to the Swift test
    sys.stderr.write(f"missing Python package: {error}. Install with: python3 -m pip install coremltools numpy safetensors\n")
    sys.exit(3)

path = sys.argv[1]
model = coremltools.models.MLModel(path)
spec = model.get_spec()
kind = spec.WhichOneof("Type")
nn = getattr(spec, kind)
# The builder re-reads the spec the way coremltools' own tooling does; it raises on a malformed network.
builder = NeuralNetworkBuilder(spec=spec)


def feature(f):
    which = f.type.WhichOneof("Type")
    entry = {"name": f.name, "type": which}
    if which == "multiArrayType":
        entry["shape"] = list(f.type.multiArrayType.shape)
        entry["dataType"] = coremltools.proto.FeatureTypes_pb2.ArrayFeatureType.ArrayDataType.Name(f.type.multiArrayType.dataType)
    return entry


def weights(params):
    return {"values": [float(v) for v in params.floatValue], "isUpdatable": params.isUpdatable,
            "float16Bytes": len(params.float16Value)}


layers = []
for layer in nn.layers:
    which = layer.WhichOneof("layer")
    entry = {"name": layer.name, "type": which, "input": list(layer.input), "output": list(layer.output),
             "isUpdatable": layer.isUpdatable}
    params = getattr(layer, which)
    if which == "innerProduct":
        entry.update(inputChannels=params.inputChannels, outputChannels=params.outputChannels, hasBias=params.hasBias,
                     weights=weights(params.weights))
        if params.hasBias:
            entry["bias"] = weights(params.bias)
    elif which == "embedding":
        entry.update(inputDim=params.inputDim, outputChannels=params.outputChannels, hasBias=params.hasBias,
                     weights=weights(params.weights))
    elif which == "convolution":
        entry.update(outputChannels=params.outputChannels, kernelChannels=params.kernelChannels, nGroups=params.nGroups,
                     kernelSize=list(params.kernelSize), stride=list(params.stride),
                     dilationFactor=list(params.dilationFactor), hasBias=params.hasBias,
                     padding=params.WhichOneof("ConvolutionPaddingType"), weights=weights(params.weights))
        if params.HasField("valid"):
            entry["paddingAmounts"] = [[b.startEdgeSize, b.endEdgeSize] for b in params.valid.paddingAmounts.borderAmounts]
        if params.HasField("same"):
            entry["asymmetryMode"] = params.same.asymmetryMode
        if params.hasBias:
            entry["bias"] = weights(params.bias)
    elif which == "pooling":
        entry.update(poolingType=params.type, kernelSize=list(params.kernelSize), stride=list(params.stride),
                     padding=params.WhichOneof("PoolingPaddingType"), globalPooling=params.globalPooling)
        if params.HasField("valid"):
            entry["paddingAmounts"] = [[b.startEdgeSize, b.endEdgeSize] for b in params.valid.paddingAmounts.borderAmounts]
    elif which == "activation":
        entry["activation"] = params.WhichOneof("NonlinearityType")
    elif which == "flatten":
        entry["mode"] = params.mode
    layers.append(entry)


def double(p):
    return {"default": p.defaultValue, "range": [p.range.minValue, p.range.maxValue] if p.HasField("range") else None}


def integer(p):
    which = p.WhichOneof("AllowedValues")
    return {"default": p.defaultValue, "set": list(p.set.values) if which == "set" else None,
            "range": [p.range.minValue, p.range.maxValue] if which == "range" else None}


update = None
if nn.HasField("updateParams"):
    u = nn.updateParams
    losses = []
    for loss in u.lossLayers:
        which = loss.WhichOneof("LossLayerType")
        inner = getattr(loss, which)
        losses.append({"name": loss.name, "type": which, "input": inner.input, "target": inner.target})
    optimizer_kind = u.optimizer.WhichOneof("OptimizerType")
    o = getattr(u.optimizer, optimizer_kind)
    optimizer = {"type": optimizer_kind, "learningRate": double(o.learningRate), "miniBatchSize": integer(o.miniBatchSize)}
    if optimizer_kind == "sgdOptimizer":
        optimizer["momentum"] = double(o.momentum)
    else:
        optimizer.update(beta1=double(o.beta1), beta2=double(o.beta2), eps=double(o.eps))
    update = {"lossLayers": losses, "optimizer": optimizer, "epochs": integer(u.epochs),
              "shuffle": u.shuffle.defaultValue if u.HasField("shuffle") else None}

print(json.dumps({
    "specificationVersion": spec.specificationVersion,
    "isUpdatable": spec.isUpdatable,
    "type": kind,
    "arrayInputShapeMapping": nn.arrayInputShapeMapping,
    "inputs": [feature(f) for f in spec.description.input],
    "outputs": [feature(f) for f in spec.description.output],
    "trainingInputs": [feature(f) for f in spec.description.trainingInput],
    "metadata": {"shortDescription": spec.description.metadata.shortDescription,
                 "userDefined": dict(spec.description.metadata.userDefined)},
    "layers": layers,
    "updateParams": update,
}, sort_keys=True))
