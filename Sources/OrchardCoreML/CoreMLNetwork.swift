import Foundation
import SwiftProtobuf

typealias ProtoModel = CoreML_Specification_Model
typealias ProtoLayer = CoreML_Specification_NeuralNetworkLayer
typealias ProtoFeature = CoreML_Specification_FeatureDescription
typealias ProtoUpdateParameters = CoreML_Specification_NetworkUpdateParameters
typealias ProtoWeights = CoreML_Specification_WeightParams

/// The neural network inside a Core ML model, whichever of the three wrappers holds it.
struct CoreMLNetwork {
    /// `neuralNetwork`, `neuralNetworkClassifier` or `neuralNetworkRegressor`.
    var kind: String
    var layers: [ProtoLayer]
    var updateParams: ProtoUpdateParameters?
    var shapeMapping: CoreML_Specification_NeuralNetworkMultiArrayShapeMapping
    var classLabels: [String]
    var labelProbabilityLayerName: String

    /// Finds the neural network in `model`, or explains which model type the file holds instead.
    init(_ model: ProtoModel) throws(CoreMLError) {
        switch model.type {
        case .neuralNetwork(let nn):
            self.init(
                kind: "neuralNetwork", layers: nn.layers, update: nn.hasUpdateParams ? nn.updateParams : nil,
                mapping: nn.arrayInputShapeMapping)
        case .neuralNetworkRegressor(let nn):
            self.init(
                kind: "neuralNetworkRegressor", layers: nn.layers, update: nn.hasUpdateParams ? nn.updateParams : nil,
                mapping: nn.arrayInputShapeMapping)
        case .neuralNetworkClassifier(let nn):
            self.init(
                kind: "neuralNetworkClassifier", layers: nn.layers, update: nn.hasUpdateParams ? nn.updateParams : nil,
                mapping: nn.arrayInputShapeMapping)
            switch nn.classLabels {
            case .stringClassLabels(let labels): classLabels = labels.vector
            case .int64ClassLabels(let labels): classLabels = labels.vector.map(String.init)
            case nil: break
            }
            labelProbabilityLayerName = nn.labelProbabilityLayerName
        case nil:
            let name = UnknownFields.caseName(in: model.unknownFields, table: CoreMLCaseNames.modelTypes)
            throw CoreMLError(
                .unsupportedFeature,
                name.map { "the file holds a '\($0)' model; Orchard reads neural networks only" }
                    ?? "the file holds no model of a known type")
        }
    }

    private init(
        kind: String, layers: [ProtoLayer], update: ProtoUpdateParameters?,
        mapping: CoreML_Specification_NeuralNetworkMultiArrayShapeMapping
    ) {
        self.kind = kind
        self.layers = layers
        self.updateParams = update
        self.shapeMapping = mapping
        self.classLabels = []
        self.labelProbabilityLayerName = ""
    }
}

/// Decodes and encodes Core ML model bytes.
enum CoreMLCoding {
    /// Parses Core ML protobuf bytes.
    static func decode(_ bytes: [UInt8]) throws(CoreMLError) -> ProtoModel {
        do {
            return try ProtoModel(serializedBytes: bytes)
        } catch {
            throw CoreMLError(.malformedFile, "not a Core ML protobuf model: \(error)")
        }
    }

    /// Serializes a model with deterministic field and map ordering, so equal models give equal bytes.
    static func encode(_ model: ProtoModel) throws(CoreMLError) -> [UInt8] {
        var options = BinaryEncodingOptions()
        options.useDeterministicOrdering = true
        do {
            return try model.serializedBytes(options: options)
        } catch {
            throw CoreMLError(.invalidModel, "could not serialize the Core ML model: \(error)")
        }
    }
}

extension ProtoLayer {
    /// The Core ML name of the layer's type, e.g. `innerProduct` or `activation.ReLU`, including types the
    /// schema subset does not model.
    var typeName: String {
        switch layer {
        case .convolution(let p): p.isDeconvolution ? "convolution (deconvolution)" : "convolution"
        case .pooling(let p):
            switch p.type {
            case .max: "pooling.MAX"
            case .average: "pooling.AVERAGE"
            case .l2: "pooling.L2"
            case .UNRECOGNIZED(let value): "pooling.\(value)"
            }
        case .activation(let p):
            switch p.nonlinearityType {
            case .linear: "activation.linear"
            case .reLu: "activation.ReLU"
            case .tanh: "activation.tanh"
            case .sigmoid: "activation.sigmoid"
            case nil: "activation." + (UnknownFields.caseName(in: p.unknownFields, table: CoreMLCaseNames.activationTypes) ?? "unknown")
            }
        case .innerProduct: "innerProduct"
        case .embedding: "embedding"
        case .softmax: "softmax"
        case .flatten: "flatten"
        case .concat: "concat"
        case nil: UnknownFields.caseName(in: unknownFields, table: CoreMLCaseNames.layerTypes) ?? "unknown"
        }
    }

    /// Whether Core ML can back-propagate through this layer (its `isLayerSupportedForBackprop`).
    var supportsBackPropagation: Bool {
        switch layer {
        case .convolution, .innerProduct, .flatten, .pooling: return true
        case .activation(let p):
            switch p.nonlinearityType {
            case .reLu, .sigmoid, .tanh: return true
            default: return false
            }
        case nil:
            return UnknownFields.caseName(in: unknownFields, table: CoreMLCaseNames.layerTypes) == "batchnorm"
        default: return false
        }
    }

    /// The weight parameters of this layer, by role (`weight`, `bias`).
    var weightParams: [(role: String, params: ProtoWeights)] {
        switch layer {
        case .innerProduct(let p): [("weight", p.weights)] + (p.hasBias_p ? [("bias", p.bias)] : [])
        case .convolution(let p): [("weight", p.weights)] + (p.hasBias_p ? [("bias", p.bias)] : [])
        case .embedding(let p): [("weight", p.weights)] + (p.hasBias_p ? [("bias", p.bias)] : [])
        default: []
        }
    }
}

extension ProtoWeights {
    /// The weights as Float32 values, converting half precision; quantized and raw weights are errors.
    func floats(layer: String, role: String) throws(CoreMLError) -> [Float] {
        if !int8RawValue.isEmpty || !rawValue.isEmpty || unknownFields.data.count > 0 {
            throw CoreMLError(.unsupportedFeature, "the \(role) is quantized or raw; Orchard reads float32 and float16 weights", layer: layer)
        }
        if !float16Value.isEmpty {
            guard float16Value.count % 2 == 0 else {
                throw CoreMLError(.malformedFile, "the float16 \(role) has an odd number of bytes", layer: layer)
            }
            let bytes = [UInt8](float16Value)
            return stride(from: 0, to: bytes.count, by: 2).map { HalfFloat.float(bits: UInt16(bytes[$0]) | UInt16(bytes[$0 + 1]) << 8) }
        }
        return floatValue
    }

    /// Whether the values are stored as float32 (the only form Core ML updates).
    var isFloat32: Bool { float16Value.isEmpty && rawValue.isEmpty && int8RawValue.isEmpty && unknownFields.data.isEmpty }
}

/// IEEE 754 half precision to single precision, independent of platform `Float16` support.
enum HalfFloat {
    /// Converts the bits of a half-precision number to a `Float`.
    static func float(bits: UInt16) -> Float {
        let sign = UInt32(bits >> 15) << 31
        let exponent = Int((bits >> 10) & 0x1F)
        let mantissa = UInt32(bits & 0x3FF)
        switch exponent {
        case 0:
            // Zero or subnormal: mantissa × 2⁻²⁴.
            let magnitude = Float(mantissa) * Float(sign: .plus, exponent: -24, significand: 1)
            return sign == 0 ? magnitude : -magnitude
        case 0x1F:
            return Float(bitPattern: sign | 0x7F80_0000 | (mantissa << 13))
        default:
            return Float(bitPattern: sign | UInt32(exponent - 15 + 127) << 23 | (mantissa << 13))
        }
    }
}
