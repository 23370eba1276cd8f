import Foundation
public import OrchardProtocol
import OrchardFormats

/// One HTTP request and its response, as a test client saw them.
public struct HTTPExchange: Sendable {
    /// The method, e.g. `POST`.
    public var method: String
    /// The path and query as sent, e.g. `/v1/device/models/p_1.0?request_key=ab`.
    public var target: String
    /// The request's header fields.
    public var requestHeaders: [String: String]
    /// The request body, if any.
    public var requestBody: [UInt8]?
    /// The response status.
    public var status: Int
    /// The response's header fields.
    public var responseHeaders: [String: String]
    /// The response body.
    public var responseBody: [UInt8]

    /// Creates an exchange.
    public init(
        method: String, target: String, requestHeaders: [String: String], requestBody: [UInt8]?, status: Int, responseHeaders: [String: String],
        responseBody: [UInt8]
    ) {
        self.method = method
        self.target = target
        self.requestHeaders = requestHeaders
        self.requestBody = requestBody
        self.status = status
        self.responseHeaders = responseHeaders
        self.responseBody = responseBody
    }

    /// The path without the query.
    public var path: String { String(target.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false)[0]) }

    /// The query parameters (percent-decoded; a repeated name keeps its first value).
    public var query: [String: String] {
        guard let components = URLComponents(string: "http://h" + target), let items = components.queryItems else { return [:] }
        var out: [String: String] = [:]
        for item in items where out[item.name] == nil { out[item.name] = item.value ?? "" }
        return out
    }
}

/// A documented operation: its method and path template (e.g. `GET /v1/device/plans/{plan_id}`).
public struct OpenAPIOperation: Sendable, Hashable, Comparable, CustomStringConvertible {
    /// The method, uppercase.
    public var method: String
    /// The path template.
    public var template: String

    /// Creates an operation key.
    public init(method: String, template: String) {
        self.method = method.uppercased()
        self.template = template
    }

    public var description: String { "\(method) \(template)" }
    public static func < (a: Self, b: Self) -> Bool { (a.template, a.method) < (b.template, b.method) }
}

/// Checks HTTP exchanges against an OpenAPI 3.0 document: every response's status is documented for its
/// operation, its body matches the documented schema (and its error code is one the response lists in
/// `x-error-codes`), its documented headers match their schemas; and every request the server accepted (2xx) has
/// the documented parameters and a body that matches the documented schema — a 2xx for a request the document
/// says is invalid means the document states a constraint the server does not enforce.
public struct OpenAPIConformance: Sendable {
    /// The document.
    public let document: JSONValue
    /// The schema validator over the document.
    public let validator: JSONSchemaValidator
    private static let methods = ["get", "put", "post", "delete", "patch", "head", "options"]

    /// Parses the document.
    public init(document bytes: [UInt8]) throws {
        document = try JSONValue.parse(bytes)
        validator = JSONSchemaValidator(root: document)
    }

    /// Every documented operation.
    public var operations: [OpenAPIOperation] {
        var out: [OpenAPIOperation] = []
        for (template, item) in document["paths"]?.objectValue ?? [:] {
            for method in Self.methods where item[method] != nil { out.append(OpenAPIOperation(method: method, template: template)) }
        }
        return out.sorted()
    }

    /// The documented statuses of an operation's responses.
    public func statuses(of operation: OpenAPIOperation) -> [String] {
        (document["paths"]?[operation.template]?[operation.method.lowercased()]?["responses"]?.objectValue ?? [:]).keys.sorted()
    }

    /// The operation a request names, with the values of its path parameters.
    public func match(method: String, path: String) -> (operation: OpenAPIOperation, parameters: [String: String])? {
        let segments = path.split(separator: "/", omittingEmptySubsequences: false).map(String.init)
        for (template, item) in document["paths"]?.objectValue ?? [:] where item[method.lowercased()] != nil {
            let parts = template.split(separator: "/", omittingEmptySubsequences: false).map(String.init)
            guard parts.count == segments.count else { continue }
            var parameters: [String: String] = [:]
            var matched = true
            for (part, segment) in zip(parts, segments) {
                if part.hasPrefix("{") && part.hasSuffix("}") {
                    guard !segment.isEmpty else { matched = false; break }
                    parameters[String(part.dropFirst().dropLast())] = segment.removingPercentEncoding ?? segment
                } else if part != segment {
                    matched = false
                    break
                }
            }
            if matched { return (OpenAPIOperation(method: method, template: template), parameters) }
        }
        return nil
    }

    /// Follows a `$ref` (repeatedly) to the object it names.
    public func dereference(_ value: JSONValue) -> JSONValue {
        var current = value
        var hops = 0
        while let reference = current["$ref"]?.stringValue, let target = validator.resolve(reference), hops < 16 {
            current = target
            hops += 1
        }
        return current
    }

    /// Everything about `exchange` that the document does not allow (empty when it conforms).
    public func problems(with exchange: HTTPExchange) -> [String] {
        let label = "\(exchange.method) \(exchange.target) → \(exchange.status)"
        guard let matched = match(method: exchange.method, path: exchange.path) else {
            // No route: the router's 404 not_found (or 405) is the only answer.
            let code = (try? JSONValue.parse(exchange.responseBody))?["error"]?["code"]?.stringValue
            if (exchange.status == 404 && code == "not_found") || (exchange.status == 405 && code == "method_not_allowed") { return [] }
            return ["\(label): not a documented operation"]
        }
        let (operation, pathParameters) = matched
        let pathItem = document["paths"]![operation.template]!
        let definition = pathItem[operation.method.lowercased()]!
        var problems: [String] = []
        guard let documented = definition["responses"]?[String(exchange.status)] else {
            return ["\(label): status \(exchange.status) is not documented for \(operation) (documented: \(statuses(of: operation).joined(separator: ", ")))"]
        }
        let response = dereference(documented)
        problems += responseProblems(exchange, response, label: label)
        if (200..<300).contains(exchange.status) {
            problems += requestProblems(exchange, pathItem: pathItem, operation: definition, pathParameters: pathParameters, label: label)
        }
        return problems
    }

    private func header(_ name: String, in fields: [String: String]) -> String? {
        fields.first { $0.key.lowercased() == name.lowercased() }?.value
    }

    private func responseProblems(_ exchange: HTTPExchange, _ response: JSONValue, label: String) -> [String] {
        var problems: [String] = []
        let content = response["content"]?.objectValue ?? [:]
        if content.isEmpty {
            if !exchange.responseBody.isEmpty { problems.append("\(label): the response has a body but none is documented") }
        } else {
            let mediaType = header("Content-Type", in: exchange.responseHeaders)?.split(separator: ";").first.map {
                $0.trimmingCharacters(in: .whitespaces).lowercased()
            }
            guard let mediaType, let entry = content[mediaType] else {
                return problems + ["\(label): Content-Type \(mediaType ?? "(none)") is not one of \(content.keys.sorted().joined(separator: ", "))"]
            }
            if mediaType.hasSuffix("json"), let schema = entry["schema"] {
                guard let body = try? JSONValue.parse(exchange.responseBody) else {
                    return problems + ["\(label): the response body is not JSON"]
                }
                problems += validator.validate(body, against: schema).map { "\(label): response \($0)" }
                if case .array(let codes)? = response["x-error-codes"], let code = body["error"]?["code"], !codes.contains(code) {
                    problems.append(
                        "\(label): error code \(code.stringValue ?? "?") is not among this response's x-error-codes \(codes.compactMap(\.stringValue))")
                }
            }
        }
        for (name, definition) in response["headers"]?.objectValue ?? [:] {
            guard let value = header(name, in: exchange.responseHeaders), let schema = dereference(definition)["schema"] else { continue }
            problems += validator.validate(.string(value), against: schema, at: "header \(name)").map { "\(label): \($0)" }
        }
        return problems
    }

    private func requestProblems(_ exchange: HTTPExchange, pathItem: JSONValue, operation: JSONValue, pathParameters: [String: String], label: String)
        -> [String]
    {
        var problems: [String] = []
        var declared: [JSONValue] = []
        if case .array(let shared)? = pathItem["parameters"] { declared += shared }
        if case .array(let own)? = operation["parameters"] { declared += own }
        let query = exchange.query
        for parameter in declared.map(dereference) {
            guard let name = parameter["name"]?.stringValue, let location = parameter["in"]?.stringValue else { continue }
            let value: String? =
                switch location {
                case "path": pathParameters[name]
                case "query": query[name]
                case "header": header(name, in: exchange.requestHeaders)
                default: nil
                }
            guard let value else {
                if parameter["required"] == .bool(true) { problems.append("\(label): accepted without the required \(location) parameter '\(name)'") }
                continue
            }
            guard let schema = parameter["schema"] else { continue }
            let resolved = dereference(schema)
            let instance: JSONValue
            if ["integer", "number"].contains(resolved["type"]?.stringValue ?? "") {
                guard let number = Double(value) else {
                    problems.append("\(label): accepted \(location) parameter '\(name)' = '\(value)', which is not a number")
                    continue
                }
                instance = .number(number)
            } else {
                instance = .string(value)
            }
            problems += validator.validate(instance, against: schema, at: "\(location) parameter \(name)").map { "\(label): accepted a request whose \($0)" }
        }
        guard let body = operation["requestBody"].map(dereference) else { return problems }
        let bytes = exchange.requestBody ?? []
        if body["required"] == .bool(true) && bytes.isEmpty && operation["requestBody"]?["content"]?["application/octet-stream"] == nil {
            problems.append("\(label): accepted without the required body")
        }
        let contentType = exchange.requestHeaders.first { $0.key.lowercased() == "content-type" }?.value
            .split(separator: ";").first.map { $0.trimmingCharacters(in: .whitespaces).lowercased() }
        if let contentType, body["content"]?.objectValue?.isEmpty == false, body["content"]?[contentType] == nil {
            problems.append("\(label): accepted a body of type \(contentType), which the document does not list for it")
        }
        if contentType == MediaType.safetensors, exchange.target.hasPrefix(Endpoint.secureAggregation) {
            // A masked input as safetensors: the document's description of the envelope, checked by decoding it.
            do {
                _ = try MaskedInputEnvelope.decode(bytes)
            } catch {
                problems.append("\(label): accepted a masked-input body that is not a MaskedInputEnvelope: \(error)")
            }
        } else if let schema = body["content"]?["application/json"]?["schema"] {
            guard let json = try? JSONValue.parse(bytes) else {
                return problems + ["\(label): accepted a request body that is not JSON"]
            }
            problems += validator.validate(json, against: schema).map { "\(label): accepted a request whose body \($0)" }
        }
        if let metadataSchema = operation["x-report-metadata"] {
            // A report: its safetensors metadata carries the JSON the extension names.
            do {
                let index = try Safetensors.index(bytes)
                let json = try JSONValue.parse(Array((index.metadata[ReportEnvelope.metadataKey] ?? "").utf8))
                problems += validator.validate(json, against: metadataSchema).map { "\(label): accepted report metadata \($0)" }
            } catch {
                problems.append("\(label): accepted a report whose metadata cannot be read: \(error)")
            }
        }
        return problems
    }

    /// Problems of the document itself: `$ref`s that do not resolve, schema keywords ``JSONSchemaValidator`` does not
    /// understand, path templates whose parameters are not declared (or declared parameters not in the template),
    /// operations without a success response, and error responses (4xx/5xx) without `x-error-codes`, with a code
    /// the `ErrorCode` schema does not list, or with a code `status(code)` sends with another status.
    public func documentProblems(status: (String) -> Int) -> [String] {
        var problems: [String] = []
        func walk(_ value: JSONValue, _ path: String) {
            switch value {
            case .object(let members):
                if let reference = members["$ref"]?.stringValue, validator.resolve(reference) == nil {
                    problems.append("\(path): $ref \(reference) does not resolve")
                }
                for (key, child) in members { walk(child, "\(path)/\(key)") }
            case .array(let items):
                for (index, child) in items.enumerated() { walk(child, "\(path)/\(index)") }
            default:
                break
            }
        }
        walk(document, "#")

        var schemas: [(String, JSONValue)] = (document["components"]?["schemas"]?.objectValue ?? [:]).map { ("#/components/schemas/\($0.key)", $0.value) }
        let knownCodes = Set(
            (document["components"]?["schemas"]?["ErrorCode"]?["enum"]).flatMap { value -> [String]? in
                if case .array(let codes) = value { return codes.compactMap(\.stringValue) }
                return nil
            } ?? [])
        if knownCodes.isEmpty { problems.append("#/components/schemas/ErrorCode lists no codes") }
        for (template, item) in document["paths"]?.objectValue ?? [:] {
            let names = Set(template.split(separator: "/").filter { $0.hasPrefix("{") }.map { String($0.dropFirst().dropLast()) })
            var shared: [JSONValue] = []
            if case .array(let list)? = item["parameters"] { shared = list }
            for method in Self.methods {
                guard let operation = item[method] else { continue }
                let label = "\(method.uppercased()) \(template)"
                var parameters = shared
                if case .array(let list)? = operation["parameters"] { parameters += list }
                let pathNames = Set(parameters.map(dereference).filter { $0["in"]?.stringValue == "path" }.compactMap { $0["name"]?.stringValue })
                if pathNames != names { problems.append("\(label): path parameters \(pathNames.sorted()) differ from the template's \(names.sorted())") }
                for (index, parameter) in parameters.map(dereference).enumerated() {
                    if let schema = parameter["schema"] { schemas.append(("\(label) parameter \(index)", schema)) }
                }
                for (media, entry) in operation["requestBody"].map(dereference)?["content"]?.objectValue ?? [:] {
                    if let schema = entry["schema"] { schemas.append(("\(label) request \(media)", schema)) }
                }
                let responses = operation["responses"]?.objectValue ?? [:]
                if !responses.keys.contains(where: { $0.hasPrefix("2") || $0.hasPrefix("3") }) { problems.append("\(label): no success response") }
                for (code, value) in responses {
                    let response = dereference(value)
                    for (media, entry) in response["content"]?.objectValue ?? [:] {
                        if let schema = entry["schema"] { schemas.append(("\(label) \(code) \(media)", schema)) }
                    }
                    for (name, header) in response["headers"]?.objectValue ?? [:] {
                        if let schema = dereference(header)["schema"] { schemas.append(("\(label) \(code) header \(name)", schema)) }
                    }
                    guard let number = Int(code), number >= 400 else { continue }
                    guard case .array(let listed)? = response["x-error-codes"], !listed.isEmpty else {
                        problems.append("\(label) \(code): an error response without x-error-codes")
                        continue
                    }
                    if response["content"]?["application/json"]?["schema"]?["$ref"]?.stringValue != "#/components/schemas/ErrorBody" {
                        problems.append("\(label) \(code): an error response whose body is not ErrorBody")
                    }
                    for wire in listed.compactMap(\.stringValue) {
                        if !knownCodes.contains(wire) { problems.append("\(label) \(code): x-error-codes lists '\(wire)', which ErrorCode does not") }
                        if status(wire) != number { problems.append("\(label) \(code): '\(wire)' is sent with status \(status(wire))") }
                    }
                }
            }
        }
        for (label, schema) in schemas {
            problems += JSONSchemaValidator.unsupportedKeywords(in: schema, at: label).map { "unsupported schema keyword at \($0)" }
        }
        return problems.sorted()
    }
}
