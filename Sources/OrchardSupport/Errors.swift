/// The shape every Orchard error shares: a machine-readable code and a message naming the offending item.
///
/// Conforming types get `description` as `code: message`; a type that carries more context (a line, a layer)
/// writes its own.
public protocol OrchardError: Error, Sendable, CustomStringConvertible {
    /// The category's type, rendered in snake case (e.g. `shape_mismatch`).
    associatedtype Code: CustomStringConvertible
    /// What went wrong, as a category.
    var code: Code { get }
    /// A human-readable explanation naming the offending item.
    var message: String { get }
}

extension OrchardError {
    /// `code: message`.
    public var description: String { "\(code): \(message)" }
}

/// The kinds behind an error code: a `String` raw value in lower camel case, rendered in snake case.
public protocol ErrorCodeKind: RawRepresentable, Sendable, Hashable where RawValue == String {}

extension ErrorCodeKind {
    /// The kind in snake case: `tooManyPendingRequests` → `too_many_pending_requests`.
    public var snakeCased: String { rawValue.snakeCased }
}

extension String {
    /// Lower camel case to snake case: `shapeMismatch` → `shape_mismatch` (an already snake-cased string is kept).
    public var snakeCased: String {
        reduce(into: "") { out, ch in
            if ch.isUppercase { out += "_" + ch.lowercased() } else { out.append(ch) }
        }
    }
}
