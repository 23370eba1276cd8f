#!/usr/bin/env python3
"""Writes the subset of Apple's Core ML protobuf schema that OrchardCoreML uses.

The field numbers, names and enum values come from the descriptors compiled into coremltools
(`coremltools.proto.*_pb2`), so they are Apple's own. Only the messages and fields listed in KEEP are written;
everything else in a file stays readable as unknown fields (swift-protobuf keeps them) and is rejected by name
by the importer, using the case tables this script also writes.

Usage (from the repository root):
    python3 Tools/coreml-proto/generate_subset.py
    protoc --plugin=protoc-gen-swift=<path to protoc-gen-swift> \
        --swift_out=Sources/OrchardCoreML/Generated --swift_opt=Visibility=Internal \
        -I Tools/coreml-proto Tools/coreml-proto/CoreMLSubset.proto
"""

import os
import sys

from coremltools.proto import (  # noqa: F401  (importing registers every descriptor)
    DataStructures_pb2,
    FeatureTypes_pb2,
    Model_pb2,
    NeuralNetwork_pb2,
    Parameters_pb2,
)
from google.protobuf import descriptor_pool

PACKAGE = "CoreML.Specification"
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
PROTO_OUT = os.path.join(HERE, "CoreMLSubset.proto")
TABLES_OUT = os.path.join(ROOT, "Sources", "OrchardCoreML", "Generated", "CoreMLCaseNames.swift")

# Top-level message -> the fields kept ("*" keeps all of them). Nested types are written inside their parent.
KEEP = {
    "Model": ["specificationVersion", "description", "isUpdatable",
              "neuralNetworkRegressor", "neuralNetworkClassifier", "neuralNetwork"],
    "ModelDescription": ["input", "output", "predictedFeatureName", "predictedProbabilitiesName",
                         "trainingInput", "metadata"],
    "FeatureDescription": "*",
    "Metadata": "*",
    "FeatureType": ["int64Type", "doubleType", "stringType", "multiArrayType", "dictionaryType", "isOptional"],
    "Int64FeatureType": "*",
    "DoubleFeatureType": "*",
    "StringFeatureType": "*",
    "ArrayFeatureType": ["shape", "dataType"],
    "DictionaryFeatureType": "*",
    "StringVector": "*",
    "Int64Vector": "*",
    "NeuralNetwork": ["layers", "arrayInputShapeMapping", "updateParams"],
    "NeuralNetworkClassifier": ["layers", "arrayInputShapeMapping", "updateParams",
                                "stringClassLabels", "int64ClassLabels", "labelProbabilityLayerName"],
    "NeuralNetworkRegressor": ["layers", "arrayInputShapeMapping", "updateParams"],
    "NeuralNetworkLayer": ["name", "input", "output", "isUpdatable",
                           "convolution", "pooling", "activation", "innerProduct", "embedding",
                           "softmax", "flatten", "concat"],
    "WeightParams": ["floatValue", "float16Value", "rawValue", "int8RawValue", "isUpdatable"],
    "InnerProductLayerParams": ["inputChannels", "outputChannels", "hasBias", "weights", "bias"],
    "EmbeddingLayerParams": "*",
    "ActivationParams": ["linear", "ReLU", "tanh", "sigmoid"],
    "ActivationLinear": "*",
    "ActivationReLU": "*",
    "ActivationTanh": "*",
    "ActivationSigmoid": "*",
    "ConcatLayerParams": "*",
    "FlattenLayerParams": "*",
    "SoftmaxLayerParams": "*",
    "ConvolutionLayerParams": "*",
    "ValidPadding": "*",
    "SamePadding": "*",
    "BorderAmounts": "*",
    "PoolingLayerParams": "*",
    "NetworkUpdateParameters": "*",
    "LossLayer": "*",
    "CategoricalCrossEntropyLossLayer": "*",
    "MeanSquaredErrorLossLayer": "*",
    "Optimizer": "*",
    "SGDOptimizer": "*",
    "AdamOptimizer": "*",
    "Int64Parameter": "*",
    "DoubleParameter": "*",
    "BoolParameter": "*",
    "Int64Range": "*",
    "Int64Set": "*",
    "DoubleRange": "*",
}

# Enums referenced at top level.
KEEP_ENUMS = ["NeuralNetworkMultiArrayShapeMapping"]

# Oneofs whose every case gets a name in the Swift table, so a dropped case can be reported by name.
CASE_TABLES = [
    ("modelTypes", "Model", "Type"),
    ("featureTypes", "FeatureType", "Type"),
    ("layerTypes", "NeuralNetworkLayer", "layer"),
    ("activationTypes", "ActivationParams", "NonlinearityType"),
    ("lossTypes", "LossLayer", "LossLayerType"),
    ("optimizerTypes", "Optimizer", "OptimizerType"),
]

SCALARS = {
    1: "double", 2: "float", 3: "int64", 4: "uint64", 5: "int32", 8: "bool", 9: "string", 12: "bytes",
    13: "uint32", 15: "sfixed32", 16: "sfixed64", 17: "sint32", 18: "sint64", 6: "fixed64", 7: "fixed32",
}

pool = descriptor_pool.Default()


def message(name):
    return pool.FindMessageTypeByName(PACKAGE + "." + name)


def is_repeated(field):
    if hasattr(field, "is_repeated"):
        return field.is_repeated
    return field.label == field.LABEL_REPEATED


def type_name(field, scope):
    if field.message_type is not None:
        full = field.message_type.full_name
    elif field.enum_type is not None:
        full = field.enum_type.full_name
    else:
        return SCALARS[field.type]
    relative = full[len(PACKAGE) + 1:]
    if relative.startswith(scope + "."):
        return relative[len(scope) + 1:]
    return relative


def check_reachable(desc, kept_fields):
    for field in kept_fields:
        target = field.message_type
        if target is None or target.GetOptions().map_entry:
            continue
        top = target.full_name[len(PACKAGE) + 1:].split(".")[0]
        if top not in KEEP:
            sys.exit(f"{desc.full_name}.{field.name} needs {target.full_name}, which is not in KEEP")


def write_enum(enum, indent, out):
    out.append(f"{indent}enum {enum.name} {{")
    for value in enum.values:
        out.append(f"{indent}    {value.name} = {value.number};")
    out.append(f"{indent}}}")


def write_message(desc, fields, indent, out):
    scope = desc.full_name[len(PACKAGE) + 1:]
    out.append(f"{indent}message {desc.name} {{")
    for nested in desc.nested_types:
        if nested.GetOptions().map_entry:
            continue
        if any(f.message_type is not None and f.message_type.full_name == nested.full_name for f in fields):
            write_message(nested, list(nested.fields), indent + "    ", out)
    for enum in desc.enum_types:
        if any(f.enum_type is not None and f.enum_type.full_name == enum.full_name for f in fields):
            write_enum(enum, indent + "    ", out)
    written_oneofs = set()
    for field in sorted(fields, key=lambda f: f.number):
        oneof = field.containing_oneof
        if oneof is not None and not oneof.name.startswith("_"):
            if oneof.name in written_oneofs:
                continue
            written_oneofs.add(oneof.name)
            out.append(f"{indent}    oneof {oneof.name} {{")
            for member in sorted((f for f in fields if f.containing_oneof is oneof), key=lambda f: f.number):
                out.append(f"{indent}        {type_name(member, scope)} {member.name} = {member.number};")
            out.append(f"{indent}    }}")
            continue
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            key = field.message_type.fields_by_name["key"]
            value = field.message_type.fields_by_name["value"]
            out.append(f"{indent}    map<{type_name(key, scope)}, {type_name(value, scope)}> {field.name} = {field.number};")
            continue
        label = "repeated " if is_repeated(field) else ""
        out.append(f"{indent}    {label}{type_name(field, scope)} {field.name} = {field.number};")
    out.append(f"{indent}}}")


def main():
    out = [
        "// A subset of Apple's Core ML model format (Model.proto, FeatureTypes.proto, DataStructures.proto,",
        "// NeuralNetwork.proto, Parameters.proto), with Apple's package, names and field numbers.",
        "// Generated by Tools/coreml-proto/generate_subset.py from the descriptors in coremltools; do not edit.",
        "",
        'syntax = "proto3";',
        "option optimize_for = LITE_RUNTIME;",
        "",
        f"package {PACKAGE};",
        "",
    ]
    for enum_name in KEEP_ENUMS:
        write_enum(pool.FindEnumTypeByName(PACKAGE + "." + enum_name), "", out)
        out.append("")
    for name in sorted(KEEP):
        desc = message(name)
        wanted = KEEP[name]
        if wanted == "*":
            fields = list(desc.fields)
        else:
            missing = [w for w in wanted if w not in desc.fields_by_name]
            if missing:
                sys.exit(f"{name} has no field(s) {missing}")
            fields = [desc.fields_by_name[w] for w in wanted]
        check_reachable(desc, fields)
        write_message(desc, fields, "", out)
        out.append("")
    with open(PROTO_OUT, "w") as f:
        f.write("\n".join(out))

    swift = [
        "// Generated by Tools/coreml-proto/generate_subset.py from the descriptors in coremltools; do not edit.",
        "",
        "/// The name of every case of the Core ML oneofs the importer inspects, by field number, including the",
        "/// cases the schema subset leaves out, so that an unsupported case is reported by its Core ML name.",
        "enum CoreMLCaseNames {",
    ]
    for table, message_name, oneof_name in CASE_TABLES:
        oneof = message(message_name).oneofs_by_name[oneof_name]
        swift.append(f"    /// `{message_name}.{oneof_name}` cases.")
        swift.append(f"    static let {table}: [Int: String] = [")
        for field in sorted(oneof.fields, key=lambda f: f.number):
            swift.append(f'        {field.number}: "{field.name}",')
        swift.append("    ]")
    swift.append("}")
    os.makedirs(os.path.dirname(TABLES_OUT), exist_ok=True)
    with open(TABLES_OUT, "w") as f:
        f.write("\n".join(swift) + "\n")
    print(f"wrote {os.path.relpath(PROTO_OUT, ROOT)} and {os.path.relpath(TABLES_OUT, ROOT)}")


if __name__ == "__main__":
    main()
