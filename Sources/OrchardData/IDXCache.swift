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
            "\(info.st_mtim.tv_sec).\(info.st_mtim.tv_nsec)", "\(info.st_ctim.tv_sec).\(info.st_ctim.tv_nsec)",
        ].joined(separator: "-")
        return directory.appendingPathComponent(name + ".idx").path
    }

    /// The entry's bytes, or nil when there is none.
    func read(_ path: String) -> [UInt8]? {
        guard let data = try? LocalFile.read(path) else { return nil }
        return [UInt8](data)
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
