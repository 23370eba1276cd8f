import Foundation
public import OrchardSupport

/// An error of secure aggregation: a code and a message naming the offending device, stage or value.
public struct SecureAggregationError: OrchardError, Hashable {
    /// What went wrong.
    public struct Code: Sendable, Hashable, CustomStringConvertible {
        private enum Kind: String, ErrorCodeKind {
            case invalidConfiguration, invalidShare, invalidMessage, invalidInput, outOfOrder, unknownDevice, droppedDevice
            case duplicateMessage, duplicateKey, belowThreshold, inconsistentRequest, cryptographyFailure, reconstructionFailed
            case verificationFailed
        }
        private let kind: Kind
        private init(_ kind: Kind) { self.kind = kind }
        /// The configuration cannot work (threshold out of range, a modulus the sum could wrap, …).
        public static let invalidConfiguration = Code(.invalidConfiguration)
        /// A Shamir share or a set of shares is malformed (zero or duplicate index, wrong length, out-of-field value).
        public static let invalidShare = Code(.invalidShare)
        /// A protocol message is malformed or does not fit the receiver's state (wrong lengths, unexpected senders).
        public static let invalidMessage = Code(.invalidMessage)
        /// A device's own input is unusable (wrong model length, non-finite value, sample count out of range).
        public static let invalidInput = Code(.invalidInput)
        /// A message or call arrived in a stage that does not take it.
        public static let outOfOrder = Code(.outOfOrder)
        /// A message names a device that is not part of the cycle.
        public static let unknownDevice = Code(.unknownDevice)
        /// A message came from a device already declared dropped in this cycle.
        public static let droppedDevice = Code(.droppedDevice)
        /// A device sent the same stage's message twice.
        public static let duplicateMessage = Code(.duplicateMessage)
        /// Two devices advertised the same public key, or one device index appears twice.
        public static let duplicateKey = Code(.duplicateKey)
        /// Fewer devices than the threshold remain.
        public static let belowThreshold = Code(.belowThreshold)
        /// An unmask request contradicts the device's earlier answers (both shares of one peer would be revealed).
        public static let inconsistentRequest = Code(.inconsistentRequest)
        /// A key agreement, decryption or authentication failed (tampered or misaddressed ciphertext, bad key).
        public static let cryptographyFailure = Code(.cryptographyFailure)
        /// A secret could not be reconstructed from the shares given.
        public static let reconstructionFailed = Code(.reconstructionFailed)
        /// A certificate or signature of the actively-secure protocol does not verify (untrusted authority, expired,
        /// forged, too few consistency signatures), or a device holding a trust was offered the unprotected protocol.
        public static let verificationFailed = Code(.verificationFailed)
        public var description: String { kind.snakeCased }
    }

    /// The code.
    public var code: Code
    /// A message naming the offending item.
    public var message: String

    /// Creates an error.
    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }
}
