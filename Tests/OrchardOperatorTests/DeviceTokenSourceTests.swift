import Foundation
import OrchardOperator
import Testing

/// The device's JWT is taken from a file or the environment, one way only; on the command line it still works but is
/// warned about (every local user can read a process's arguments).
@Suite final class DeviceTokenSourceTests {
    let directory = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-device-token-\(UUID().uuidString)")
    deinit { try? FileManager.default.removeItem(at: directory) }

    func file(_ text: String, mode: Int) throws -> String {
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let path = directory.appendingPathComponent(UUID().uuidString).path
        try Data(text.utf8).write(to: URL(fileURLWithPath: path))
        try FileManager.default.setAttributes([.posixPermissions: mode], ofItemAtPath: path)
        return path
    }

    @Test func eachSourceGivesTheTokenAndOnlyTheRiskyOnesAreWarnedAbout() throws {
        let privateFile = try file("eyJ.a.b\n", mode: 0o600)
        let fromFile = try DeviceTokenSource.resolve(file: privateFile, environment: nil, argument: nil)
        #expect(fromFile.token == "eyJ.a.b" && fromFile.warnings.isEmpty)
        let readable = try file("eyJ.a.b", mode: 0o644)
        #expect(try DeviceTokenSource.resolve(file: readable, environment: nil, argument: nil).warnings.first?.contains("chmod 600") == true)
        let fromEnvironment = try DeviceTokenSource.resolve(file: nil, environment: " eyJ.c.d ", argument: nil)
        #expect(fromEnvironment.token == "eyJ.c.d" && fromEnvironment.warnings.isEmpty)
        let fromArgument = try DeviceTokenSource.resolve(file: nil, environment: nil, argument: "eyJ.e.f")
        #expect(fromArgument.token == "eyJ.e.f")
        #expect(fromArgument.warnings.first?.contains("--token is deprecated") == true)
        #expect(fromArgument.warnings.first?.contains("eyJ.e.f") == false, "the token itself is never shown")
        #expect(try DeviceTokenSource.resolve(file: nil, environment: nil, argument: nil).token == nil)
    }

    @Test func twoSourcesOrAnUnusableTokenAreRefusedWithoutShowingIt() throws {
        let path = try file("secret-value", mode: 0o600)
        for (file, environment, argument) in [(path, "secret-value", nil), (nil, "secret-value", "secret-value"), (path, nil, "secret-value")]
            as [(String?, String?, String?)]
        {
            do {
                _ = try DeviceTokenSource.resolve(file: file, environment: environment, argument: argument)
                Issue.record("a token given two ways was taken")
            } catch {
                #expect(error.code == .conflictingSources && !error.message.contains("secret-value"), "\(error.message)")
            }
        }
        for text in ["", "  \n", "two words"] {
            #expect(throws: AdminTokenError.self) { try DeviceTokenSource.resolve(file: nil, environment: text, argument: nil) }
        }
        #expect(throws: AdminTokenError.self) { try DeviceTokenSource.resolve(file: "/nonexistent/device.jwt", environment: nil, argument: nil) }
    }
}
