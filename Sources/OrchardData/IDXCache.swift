public import Foundation
import OrchardSupport

/// Decompressed copies of gzip-compressed IDX files, so that a dataset read again (every `orchard simulate` run)
/// costs one file read rather than zlib's single-threaded inflate (about 0.3 s for Fashion-MNIST's training images).
///
/// An entry is named after the compressed file's name, device, inode, size and modification and change times, so a
/// file that is replaced or modified in any way gets a new entry (the test git uses for its index). Entries are
/// written whole to a temporary file and renamed into place: a reader sees a complete entry or none. An entry that
/// does not parse as an IDX array (damaged on disk) is ignored and written again.
public struct IDXCache: Sendable, Hashable {
    /// The directory holding the entries (created when the first one is written).
    public let directory: URL

    /// A cache in `directory`.
    public init(directory: URL) {
        self.directory = directory
    }

    /// The cache `orchard` uses: `$ORCHARD_CACHE_DIR/idx`, else `$XDG_CACHE_HOME/orchard/idx`, else
    /// `$HOME/.cache/orchard/idx`; nil (no caching) when `ORCHARD_CACHE_DIR` is set to `off` or no directory is known.
    public static func standard(environment: [String: String] = ProcessInfo.processInfo.environment) -> IDXCache? {
        func nonEmpty(_ key: String) -> String? { environment[key].flatMap { $0.isEmpty ? nil : $0 } }
        if let root = nonEmpty("ORCHARD_CACHE_DIR") {
            return root == "off" ? nil : IDXCache(directory: URL(fileURLWithPath: root).appendingPathComponent("idx", isDirectory: true))
        }
        if let xdg = nonEmpty("XDG_CACHE_HOME"), xdg.hasPrefix("/") {
            return IDXCache(directory: URL(fileURLWithPath: xdg).appendingPathComponent("orchard/idx", isDirectory: true))
        }
        guard let home = nonEmpty("HOME") else { return nil }
        return IDXCache(directory: URL(fileURLWithPath: home).appendingPathComponent(".cache/orchard/idx", isDirectory: true))
    }

    /// The entry's path for the file at `source`, or nil when the file cannot be examined.
    func entryPath(for source: URL) -> String? {
        var info = stat()
        guard stat(source.path, &info) == 0, info.st_mode & S_IFMT == S_IFREG else { return nil }
        let name = [
            source.lastPathComponent, String(info.st_dev), String(info.st_ino), String(info.st_size),
            Self.stamp(info, modification: true), Self.stamp(info, modification: false),
        ].joined(separator: "-")
        return directory.appendingPathComponent(name + ".idx").path
    }

    /// A file's modification or change time as `seconds.nanoseconds` (the field names differ between Glibc and Darwin).
    private static func stamp(_ info: stat, modification: Bool) -> String {
        #if canImport(Darwin)
        let time = modification ? info.st_mtimespec : info.st_ctimespec
        #else
        let time = modification ? info.st_mtim : info.st_ctim
        #endif
        return "\(time.tv_sec).\(time.tv_nsec)"
    }

    /// The entry at `path` as an array, or nil when there is none or it is not a whole IDX array (damaged). The
    /// payload is read straight into its own array: one copy of the bytes, not three (file → data → bytes → payload).
    func read(_ path: String) -> IDXArray? {
        let descriptor = open(path, O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else { return nil }
        defer { close(descriptor) }
        var info = stat()
        guard fstat(descriptor, &info) == 0 else { return nil }
        func readFully(_ buffer: UnsafeMutableRawBufferPointer, at offset: Int) -> Bool {
            var done = 0
            while done < buffer.count {
                let count = pread(descriptor, buffer.baseAddress! + done, buffer.count - done, off_t(offset + done))
                if count < 0 && errno == EINTR { continue }
                guard count > 0 else { return false }
                done += count
            }
            return true
        }
        // The header through IDXArray's own parser: 4 bytes, then the 4 a dimension they announce.
        var head = [UInt8](repeating: 0, count: 4)
        guard info.st_size >= 4, head.withUnsafeMutableBytes({ readFully($0, at: 0) }) else { return nil }
        var dimensions = [UInt8](repeating: 0, count: 4 * Int(head[3]))
        guard info.st_size >= 4 + dimensions.count, dimensions.withUnsafeMutableBytes({ readFully($0, at: 4) }),
            let header = try? IDXArray.header(head + dimensions), Int(info.st_size) - header.size == header.payloadBytes
        else { return nil }
        guard
            let payload = try? [UInt8](
                unsafeUninitializedCapacity: header.payloadBytes,
                initializingWith: { buffer, initialized in
                    guard readFully(UnsafeMutableRawBufferPointer(buffer), at: header.size) else { throw DataError(.unreadable, "short read") }
                    initialized = buffer.count
                })
        else { return nil }
        return try? IDXArray(elementType: header.type, shape: header.shape, payload: payload)
    }

    /// Writes an entry; a cache that cannot be written (a read-only home, a full disk) only means the next read
    /// decompresses again, so the failure is returned for the caller to ignore or report.
    @discardableResult
    func store(_ bytes: [UInt8], at path: String) -> FileAccessError? {
        do throws(FileAccessError) {
            try LocalFile.createDirectory(directory.path)
            try LocalFile.write(Data(bytes), to: path)
            return nil
        } catch {
            return error
        }
    }
}
