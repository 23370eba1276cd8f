import Foundation
import OrchardSupport
import OrchardProtocol
import Synchronization

/// The durable state of one job on one device, in a directory of its own: the session, a report waiting to be
/// uploaded, a checkpoint of interrupted local training, and the model download (partial or complete).
///
/// Whole files are written to a temporary name and renamed, so a crash leaves either the old or the new
/// version. The partial model grows by appends; its bytes are checked before use.
struct ClientStore: Sendable {
    /// The session a device holds with a coordinator.
    struct Identity: Codable, Sendable, Hashable {
        var workerID: String
        var sessionToken: String
        /// Seconds since 1970 when the session expires.
        var expiresAt: Double
        /// The server the session belongs to.
        var server: String
        /// Whether the process asks for link speeds with each cycle request; nil in sessions saved before the
        /// client knew (those are not reused: authenticating again tells).
        var requiresSpeedTest: Bool?
        /// The speed-test sizes the coordinator announced (protocol 2.1 and later), bytes down and up.
        var speedTestDownloadBytes: Int? = nil
        var speedTestUploadBytes: Int? = nil
    }

    /// What a saved training checkpoint belongs to.
    struct CheckpointKey: Codable, Sendable, Hashable {
        var requestKey: String
        var modelID: String
        var cycle: Int
    }

    /// What the model files hold.
    struct ModelInfo: Codable, Sendable, Hashable {
        var modelID: String
        var etag: String?
        var totalLength: Int?
        /// The SHA-256 of the whole file, as the coordinator announced it.
        var sha256: Data?
    }

    let directory: URL
    let durability: StorageDurability

    init(directory: URL, durability: StorageDurability = .synced) {
        self.directory = directory
        self.durability = durability
    }

    private var identityURL: URL { directory.appendingPathComponent("session.json") }
    private var pendingReportURL: URL { directory.appendingPathComponent("pending-report.safetensors") }
    private var checkpointURL: URL { directory.appendingPathComponent("training-checkpoint.bin") }
    var partialModelURL: URL { directory.appendingPathComponent("model.partial") }
    private var partialInfoURL: URL { directory.appendingPathComponent("model.partial.json") }
    private var modelURL: URL { directory.appendingPathComponent("model.safetensors") }
    private var modelInfoURL: URL { directory.appendingPathComponent("model.json") }

    /// Creates the directory if needed.
    func prepare() throws(OrchardClientError) {
        // Every background task calls this: one mkdir(2) when the directory is there, rather than one per path component.
        do throws(FileAccessError) { try LocalFile.createDirectory(directory.path) } catch {
            throw OrchardClientError(.storage, "cannot create the client directory \(directory.path): \(error.message)")
        }
    }

    // MARK: Files

    private func read(_ url: URL) throws(OrchardClientError) -> Data? {
        guard FileManager.default.fileExists(atPath: url.path) else { return nil }
        do {
            return try Data(contentsOf: url)
        } catch {
            throw OrchardClientError(.storage, "cannot read \(url.path): \(FileAccessError(error).message)")
        }
    }

    private func write(_ data: Data, to url: URL) throws(OrchardClientError) {
        // Always atomic (a reader sees the old file or the new one); forced to disk unless the state is cheap to lose.
        do throws(FileAccessError) { try LocalFile.replace(data, at: url.path, synced: durability == .synced) } catch {
            throw OrchardClientError(.storage, "cannot write \(url.path): \(error.message)")
        }
    }

    private func remove(_ url: URL) throws(OrchardClientError) {
        guard FileManager.default.fileExists(atPath: url.path) else { return }
        do {
            try FileManager.default.removeItem(at: url)
        } catch {
            throw OrchardClientError(.storage, "cannot delete \(url.path): \(FileAccessError(error, writing: true).message)")
        }
    }

    private func readJSON<T: Decodable>(_ type: T.Type, _ url: URL) throws(OrchardClientError) -> T? {
        guard let data = try read(url) else { return nil }
        do {
            return try JSONDecoder().decode(T.self, from: data)
        } catch {
            // A file this client wrote but cannot decode is stale state from another version: drop it.
            try remove(url)
            return nil
        }
    }

    private func writeJSON(_ value: some Encodable, _ url: URL) throws(OrchardClientError) {
        let data: Data
        do {
            data = try WireCoding.encoder().encode(value)
        } catch {
            throw OrchardClientError(.storage, "cannot encode \(url.lastPathComponent): \(error)")
        }
        try write(data, to: url)
    }

    // MARK: Session

    func identity() throws(OrchardClientError) -> Identity? { try readJSON(Identity.self, identityURL) }
    func saveIdentity(_ identity: Identity) throws(OrchardClientError) { try writeJSON(identity, identityURL) }
    func clearIdentity() throws(OrchardClientError) { try remove(identityURL) }

    // MARK: Pending report

    /// The report body waiting for upload, if any.
    func pendingReport() throws(OrchardClientError) -> [UInt8]? { try read(pendingReportURL).map { [UInt8]($0) } }
    /// The pending report's size in bytes; nil when there is none.
    func pendingReportSize() -> Int? { size(of: pendingReportURL) }
    func savePendingReport(_ body: [UInt8]) throws(OrchardClientError) { try write(Data(body), to: pendingReportURL) }
    func clearPendingReport() throws(OrchardClientError) { try remove(pendingReportURL) }

    // MARK: Training checkpoint

    private static let checkpointMagic: [UInt8] = Array("ORCHARD-CKPT1\n".utf8)

    /// The saved local-training checkpoint and what it belongs to.
    func checkpoint() throws(OrchardClientError) -> (key: CheckpointKey, state: [UInt8])? {
        guard let data = try read(checkpointURL) else { return nil }
        let bytes = [UInt8](data)
        let magic = Self.checkpointMagic
        guard bytes.count > magic.count + 4, Array(bytes[0..<magic.count]) == magic else {
            try remove(checkpointURL)
            return nil
        }
        var length = 0
        for i in 0..<4 { length |= Int(bytes[magic.count + i]) << (8 * i) }
        let headerStart = magic.count + 4
        guard headerStart + length <= bytes.count,
            let key = try? JSONDecoder().decode(CheckpointKey.self, from: Data(bytes[headerStart..<(headerStart + length)]))
        else {
            try remove(checkpointURL)
            return nil
        }
        return (key, Array(bytes[(headerStart + length)...]))
    }

    func saveCheckpoint(_ state: [UInt8], key: CheckpointKey) throws(OrchardClientError) {
        let header: Data
        do { header = try WireCoding.encoder().encode(key) } catch {
            throw OrchardClientError(.storage, "cannot encode the checkpoint key: \(error)")
        }
        var bytes = Self.checkpointMagic
        let length = header.count
        for i in 0..<4 { bytes.append(UInt8((length >> (8 * i)) & 0xFF)) }
        bytes += header
        bytes += state
        try write(Data(bytes), to: checkpointURL)
    }

    func clearCheckpoint() throws(OrchardClientError) { try remove(checkpointURL) }

    // MARK: Model

    /// The complete model and what the coordinator announced for it, if it is the one named.
    func model(_ modelID: String) throws(OrchardClientError) -> (bytes: [UInt8], info: ModelInfo)? {
        guard let info = try readJSON(ModelInfo.self, modelInfoURL), info.modelID == modelID,
            let data = try read(modelURL)
        else { return nil }
        return ([UInt8](data), info)
    }

    /// Keeps a verified model and drops the partial download. The verified bytes are the complete partial file's (the
    /// job read them from it), so that file becomes the model by a rename rather than a second write of every byte.
    func saveModel(_ bytes: [UInt8], info: ModelInfo) throws(OrchardClientError) {
        try remove(modelInfoURL)
        if let partial = try partialModel(info.modelID), partial.length == bytes.count {
            do throws(FileAccessError) {
                try LocalFile.promote(partialModelURL.path, to: modelURL.path, synced: durability == .synced)
            } catch {
                throw OrchardClientError(.storage, "cannot keep the downloaded model as \(modelURL.path): \(error.message)")
            }
        } else {
            try write(Data(bytes), to: modelURL)
        }
        try writeJSON(info, modelInfoURL)
        try clearPartialModel()
    }

    func clearModel() throws(OrchardClientError) {
        try remove(modelInfoURL)
        try remove(modelURL)
    }

    /// The partial download of the model named, and how many bytes it holds.
    func partialModel(_ modelID: String) throws(OrchardClientError) -> (info: ModelInfo, length: Int)? {
        guard let info = try readJSON(ModelInfo.self, partialInfoURL), info.modelID == modelID else { return nil }
        guard let size = size(of: partialModelURL) else { return nil }
        return (info, size)
    }

    /// A file's size in bytes; nil when it does not exist.
    private func size(of url: URL) -> Int? {
        ((try? FileManager.default.attributesOfItem(atPath: url.path))?[.size] as? NSNumber)?.intValue
    }

    func partialModelBytes() throws(OrchardClientError) -> [UInt8] {
        try read(partialModelURL).map { [UInt8]($0) } ?? []
    }

    func clearPartialModel() throws(OrchardClientError) {
        try remove(partialInfoURL)
        try remove(partialModelURL)
    }

    /// A sink that writes a download into the partial file, starting over when the server sends everything.
    func partialSink(modelID: String) -> PartialModelSink { PartialModelSink(store: self, modelID: modelID) }

    fileprivate func beginPartial(_ head: DownloadHead, modelID: String) throws(OrchardClientError) -> FileHandle {
        let existing = try partialModel(modelID)
        let keep = head.start > 0 && existing != nil && existing?.length == head.start
        if head.start > 0 && !keep {
            throw OrchardClientError(.network, "the server resumed at byte \(head.start), which is not where the partial download ends")
        }
        if !keep {
            try clearPartialModel()
            guard FileManager.default.createFile(atPath: partialModelURL.path, contents: nil) else {
                throw OrchardClientError(.storage, "cannot create \(partialModelURL.path)")
            }
        }
        try writeJSON(ModelInfo(modelID: modelID, etag: head.etag, totalLength: head.totalLength, sha256: head.sha256.map { Data($0) }), partialInfoURL)
        do {
            let handle = try FileHandle(forWritingTo: partialModelURL)
            try handle.seekToEnd()
            return handle
        } catch {
            throw OrchardClientError(.storage, "cannot open \(partialModelURL.path): \(FileAccessError(error, writing: true).message)")
        }
    }
}

/// Writes a model download into the store's partial file as it arrives.
final class PartialModelSink: DownloadSink {
    private let store: ClientStore
    private let modelID: String
    private let handle = Mutex<FileHandle?>(nil)
    private let received = Mutex(0)
    /// The most bytes the file may reach: the announced length, or ``largestModel`` when none was announced.
    private let limit = Mutex(PartialModelSink.largestModel)

    /// The largest model a device takes (a coordinator refuses to host one over 1 GiB by default): a download that
    /// announces or sends more is stopped before it fills the disk.
    static let largestModel = 2 << 30

    init(store: ClientStore, modelID: String) {
        self.store = store
        self.modelID = modelID
    }

    /// Bytes appended by this download.
    var bytesReceived: Int { received.withLock { $0 } }

    func begin(_ head: DownloadHead) throws(OrchardClientError) {
        let total = head.totalLength ?? Self.largestModel
        guard total <= Self.largestModel, head.start >= 0, head.start <= total else {
            throw OrchardClientError(
                .serverError, "the model download announces \(total) bytes from byte \(head.start); the most a device takes is \(Self.largestModel)")
        }
        let opened = try store.beginPartial(head, modelID: modelID)
        handle.withLock { $0 = opened }
        // What this download may still append.
        limit.withLock { $0 = total - head.start }
    }

    func append(_ bytes: [UInt8]) throws(OrchardClientError) {
        let room = limit.withLock { $0 } - received.withLock { $0 }
        guard bytes.count <= room else {
            throw OrchardClientError(.serverError, "the model download runs past its announced length (\(bytes.count) more bytes with \(max(0, room)) left)")
        }
        try handle.withLock { (handle: inout FileHandle?) throws(OrchardClientError) in
            guard let handle else { throw OrchardClientError(.storage, "download bytes arrived before its head") }
            do {
                try handle.write(contentsOf: bytes)
            } catch {
                throw OrchardClientError(.storage, "cannot append to the partial model: \(FileAccessError(error, writing: true).message)")
            }
        }
        received.withLock { $0 += bytes.count }
    }

    /// Closes the file.
    func close() {
        handle.withLock { handle in
            try? handle?.close()
            handle = nil
        }
    }
}
