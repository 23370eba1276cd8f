import OrchardSupport
import Foundation
import OrchardData
import OrchardML
import OrchardTesting
import Testing

@Suite("IDX reader")
struct IDXTests {
    /// Two 2×3 images with pixels 0, 20, …, 220, as an uncompressed IDX file.
    static let rawImages: [UInt8] = [0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0, 3] + (0..<12).map { UInt8($0 * 20) }

    /// The same file compressed by Python's `gzip.compress(data, mtime=0)`.
    static let gzipImages: [UInt8] = [
        0x1F, 0x8B, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x03, 0x63, 0x60, 0xE0, 0x60, 0x66, 0x60, 0x60, 0x60,
        0x82, 0x62, 0x66, 0x06, 0x11, 0x0D, 0x9B, 0x80, 0x94, 0x8A, 0x9E, 0x05, 0x5B, 0x4E, 0xDC, 0x01, 0x00, 0xA6,
        0x13, 0xE4, 0x5D, 0x1C, 0x00, 0x00, 0x00,
    ]

    static let rawLabels: [UInt8] = [0, 0, 8, 1, 0, 0, 0, 2, 7, 3]

    @Test("reads raw and gzip files to the same array")
    func rawAndGzip() throws {
        let raw = try IDXArray(bytes: Self.rawImages)
        let gz = try IDXArray(bytes: Self.gzipImages)
        #expect(raw == gz)
        #expect(raw.elementType == .uint8)
        #expect(raw.shape == [2, 2, 3])
        #expect(raw.floats() == (0..<12).map { Float($0 * 20) })
        #expect(raw.encoded == Self.rawImages)
    }

    @Test("builds an image dataset scaled to [0, 1], channels first")
    func imageDataset() throws {
        let data = try IDXImageDataset(images: try IDXArray(bytes: Self.gzipImages), labels: try IDXArray(bytes: Self.rawLabels))
        #expect(data.count == 2)
        #expect(data.inputSpecs == [FeatureSpec(name: "image", shape: [1, 2, 3])])
        #expect(read(data, input: 0, sample: 1) == [120, 140, 160, 180, 200, 220].map { Float($0) / 255 })
        #expect(readTarget(data, sample: 0) == [7])
        #expect(try data.classLabels() == [7, 3])
    }

    @Test("every byte value scales to Float(v) / 255 exactly, in the 16-pixel steps and in the tail after them")
    func everyByteValueScales() throws {
        // Two 19 × 7 images (133 pixels: eight steps of 16 and a tail of 5) holding every byte value, from an offset.
        let pixels = (0..<266).map { UInt8(($0 * 7 + 3) % 256) }
        let header: [UInt8] = [0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 19, 0, 0, 0, 7]
        let data = try IDXImageDataset(images: try IDXArray(bytes: header + pixels), labels: try IDXArray(bytes: [0, 0, 8, 1, 0, 0, 0, 2, 1, 2]))
        #expect(Set(pixels).count == 256)
        for sample in 0..<2 {
            let expected = pixels[(sample * 133)..<((sample + 1) * 133)].map { Float($0) / 255 }
            #expect(read(data, input: 0, sample: sample) == expected, "image \(sample)")
        }
    }

    @Test("decodes big-endian multi-byte element types")
    func wideTypes() throws {
        let int16 = try IDXArray(bytes: [0, 0, 0x0B, 1, 0, 0, 0, 2, 0xFF, 0xFE, 0x01, 0x00])
        #expect(int16.floats() == [-2, 256])
        let float32 = try IDXArray(bytes: [0, 0, 0x0D, 1, 0, 0, 0, 1, 0x3F, 0xC0, 0x00, 0x00])
        #expect(float32.floats() == [1.5])
        let float64 = try IDXArray(bytes: [0, 0, 0x0E, 1, 0, 0, 0, 1, 0xC0, 0x04, 0, 0, 0, 0, 0, 0])
        #expect(float64.floats() == [-2.5])
    }

    @Test(
        "malformed files are rejected with the reason",
        arguments: [
            ([1, 0, 8, 1, 0, 0, 0, 1, 5] as [UInt8], DataError.Code.invalidIDX),  // bad magic
            ([0, 0, 7, 1, 0, 0, 0, 1, 5], .invalidIDX),  // unknown element type
            ([0, 0, 8, 0], .invalidIDX),  // no dimensions
            ([0, 0, 8, 2, 0, 0, 0, 1], .invalidIDX),  // header cut short
            ([0, 0, 8, 1, 0, 0, 0, 0], .invalidIDX),  // zero dimension
            ([0, 0, 8, 1, 0, 0, 0, 3, 5, 6], .sizeMismatch),  // truncated payload
            ([0, 0, 8, 1, 0, 0, 0, 1, 5, 6], .sizeMismatch),  // trailing bytes
            ([0, 0], .invalidIDX),  // too short
            ([0, 0, 8, 3] + [UInt8](repeating: 0xFF, count: 12), .invalidIDX),  // 3 × (2³² − 1) elements: the size overflows
            ([0x1F, 0x8B, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x03, 0x63, 0x60, 0xE0, 0x60], .unreadable),  // truncated gzip
        ])
    func malformed(bytes: [UInt8], code: DataError.Code) {
        #expect { try IDXArray(bytes: bytes) } throws: { ($0 as? DataError)?.code == code }
    }

    @Test(
        "a gzip file whose data does not match its trailer (CRC-32, size) or that is cut short is rejected",
        arguments: [
            "crc", "size", "cut",
        ])
    func corruptGzip(damage: String) {
        var bytes = Self.gzipImages
        switch damage {
        case "crc": bytes[bytes.count - 6] ^= 0x01  // a bit of the stored CRC-32 (zlib's own check)
        case "size": bytes[bytes.count - 4] ^= 0x01  // a bit of the stored size
        default: bytes.removeLast(3)  // the stream cut inside its trailer
        }
        #expect { try IDXArray(bytes: bytes) } throws: { ($0 as? DataError)?.code == .unreadable }
    }

    @Test("image and label counts must agree, and types must be bytes")
    func mismatchedPair() throws {
        let images = try IDXArray(bytes: Self.rawImages)
        let threeLabels = try IDXArray(elementType: .uint8, shape: [3], payload: [1, 2, 3])
        #expect { try IDXImageDataset(images: images, labels: threeLabels) } throws: { ($0 as? DataError)?.code == .sizeMismatch }
        #expect { try IDXImageDataset(images: threeLabels, labels: threeLabels) } throws: { ($0 as? DataError)?.code == .invalidIDX }
    }

    @Test("reads an MNIST-layout directory of uncompressed files")
    func directory() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-idx-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        try Data(Self.rawImages).write(to: dir.appendingPathComponent("t10k-images-idx3-ubyte"))
        try Data(Self.gzipImages).write(to: dir.appendingPathComponent("t10k-images-idx3-ubyte.gz"))
        try Data(Self.rawLabels).write(to: dir.appendingPathComponent("t10k-labels-idx1-ubyte"))
        let data = try IDXImageDataset(directory: dir, split: .test)
        #expect(data.count == 2)
        #expect { try IDXImageDataset(directory: dir, split: .train) } throws: { ($0 as? DataError)?.code == .unreadable }
    }

    @Test("a gzip file's decompressed copy is kept in the cache and read back; a damaged copy or a changed file is decompressed again")
    func cache() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-idx-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        let gz = dir.appendingPathComponent("t10k-images-idx3-ubyte.gz")
        try Data(Self.gzipImages).write(to: gz)
        let cache = IDXCache(directory: dir.appendingPathComponent("cache/idx"))
        func entries() throws -> [URL] {
            guard FileManager.default.fileExists(atPath: cache.directory.path) else { return [] }
            return try FileManager.default.contentsOfDirectory(at: cache.directory, includingPropertiesForKeys: nil).sorted { $0.path < $1.path }
        }
        let expected = try IDXArray(bytes: Self.rawImages)

        #expect(try IDXArray(contentsOf: gz, cache: cache) == expected)
        let written = try entries()
        try #require(written.count == 1)
        #expect(written[0].lastPathComponent.hasPrefix("t10k-images-idx3-ubyte.gz-") && written[0].pathExtension == "idx")
        #expect(try [UInt8](Data(contentsOf: written[0])) == Self.rawImages)

        // What a read returns is the entry, not a fresh decompression: plant another valid array in it.
        try Data(Self.rawLabels).write(to: written[0])
        #expect(try IDXArray(contentsOf: gz, cache: cache) == IDXArray(bytes: Self.rawLabels))
        // A damaged entry is ignored and written again.
        try Data(Self.rawImages.prefix(10)).write(to: written[0])
        #expect(try IDXArray(contentsOf: gz, cache: cache) == expected)
        #expect(try [UInt8](Data(contentsOf: written[0])) == Self.rawImages)
        // A replaced file (a new inode and change time) gets a new entry; the old one is not used.
        try Data(Self.rawLabels).write(to: written[0])
        try Data(Self.gzipImages).write(to: gz, options: .atomic)
        #expect(try IDXArray(contentsOf: gz, cache: cache) == expected)
        #expect(try entries().count == 2)
        // Uncompressed files are read directly, not copied.
        let raw = dir.appendingPathComponent("t10k-labels-idx1-ubyte")
        try Data(Self.rawLabels).write(to: raw)
        #expect(try IDXArray(contentsOf: raw, cache: cache) == IDXArray(bytes: Self.rawLabels))
        #expect(try entries().count == 2)
        // A cache that cannot be written (a file where its directory should be) does not stop the read.
        let blocked = IDXCache(directory: raw.appendingPathComponent("idx"))
        #expect(try IDXArray(contentsOf: gz, cache: blocked) == expected)
        // A corrupt file is refused whatever the cache holds for another file.
        let corrupt = dir.appendingPathComponent("train-images-idx3-ubyte.gz")
        try Data(Self.gzipImages.dropLast(3)).write(to: corrupt)
        #expect { try IDXArray(contentsOf: corrupt, cache: cache) } throws: { ($0 as? DataError)?.code == .unreadable }
        #expect(try entries().count == 2)
    }

    @Test("the standard cache directory follows ORCHARD_CACHE_DIR, then XDG_CACHE_HOME, then HOME; off turns it off")
    func standardCache() {
        #expect(IDXCache.standard(environment: ["ORCHARD_CACHE_DIR": "/c", "XDG_CACHE_HOME": "/x", "HOME": "/h"])?.directory.path == "/c/idx")
        #expect(IDXCache.standard(environment: ["ORCHARD_CACHE_DIR": "off", "HOME": "/h"]) == nil)
        #expect(IDXCache.standard(environment: ["ORCHARD_CACHE_DIR": "", "XDG_CACHE_HOME": "/x", "HOME": "/h"])?.directory.path == "/x/orchard/idx")
        #expect(IDXCache.standard(environment: ["XDG_CACHE_HOME": "relative", "HOME": "/h"])?.directory.path == "/h/.cache/orchard/idx")
        #expect(IDXCache.standard(environment: [:]) == nil)
    }

    /// Skipped, saying so, where Debian's `dataset-fashion-mnist` is not installed; CI installs it and sets
    /// `ORCHARD_REQUIRE_DATASETS=1`, under which a missing dataset fails this test.
    @Test(
        "reads Fashion-MNIST from the Debian package, and McMahan shards hold two labels per client",
        SystemDatasets.requirement(
            file: IDXImageDataset.fashionMNISTDirectory.appendingPathComponent("train-images-idx3-ubyte.gz").path, package: "dataset-fashion-mnist")
    )
    func fashionMNIST() throws {
        let train = try IDXImageDataset(directory: IDXImageDataset.fashionMNISTDirectory, split: .train)
        let test = try IDXImageDataset(directory: IDXImageDataset.fashionMNISTDirectory, split: .test)
        #expect(train.count == 60_000)
        #expect(test.count == 10_000)
        #expect(train.inputSpecs[0].shape == [1, 28, 28])
        let labels = try train.classLabels()
        var perClass = [Int](repeating: 0, count: 10)
        for label in labels { perClass[label] += 1 }
        #expect(perClass == [Int](repeating: 6000, count: 10))
        let pixels = read(train, input: 0, sample: 0)
        #expect(pixels.allSatisfy { $0 >= 0 && $0 <= 1 } && pixels.contains { $0 > 0.5 })

        var g = OrchardRandom(seed: 2017)
        let clients = try train.partitioned(into: 100, strategy: .labelShards(), using: &g, labels: labels)
        #expect(clients.allSatisfy { $0.count == 600 && Set($0.indices.map { labels[$0] }).count <= 2 })
    }
}
