public import Foundation
#if canImport(Glibc)
import Glibc
private let systemWrite = Glibc.write
#elseif canImport(Darwin)
import Darwin
private let systemWrite = Darwin.write
#endif

/// Why a local file could not be read or written, in the few words a command line shows after the file's name:
/// `no such file`, `is a directory`, `permission denied` (Foundation's own errors print as an
/// `Error Domain=NSCocoaErrorDomain Code=260 … UserInfo={…}` record).
public struct FileAccessError: OrchardError, Hashable {
    /// A machine-readable category of a file access error.
    public struct Code: Sendable, Hashable, CustomStringConvertible {
        private enum Kind: String, ErrorCodeKind {
            case noSuchFile, isADirectory, permissionDenied, failed
        }
        private let kind: Kind
        private init(_ kind: Kind) { self.kind = kind }

        /// The file (or, when writing, its directory) does not exist.
        public static let noSuchFile = Code(.noSuchFile)
        /// A directory stands where a file was expected.
        public static let isADirectory = Code(.isADirectory)
        /// The process may not read or write it.
        public static let permissionDenied = Code(.permissionDenied)
        /// Any other reason (the system's words).
        public static let failed = Code(.failed)
        /// The code in snake case, e.g. `no_such_file`.
        public var description: String { kind.snakeCased }
    }

    /// What went wrong, as a category.
    public var code: Code
    /// The reason in lower case, without the path: `no such file`.
    public var message: String

    /// Creates an error with a code and a message.
    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

    /// The reason behind a Foundation file error (its POSIX cause, when it has one); `writing` says "no such
    /// directory" for a missing parent rather than "no such file".
    public init(_ error: any Error, writing: Bool = false) {
        switch Self.posixCode(of: error) {
        case ENOENT: self.init(.noSuchFile, writing ? "no such directory" : "no such file")
        case EISDIR: self.init(.isADirectory, "is a directory")
        case EACCES, EPERM: self.init(.permissionDenied, "permission denied")
        case let code?: self.init(.failed, Self.systemReason(code))
        case nil: self.init(.failed, (error as NSError).localizedDescription)
        }
    }

    /// `errno` behind an error of Foundation's file APIs.
    private static func posixCode(of error: any Error) -> Int32? {
        let error = error as NSError
        if error.domain == NSPOSIXErrorDomain { return Int32(error.code) }
        if let underlying = error.userInfo[NSUnderlyingErrorKey] as? NSError, underlying.domain == NSPOSIXErrorDomain {
            return Int32(underlying.code)
        }
        guard error.domain == NSCocoaErrorDomain else { return nil }
        switch CocoaError.Code(rawValue: error.code) {
        case .fileNoSuchFile, .fileReadNoSuchFile: return ENOENT
        case .fileReadNoPermission, .fileWriteNoPermission: return EACCES
        case .fileWriteVolumeReadOnly: return EROFS
        case .fileWriteOutOfSpace: return ENOSPC
        default: return nil
        }
    }

    /// `strerror`'s text with a lower-case first letter: `read-only file system`.
    fileprivate static func systemReason(_ code: Int32) -> String {
        let text = String(cString: strerror(code))
        return text.prefix(1).lowercased() + text.dropFirst()
    }
}

/// Reading and writing whole local files with errors that name only the reason (``FileAccessError``), for a
/// caller to put after the option or argument that named the file.
public enum LocalFile {
    /// The bytes of the file at `path`.
    public static func read(_ path: String) throws(FileAccessError) -> Data {
        var isDirectory: ObjCBool = false
        // Foundation on Linux reports a directory as an unknown read error; say what it is.
        if FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory), isDirectory.boolValue {
            throw FileAccessError(.isADirectory, "is a directory")
        }
        do {
            return try Data(contentsOf: URL(fileURLWithPath: path))
        } catch {
            throw FileAccessError(error)
        }
    }

    /// Replaces the file at `path` with `data` (written to a temporary file first, then renamed).
    public static func write(_ data: Data, to path: String) throws(FileAccessError) {
        var isDirectory: ObjCBool = false
        if FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory), isDirectory.boolValue {
            throw FileAccessError(.isADirectory, "is a directory")
        }
        do {
            try data.write(to: URL(fileURLWithPath: path), options: .atomic)
        } catch {
            throw FileAccessError(error, writing: true)
        }
    }

    /// Writes `data` to a file that must not exist yet, created with `permissions` (less any the umask removes) so it
    /// is never readable more widely, even for a moment; an existing file is an error, never replaced.
    public static func createNew(_ data: Data, at path: String, permissions: mode_t) throws(FileAccessError) {
        let descriptor = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, permissions)
        guard descriptor >= 0 else {
            let code = errno
            switch code {
            case EEXIST: throw FileAccessError(.failed, "exists (it is never overwritten)")
            case ENOENT: throw FileAccessError(.noSuchFile, "no such directory")
            case EISDIR: throw FileAccessError(.isADirectory, "is a directory")
            case EACCES, EPERM: throw FileAccessError(.permissionDenied, "permission denied")
            default: throw FileAccessError(.failed, FileAccessError.systemReason(code))
            }
        }
        defer { close(descriptor) }
        let failure = writeAll(data, to: descriptor, sync: true)
        if failure != 0 {
            unlink(path)
            throw FileAccessError(.failed, FileAccessError.systemReason(failure))
        }
    }

    /// Replaces the file at `path` with `data` atomically (a reader sees the old file or the new one): the bytes go to
    /// `.NAME.writing` beside it, which is renamed over it. With `synced`, they are forced to disk before the rename;
    /// without, a crash of the machine (not of the process) may lose the new file — for state that is cheap to lose, such
    /// as a simulated device's. The file is readable and writable by its owner only (it may hold a session token).
    public static func replace(_ data: Data, at path: String, synced: Bool) throws(FileAccessError) {
        let url = URL(fileURLWithPath: path)
        let temporary = url.deletingLastPathComponent().appendingPathComponent(".\(url.lastPathComponent).writing").path
        // A leftover of an interrupted write may have another mode: start from a new file.
        unlink(temporary)
        let descriptor = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard descriptor >= 0 else {
            let code = errno
            switch code {
            case ENOENT: throw FileAccessError(.noSuchFile, "no such directory")
            case EACCES, EPERM: throw FileAccessError(.permissionDenied, "permission denied")
            default: throw FileAccessError(.failed, FileAccessError.systemReason(code))
            }
        }
        var failure = writeAll(data, to: descriptor, sync: synced)
        if close(descriptor) != 0 && failure == 0 { failure = errno }
        if failure == 0 && rename(temporary, path) != 0 { failure = errno }
        if failure != 0 {
            unlink(temporary)
            throw failure == EISDIR ? FileAccessError(.isADirectory, "is a directory") : FileAccessError(.failed, FileAccessError.systemReason(failure))
        }
    }

    /// Renames the complete file at `path` over `destination` (atomically); with `synced`, its bytes are forced to disk
    /// first.
    public static func promote(_ path: String, to destination: String, synced: Bool) throws(FileAccessError) {
        if synced {
            let descriptor = open(path, O_RDONLY | O_CLOEXEC)
            guard descriptor >= 0 else {
                let code = errno
                throw code == ENOENT ? FileAccessError(.noSuchFile, "no such file") : FileAccessError(.failed, FileAccessError.systemReason(code))
            }
            let failure = fsync(descriptor) == 0 ? 0 : errno
            close(descriptor)
            if failure != 0 { throw FileAccessError(.failed, FileAccessError.systemReason(failure)) }
        }
        guard rename(path, destination) == 0 else {
            let code = errno
            throw code == ENOENT ? FileAccessError(.noSuchFile, "no such file") : FileAccessError(.failed, FileAccessError.systemReason(code))
        }
    }

    /// Writes every byte of `data` to `descriptor` (then fsyncs it with `sync`); the errno of a failure, or 0.
    private static func writeAll(_ data: Data, to descriptor: Int32, sync: Bool) -> Int32 {
        data.withUnsafeBytes { buffer -> Int32 in
            var offset = 0
            while offset < buffer.count {
                let written = systemWrite(descriptor, buffer.baseAddress! + offset, buffer.count - offset)
                if written < 0 {
                    if errno == EINTR { continue }
                    return errno
                }
                offset += written
            }
            return sync && fsync(descriptor) != 0 ? errno : 0
        }
    }

    /// Asks the file system to place the subdirectories of the directory at `path` apart from each other, as it places
    /// top-level directories (the Linux `FS_TOPDIR_FL` attribute, which ext4's Orlov allocator reads). For a directory of
    /// many unrelated trees created and deleted within seconds, such as a simulated fleet's devices: ext4 without a
    /// journal gives a new file the first free inode of its directory's group that was not deleted in the last half
    /// minute, so with every tree in one group each new file steps over all the recent deletions. A hint only: returns
    /// whether it was set; file systems without the attribute, and other systems, keep their own placement.
    @discardableResult
    public static func spreadSubdirectories(of path: String) -> Bool {
        #if os(Linux)
        let descriptor = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard descriptor >= 0 else { return false }
        defer { close(descriptor) }
        // FS_IOC_GETFLAGS / FS_IOC_SETFLAGS (_IOR/_IOW('f', 1/2, long) on 64-bit Linux) read and write an int;
        // FS_TOPDIR_FL = 0x20000.
        let getFlags: UInt = 0x8008_6601, setFlags: UInt = 0x4008_6602, topDirectory: Int32 = 0x0002_0000
        var flags: Int32 = 0
        guard withUnsafeMutablePointer(to: &flags, { ioctl(descriptor, getFlags, $0) }) == 0 else { return false }
        if flags & topDirectory != 0 { return true }
        flags |= topDirectory
        return withUnsafeMutablePointer(to: &flags, { ioctl(descriptor, setFlags, $0) }) == 0
        #else
        return false
        #endif
    }

    /// Creates the directory at `path` and any missing parents; an existing directory is kept.
    public static func createDirectory(_ path: String) throws(FileAccessError) {
        // mkdir(2) first, the parents only when missing: Foundation's walk of every component costs a simulated fleet's
        // devices more than the directories themselves.
        if mkdir(path, 0o777) == 0 { return }
        let code = errno
        switch code {
        case EEXIST:
            var isDirectory: ObjCBool = false
            if FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory), isDirectory.boolValue { return }
            throw FileAccessError(.failed, "is a file, not a directory")
        case ENOENT:
            let parent = (path as NSString).deletingLastPathComponent
            guard !parent.isEmpty, parent != path else { throw FileAccessError(.noSuchFile, "no such directory") }
            try createDirectory(parent)
            if mkdir(path, 0o777) == 0 || errno == EEXIST { return }
            throw FileAccessError(.failed, FileAccessError.systemReason(errno))
        case EACCES, EPERM, EROFS:
            throw FileAccessError(.permissionDenied, "permission denied")
        case ENOTDIR:
            throw FileAccessError(.failed, "a parent is a file, not a directory")
        default:
            throw FileAccessError(.failed, FileAccessError.systemReason(code))
        }
    }
}
