import Foundation
import OrchardData
import OrchardML

/// The samples the app collected on this phone, in the file format `orchard data prepare` writes (safetensors: one
/// tensor per model input, and `target`), kept in the app's Application Support directory. The app appends to it as the
/// user uses the app; the file never leaves the phone.
enum LocalSamples {
    /// The app's Application Support directory (`FileManager`'s, which Linux's Foundation has too, unlike
    /// `URL.applicationSupportDirectory`).
    static var applicationSupport: URL {
        FileManager.default.urls(for: .applicationSupportDirectory, in: .userDomainMask).first ?? FileManager.default.temporaryDirectory
    }

    /// The file: `Application Support/orchard/samples.safetensors`.
    static func file(in directory: URL = applicationSupport) -> URL {
        directory.appendingPathComponent("orchard", isDirectory: true).appendingPathComponent("samples.safetensors")
    }

    /// The samples collected so far.
    /// - Throws: ``ExampleError`` when none were collected yet; the file's own error when it is damaged.
    static func load(from file: URL = file()) throws -> TensorDataset {
        guard FileManager.default.fileExists(atPath: file.path) else {
            throw ExampleError("no samples collected yet at \(file.path)")
        }
        return try DeviceDataFile.read(contentsOf: file)
    }
}
