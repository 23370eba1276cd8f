// swift-tools-version: 6.2
import PackageDescription

/// `ORCHARD_NATIVE=1 swift build -c release` compiles for the build machine's CPU (AVX2/FMA on x86-64) — for
/// benchmarks and self-built deployments. Off by default: unsafe flags would stop Orchard from being used as a
/// versioned dependency, and a baseline binary runs on every CPU of its architecture.
let nativeSettings: [SwiftSetting] =
    Context.environment["ORCHARD_NATIVE"] == "1"
    ? [.unsafeFlags(["-Xcc", "-march=native"]), .define("ORCHARD_NATIVE")] : []

/// The Apple frameworks Orchard's Apple-facing targets import, and the modules that stand in for them on Linux
/// (`Sources/AppleShims`). On Linux those targets are compiled with `-module-alias Framework=Shim`, so `import
/// BackgroundTasks` there compiles the same Swift an iPhone compiles, against declarations transcribed from Apple's
/// headers. The alias reaches only the targets that ask for it: SwiftNIO, AsyncHTTPClient, Hummingbird and the rest test
/// `canImport(Network)` and keep their Linux paths. On Apple hosts nothing is aliased: the real frameworks are used.
let appleShims = [
    "BackgroundTasks": "BackgroundTasksShim", "CoreML": "CoreMLShim", "UIKit": "UIKitShim", "Network": "NetworkShim",
    "os": "OSLogShim", "SwiftUI": "SwiftUIShim",
]

/// Settings for a target that imports `frameworks` (aliased to their shims on Linux).
func appleFrameworks(_ frameworks: [String]) -> [SwiftSetting] {
    #if os(Linux)
    return [.unsafeFlags(frameworks.flatMap { ["-module-alias", "\($0)=\(appleShims[$0]!)"] })]
    #else
    return []
    #endif
}

/// The shims of `frameworks`, as dependencies on Linux only.
func appleShimDependencies(_ frameworks: [String]) -> [Target.Dependency] {
    frameworks.map { .target(name: appleShims[$0]!, condition: .when(platforms: [.linux])) }
}

/// One set of compiler settings shared by every target.
let swiftSettings: [SwiftSetting] =
    [
        .swiftLanguageMode(.v6),
        .enableUpcomingFeature("ExistentialAny"),
        .enableUpcomingFeature("InternalImportsByDefault"),
        .enableUpcomingFeature("MemberImportVisibility"),
    ] + nativeSettings

let package = Package(
    name: "Orchard",
    // iOS 18 / macOS 15: Orchard uses the Swift 6 runtime's `Synchronization.Mutex` and typed throws throughout; iOS 18
    // runs on every iPhone iOS 17 runs on (XS/XR and later), so raising the minimum leaves no device behind.
    platforms: [.macOS(.v15), .iOS(.v18)],
    products: [
        .library(name: "OrchardSupport", targets: ["OrchardSupport"]),
        .library(name: "OrchardFormats", targets: ["OrchardFormats"]),
        .library(name: "OrchardML", targets: ["OrchardML"]),
        .library(name: "OrchardData", targets: ["OrchardData"]),
        .library(name: "OrchardExamples", targets: ["OrchardExamples"]),
        .library(name: "OrchardScheduler", targets: ["OrchardScheduler"]),
        .library(name: "OrchardSchedulerApple", targets: ["OrchardSchedulerApple"]),
        .library(name: "OrchardPrivacy", targets: ["OrchardPrivacy"]),
        .library(name: "OrchardProtocol", targets: ["OrchardProtocol"]),
        .library(name: "OrchardCoordinator", targets: ["OrchardCoordinator"]),
        .library(name: "OrchardCoordinatorPostgres", targets: ["OrchardCoordinatorPostgres"]),
        .library(name: "OrchardHTTPClient", targets: ["OrchardHTTPClient"]),
        .library(name: "OrchardClient", targets: ["OrchardClient"]),
        .library(name: "OrchardOperator", targets: ["OrchardOperator"]),
        .library(name: "OrchardCoreML", targets: ["OrchardCoreML"]),
        .library(name: "OrchardCoreMLTrainer", targets: ["OrchardCoreMLTrainer"]),
        .library(name: "OrchardInProcess", targets: ["OrchardInProcess"]),
        .library(name: "OrchardCharts", targets: ["OrchardCharts"]),
        .library(name: "OrchardFlower", targets: ["OrchardFlower"]),
        .library(name: "OrchardSimulation", targets: ["OrchardSimulation"]),
        .library(name: "OrchardTesting", targets: ["OrchardTesting"]),
        .library(name: "OrchardCoordinatorTesting", targets: ["OrchardCoordinatorTesting"]),
        .library(name: "OrchardBenchmarks", targets: ["OrchardBenchmarks"]),
        .executable(name: "orchard", targets: ["orchard"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser.git", from: "1.5.0"),
        .package(url: "https://github.com/apple/swift-log.git", from: "1.16.0"),
        .package(url: "https://github.com/apple/swift-metrics.git", from: "2.5.0"),
        .package(url: "https://github.com/apple/swift-protobuf.git", from: "1.28.0"),
        .package(url: "https://github.com/apple/swift-collections.git", from: "1.1.0"),
        .package(url: "https://github.com/apple/swift-crypto.git", "4.0.0"..<"6.0.0"),
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.0"),
        .package(url: "https://github.com/apple/swift-nio-ssl.git", from: "2.27.0"),
        .package(url: "https://github.com/apple/swift-certificates.git", from: "1.0.0"),
        .package(url: "https://github.com/apple/swift-asn1.git", from: "1.0.0"),
        .package(url: "https://github.com/adam-fowler/compress-nio.git", from: "1.5.0"),
        .package(url: "https://github.com/groue/GRDB.swift.git", from: "7.0.0"),
        .package(url: "https://github.com/hummingbird-project/hummingbird.git", from: "2.5.0"),
        .package(url: "https://github.com/apple/swift-http-types.git", from: "1.0.0"),
        .package(url: "https://github.com/swift-server/async-http-client.git", from: "1.23.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus.git", from: "2.0.0"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle.git", from: "2.6.0"),
        .package(url: "https://github.com/vapor/jwt-kit.git", from: "5.0.0"),
        .package(url: "https://github.com/vapor/postgres-nio.git", from: "1.21.0"),
        // Test-only: property-based tests (Swift Testing).
        .package(url: "https://github.com/x-sheep/swift-property-based.git", from: "2.0.0"),
    ],
    targets: [
        // Level 0: the primitives every layer shares (seeded random generators, the wall clock, Duration helpers,
        // the error shape, an async semaphore).
        .target(name: "OrchardSupport", swiftSettings: swiftSettings),
        // Level 0: SVG charts (axes with whole-number and 1-2-5 ticks, units, legends, stacked bars) drawn the same way
        // by the simulator's report.html and the coordinator's dashboard.
        .target(name: "OrchardCharts", swiftSettings: swiftSettings),
        // Level 0: file formats shared by every layer (safetensors, architecture JSON).
        .target(name: "OrchardFormats", dependencies: ["OrchardSupport"], swiftSettings: swiftSettings),
        // Level 1: the training engine, and its AVX2/FMA matrix kernels (C: compiled per function for those
        // instructions with target attributes, chosen at run time, so no unsafe flags).
        .target(name: "COrchardKernels"),
        .target(name: "OrchardML", dependencies: ["OrchardSupport", "OrchardFormats", "COrchardKernels"], swiftSettings: swiftSettings),
        // Level 2: data pipeline and federated partitions.
        .target(
            name: "OrchardData",
            dependencies: [
                "OrchardFormats", "OrchardSupport", "OrchardML",
                .product(name: "CompressNIO", package: "compress-nio"),
                .product(name: "NIOCore", package: "swift-nio"),
            ],
            // Its privacy manifest: the IDX cache reads file metadata (`stat`) in the app's container.
            resources: [.process("PrivacyInfo.xcprivacy")],
            swiftSettings: swiftSettings
        ),
        // Level 3: the seed's housing example (resources + reusable pipeline steps).
        .target(
            name: "OrchardExamples",
            dependencies: ["OrchardSupport", "OrchardFormats", "OrchardML", "OrchardData"],
            resources: [.copy("Resources")],
            swiftSettings: swiftSettings
        ),
        // Core ML interop (protobuf generated once and committed).
        .target(
            name: "OrchardCoreML",
            dependencies: ["OrchardSupport", "OrchardFormats", .product(name: "SwiftProtobuf", package: "swift-protobuf")],
            swiftSettings: swiftSettings
        ),
        // Background scheduling: the contract, the policy, device conditions, persistence.
        .target(
            name: "OrchardScheduler",
            dependencies: [
                "OrchardSupport",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: swiftSettings
        ),
        // Apple frameworks' stand-ins for Linux (see `appleShims`), and the simulated system's controls for tests.
        .target(name: "BackgroundTasksShim", path: "Sources/AppleShims/BackgroundTasks", swiftSettings: swiftSettings),
        .target(name: "CoreMLShim", path: "Sources/AppleShims/CoreML", swiftSettings: swiftSettings),
        .target(name: "UIKitShim", path: "Sources/AppleShims/UIKit", swiftSettings: swiftSettings),
        .target(name: "NetworkShim", path: "Sources/AppleShims/Network", swiftSettings: swiftSettings),
        .target(name: "OSLogShim", path: "Sources/AppleShims/OSLog", swiftSettings: swiftSettings),
        .target(name: "SwiftUIShim", dependencies: ["UIKitShim", "BackgroundTasksShim"], path: "Sources/AppleShims/SwiftUI", swiftSettings: swiftSettings),
        .target(
            name: "AppleShimTesting",
            dependencies: ["BackgroundTasksShim", "CoreMLShim", "UIKitShim", "NetworkShim", "OSLogShim"],
            path: "Sources/AppleShims/Testing", swiftSettings: swiftSettings
        ),
        // A LocalTrainer that trains with Core ML's MLUpdateTask.
        .target(
            name: "OrchardCoreMLTrainer",
            dependencies: [
                "OrchardClient", "OrchardCoreML", "OrchardML", "OrchardFormats", "OrchardSupport",
            ] + appleShimDependencies(["CoreML"]),
            swiftSettings: swiftSettings + appleFrameworks(["CoreML"])
        ),
        .target(
            name: "OrchardSchedulerApple",
            dependencies: [
                "OrchardSupport", "OrchardScheduler", .product(name: "Logging", package: "swift-log"),
            ] + appleShimDependencies(["BackgroundTasks", "UIKit", "Network", "os"]),
            swiftSettings: swiftSettings + appleFrameworks(["BackgroundTasks", "UIKit", "Network", "os"])
        ),
        // Privacy math without I/O: the RDP accountant, clipping, noise, and secure aggregation's stages (keys,
        // AEAD and stream ciphers from swift-crypto; the protocol logic is ours).
        .target(
            name: "OrchardPrivacy",
            dependencies: [
                "OrchardSupport",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "CryptoExtras", package: "swift-crypto"),
            ],
            swiftSettings: swiftSettings
        ),
        // Wire types shared by device and server.
        .target(name: "OrchardProtocol", dependencies: ["OrchardFormats", "OrchardPrivacy"], resources: [.copy("openapi.json")], swiftSettings: swiftSettings),
        // The federated-learning server.
        .target(
            name: "OrchardCoordinator",
            dependencies: [
                "OrchardSupport", "OrchardFormats", "OrchardProtocol", "OrchardPrivacy", "OrchardCharts", "OrchardCoreML", "OrchardML", "OrchardData",
                .product(name: "CoreMetrics", package: "swift-metrics"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "UnixSignals", package: "swift-service-lifecycle"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HummingbirdCore", package: "hummingbird"),
                .product(name: "HummingbirdTLS", package: "hummingbird"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "CryptoExtras", package: "swift-crypto"),
                .product(name: "JWTKit", package: "jwt-kit"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: swiftSettings
        ),
        // The coordinator's store in PostgreSQL, shared by several coordinator instances (the only target that
        // imports postgres-nio).
        .target(
            name: "OrchardCoordinatorPostgres",
            dependencies: [
                "OrchardCoordinator", "OrchardProtocol", "OrchardFormats", "OrchardSupport",
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
            ],
            swiftSettings: swiftSettings
        ),
        // The AsyncHTTPClient plumbing every Orchard HTTP client shares (device transport, Flower node, admin client):
        // trust roots, timeouts, answer limits, failures sorted into cancelled, TLS and network.
        .target(
            name: "OrchardHTTPClient",
            dependencies: [
                "OrchardSupport",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
            ],
            swiftSettings: swiftSettings
        ),
        // The device SDK (HTTP over AsyncHTTPClient, so a private CA can be trusted on every platform).
        .target(
            name: "OrchardClient",
            dependencies: [
                "OrchardSupport", "OrchardFormats", "OrchardML", "OrchardProtocol", "OrchardScheduler", "OrchardPrivacy", "OrchardHTTPClient",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
            ],
            // The SDK's privacy manifest (Apple's required-reason APIs it calls; no tracking, nothing collected by
            // the SDK itself): an app that links the SDK gets it in the SDK's resource bundle.
            resources: [.process("PrivacyInfo.xcprivacy")],
            swiftSettings: swiftSettings
        ),
        // The operator's side of the admin API (`orchard process`): the HTTP client, local checks of the files to host,
        // and the pure formatting of statuses and watch frames.
        .target(
            name: "OrchardOperator",
            dependencies: [
                "OrchardSupport", "OrchardFormats", "OrchardProtocol", "OrchardPrivacy", "OrchardHTTPClient",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
            ],
            swiftSettings: swiftSettings
        ),
        // An Orchard device as a Flower SuperNode: the Fleet API over protobuf HTTP (generated once from flwr's descriptors
        // and committed), Flower's content-addressed objects, and the node's round as a state machine.
        .target(
            name: "OrchardFlower",
            dependencies: [
                "OrchardSupport", "OrchardFormats", "OrchardML", "OrchardScheduler", "OrchardHTTPClient",
                .product(name: "SwiftProtobuf", package: "swift-protobuf"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
            ],
            swiftSettings: swiftSettings
        ),
        // The coordinator's core as the client's in-process coordinator (simulator, tests, single-process apps).
        .target(
            name: "OrchardInProcess",
            dependencies: ["OrchardClient", "OrchardCoordinator", "OrchardProtocol"],
            swiftSettings: swiftSettings
        ),
        // Fleet simulator.
        .target(
            name: "OrchardSimulation",
            dependencies: [
                "OrchardFormats", "OrchardSupport", "OrchardML", "OrchardData", "OrchardExamples", "OrchardScheduler", "OrchardProtocol",
                "OrchardCoordinator", "OrchardClient", "OrchardInProcess", "OrchardPrivacy", "OrchardCharts", "OrchardOperator",
                "OrchardHTTPClient",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "HeapModule", package: "swift-collections"),
            ],
            swiftSettings: swiftSettings
        ),
        // Test support shared by every test target (including a throwaway CA and server certificate for TLS tests).
        .target(
            name: "OrchardTesting",
            dependencies: [
                "OrchardSupport", "OrchardFormats", "OrchardProtocol",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "SwiftASN1", package: "swift-asn1"),
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "PropertyBased", package: "swift-property-based"),
            ],
            swiftSettings: swiftSettings
        ),
        // The loopback coordinator every test target that needs one on the wire starts (a real SQLite file, real HTTP or
        // HTTPS, an injected clock): test support that sits above the coordinator, as HummingbirdTesting does.
        .target(
            name: "OrchardCoordinatorTesting",
            dependencies: ["OrchardCoordinator", "OrchardSupport", .product(name: "Logging", package: "swift-log")],
            swiftSettings: swiftSettings
        ),
        // Benchmarks the CLI runs: the coordinator load generator (raw NIO connections), peak RSS, JSON lines.
        .target(
            name: "OrchardBenchmarks",
            dependencies: [
                "OrchardSupport", "OrchardCoordinator", "OrchardCoordinatorPostgres", "OrchardProtocol", "OrchardFormats", "OrchardPrivacy",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
            ],
            swiftSettings: swiftSettings
        ),
        .executableTarget(
            name: "orchard",
            dependencies: [
                "OrchardSupport", "OrchardFormats", "OrchardML", "OrchardData", "OrchardExamples", "OrchardCoreML",
                "OrchardScheduler", "OrchardProtocol", "OrchardCoordinator", "OrchardClient", "OrchardSimulation",
                "OrchardBenchmarks", "OrchardPrivacy", "OrchardCoordinatorPostgres", "OrchardOperator", "OrchardFlower", "OrchardHTTPClient",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "UnixSignals", package: "swift-service-lifecycle"),
            ],
            swiftSettings: swiftSettings
        ),
        // The iPhone app the README's "In an iOS app" quotes: compiled on Linux against the shims, on iOS against the SDK.
        .executableTarget(
            name: "OrchardExampleApp",
            dependencies: [
                "OrchardClient", "OrchardScheduler", "OrchardSchedulerApple", "OrchardData", "OrchardML", .product(name: "Logging", package: "swift-log"),
            ] + appleShimDependencies(["SwiftUI", "UIKit"]),
            path: "Examples/OrchardExampleApp",
            swiftSettings: swiftSettings + appleFrameworks(["SwiftUI", "UIKit"])
        ),
        .testTarget(
            name: "OrchardExampleAppTests",
            dependencies: [
                "OrchardCoordinatorTesting", "OrchardExampleApp", "OrchardClient", "OrchardCoordinator", "OrchardProtocol", "OrchardFormats", "OrchardML",
                "OrchardData",
                "OrchardSchedulerApple", "OrchardScheduler", "OrchardSupport",
                .target(name: "AppleShimTesting", condition: .when(platforms: [.linux])),
            ] + appleShimDependencies(["SwiftUI", "UIKit", "BackgroundTasks"]),
            swiftSettings: swiftSettings + appleFrameworks(["SwiftUI", "UIKit", "BackgroundTasks"])
        ),
        .testTarget(name: "OrchardSupportTests", dependencies: ["OrchardSupport", "OrchardTesting"], swiftSettings: swiftSettings),
        .testTarget(name: "OrchardChartsTests", dependencies: ["OrchardCharts"], swiftSettings: swiftSettings),
        // Flower interop: object encodings against bytes flwr wrote (Fixtures), and devices joining a real SuperLink.
        .testTarget(
            name: "OrchardFlowerTests",
            dependencies: [
                "OrchardFlower", "OrchardML", "OrchardFormats", "OrchardSupport", "OrchardTesting", "OrchardData",
                .product(name: "SwiftProtobuf", package: "swift-protobuf"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "PropertyBased", package: "swift-property-based"),
            ],
            exclude: ["FlowerApp"],  // the Flower app (Python) the tests run with `flwr run`
            resources: [.copy("Fixtures")],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "OrchardPrivacyTests",
            dependencies: [
                "OrchardPrivacy", "OrchardSupport", .product(name: "Crypto", package: "swift-crypto"), .product(name: "CryptoExtras", package: "swift-crypto"),
            ],
            exclude: ["Reference"],  // the dp-accounting script that computed the accountant's reference values
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "OrchardFormatsTests",
            dependencies: [
                "OrchardSupport", "OrchardProtocol", "OrchardFormats", "OrchardTesting", .product(name: "PropertyBased", package: "swift-property-based"),
            ], swiftSettings: swiftSettings),
        .testTarget(name: "OrchardMLTests", dependencies: ["OrchardSupport", "OrchardFormats", "OrchardML", "OrchardTesting"], swiftSettings: swiftSettings),
        .testTarget(
            name: "OrchardDataTests", dependencies: ["OrchardSupport", "OrchardML", "OrchardFormats", "OrchardData", "OrchardExamples", "OrchardTesting"],
            swiftSettings: swiftSettings),
        .testTarget(
            name: "OrchardCoreMLTests",
            dependencies: [
                "OrchardCoreML", "OrchardML", "OrchardTesting", "OrchardCoreMLTrainer", "OrchardClient", "OrchardFormats", "OrchardSupport",
                .product(name: "SwiftProtobuf", package: "swift-protobuf"),
                .target(name: "AppleShimTesting", condition: .when(platforms: [.linux])),
            ] + appleShimDependencies(["CoreML"]),
            exclude: ["Python"],  // coremltools cross-check scripts, run through python3 by the tests
            swiftSettings: swiftSettings + appleFrameworks(["CoreML"])
        ),
        .testTarget(
            name: "OrchardSchedulerTests",
            dependencies: [
                "OrchardScheduler", "OrchardSchedulerApple", "OrchardSupport",
                .product(name: "Logging", package: "swift-log"),
                .target(name: "AppleShimTesting", condition: .when(platforms: [.linux])),
            ] + appleShimDependencies(["BackgroundTasks", "UIKit", "Network", "os"]),
            swiftSettings: swiftSettings + appleFrameworks(["BackgroundTasks", "UIKit", "Network", "os"])
        ),
        .testTarget(
            name: "OrchardProtocolTests",
            dependencies: [
                "OrchardSupport", "OrchardPrivacy", "OrchardProtocol", "OrchardFormats", "OrchardTesting",
                .product(name: "PropertyBased", package: "swift-property-based"),
            ], swiftSettings: swiftSettings),
        .testTarget(
            name: "OrchardCoordinatorTests",
            dependencies: [
                "OrchardCoordinatorTesting", "OrchardFormats", "OrchardCoordinator", "OrchardProtocol", "OrchardPrivacy", "OrchardSupport", "OrchardTesting",
                "OrchardCoreML",
                "OrchardClient", "OrchardML", "OrchardData",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "JWTKit", package: "jwt-kit"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "CryptoExtras", package: "swift-crypto"),
                .product(name: "PropertyBased", package: "swift-property-based"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HummingbirdCore", package: "hummingbird"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ],
            swiftSettings: swiftSettings
        ),
        // One contract suite run against both stores (the PostgreSQL cases need ORCHARD_POSTGRES_URL).
        .testTarget(
            name: "OrchardCoordinatorPostgresTests",
            dependencies: [
                "OrchardCoordinator", "OrchardCoordinatorPostgres", "OrchardPrivacy", "OrchardProtocol", "OrchardFormats", "OrchardSupport", "OrchardTesting",
                "OrchardBenchmarks", "OrchardData", "OrchardML",
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "OrchardClientTests",
            dependencies: [
                "OrchardCoordinatorTesting", "OrchardScheduler", "OrchardProtocol", "OrchardPrivacy", "OrchardML", "OrchardClient", "OrchardCoordinator",
                "OrchardSupport", "OrchardFormats",
                "OrchardInProcess", "OrchardTesting", .product(name: "Crypto", package: "swift-crypto"),
            ], swiftSettings: swiftSettings),
        .testTarget(
            name: "OrchardBenchmarksTests",
            dependencies: [
                "OrchardCoordinatorTesting", "OrchardBenchmarks", "OrchardCoordinator", "OrchardProtocol",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ],
            swiftSettings: swiftSettings
        ),
        // `orchard process` and `orchard data prepare` against a coordinator on loopback (library calls and the executable).
        .testTarget(
            name: "OrchardOperatorTests",
            dependencies: [
                "OrchardCoordinatorTesting", "OrchardOperator", "OrchardCoordinator", "OrchardProtocol", "OrchardFormats", "OrchardML", "OrchardData",
                "OrchardSupport",
                "OrchardTesting",
            ],
            swiftSettings: swiftSettings
        ),
        // The `orchard` executable run as a child process: option parsing, help, one-line outputs.
        .testTarget(name: "OrchardCLITests", dependencies: ["OrchardTesting"], swiftSettings: swiftSettings),
        .testTarget(
            name: "OrchardSimulationTests",
            dependencies: [
                "OrchardTesting", "OrchardCoordinatorTesting", "OrchardML", "OrchardData", "OrchardSimulation", "OrchardPrivacy", "OrchardSupport",
                "OrchardCoordinator",
                "OrchardClient", "OrchardInProcess",
                "OrchardProtocol", "OrchardFormats", "OrchardOperator", .product(name: "Logging", package: "swift-log"),
            ], swiftSettings: swiftSettings),
    ]
)
