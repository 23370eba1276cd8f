import Foundation
import OrchardFormats
import OrchardSupport

/// A failure a command reports as its one line: ArgumentParser prints `Error: <message>` on standard error and
/// exits with status 1 (an error it does not know prints as its `description`).
struct CommandFailure: OrchardError {
    /// The underlying error's code (`no_such_file`, `invalid_spec`, …), for code that tells failures apart.
    var code: String
    /// The whole line after `Error: `.
    var message: String

    var description: String { message }
}

/// A file named on the command line, by an option (`--output`) or an argument as `--help` shows it (`<model>`);
/// every failure to read, decode or write it is one line naming both: `<model> 'm.json': no such file`.
struct CommandFile {
    /// The option or argument.
    var name: String
    /// The path given.
    var path: String

    init(_ name: String, _ path: String) {
        self.name = name
        self.path = path
    }

    /// `name 'path': reason`.
    func failure(_ code: some CustomStringConvertible, _ reason: String) -> CommandFailure {
        CommandFailure(code: "\(code)", message: "\(name) '\(path)': \(reason)")
    }

    /// The file's bytes.
    func read() throws(CommandFailure) -> Data {
        do throws(FileAccessError) { return try LocalFile.read(path) } catch { throw failure(error.code, error.message) }
    }

    /// Refuses an output that is one of the command's input files, which writing would replace before it is read
    /// again (an output naming the weights it was made from, say).
    func refuseOverwriting(_ inputs: [CommandFile]) throws(CommandFailure) {
        if let input = inputs.first(where: { Self.sameFile($0.path, path) }) {
            throw failure("invalid_option", "is the input \(input.name) '\(input.path)'; writing it would replace that file: choose another path")
        }
    }

    /// Whether `a` and `b` name one existing file (the same device and inode: through links, `..` or another spelling).
    /// Here, in the command-line tool, and not in a module an app links: `stat` (which Foundation calls for the file's
    /// attributes) is an API Apple asks apps to declare.
    static func sameFile(_ a: String, _ b: String) -> Bool {
        func identity(_ path: String) -> (device: Int, inode: Int)? {
            guard let attributes = try? FileManager.default.attributesOfItem(atPath: path),
                let device = (attributes[.systemNumber] as? NSNumber)?.intValue, let inode = (attributes[.systemFileNumber] as? NSNumber)?.intValue
            else { return nil }
            return (device, inode)
        }
        guard let first = identity(a), let second = identity(b) else { return false }
        return first == second
    }

    /// Replaces the file with `data`.
    func write(_ data: Data) throws(CommandFailure) {
        do throws(FileAccessError) { try LocalFile.write(data, to: path) } catch { throw failure(error.code, error.message) }
    }

    /// The directory, created with its parents when missing.
    func createDirectory() throws(CommandFailure) {
        do throws(FileAccessError) { try LocalFile.createDirectory(path) } catch { throw failure(error.code, error.message) }
    }

    /// The model architecture the file holds, decoded and checked (a JSON syntax error by its line and column).
    func modelSpec() throws(CommandFailure) -> ModelSpec {
        let json = try read()
        do throws(FormatError) { return try ModelSpec.decode(json: json) } catch {
            let prefix = "model JSON: "
            throw failure(error.code, error.message.hasPrefix(prefix) ? String(error.message.dropFirst(prefix.count)) : error.message)
        }
    }

    /// The safetensors archive the file holds.
    func safetensors() throws(CommandFailure) -> SafetensorsArchive {
        let bytes = try read()
        do throws(FormatError) { return try Safetensors.decode(bytes) } catch { throw failure(error.code, error.message) }
    }
}
