import Foundation
import OrchardSupport
import Logging
import OrchardClient
import OrchardFormats
import OrchardML
import OrchardPrivacy
import OrchardProtocol
import OrchardScheduler
import Synchronization

/// The first error recorded by concurrent work.
final class FirstError<E: Error & Sendable>: Sendable {
    private let first = Mutex<E?>(nil)

    var value: E? { first.withLock { $0 } }

    func record(_ error: E) { first.withLock { $0 = $0 ?? error } }
}
