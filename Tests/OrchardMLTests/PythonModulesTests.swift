import OrchardTesting
import Testing

/// The condition trait that skips Python cross-checks when their packages are missing, or fails them under
/// `ORCHARD_REQUIRE_PYTHON=1`.
@Suite struct PythonModulesTests {
    /// A module no Python installation has.
    static let absent = "orchard_no_such_module_\(UInt32.random(in: 0...UInt32.max))"

    @Test func aMissingModuleDisablesTheTestWithTheInstallCommand() async throws {
        let missing = PythonModules.missing(["sys", Self.absent])
        #expect(missing.map(\.module).contains(Self.absent))
        #expect(!PythonModules.available([Self.absent]))
        let trait = PythonModules.requirement([Self.absent], environment: [:])
        #expect(try await trait.evaluate() == false)
        let reason = trait.comments.map(\.rawValue).joined()
        #expect(reason.contains(Self.absent))
        #expect(reason.contains("pip install \(Self.absent)"))
        #expect(reason.contains("ORCHARD_REQUIRE_PYTHON=1"))
    }

    @Test func requiredPythonKeepsTheTestEnabledAndAMissingModuleFailsIt() async throws {
        let trait = PythonModules.requirement([Self.absent], environment: ["ORCHARD_REQUIRE_PYTHON": "1"])
        #expect(try await trait.evaluate() == true)
        #expect(!PythonModules.isRequired(in: ["ORCHARD_REQUIRE_PYTHON": "0"]))
        // The failure names the module and how to install it.
        let error = #expect(throws: PythonModules.Unavailable.self) { try PythonModules.require(["sys", Self.absent]) }
        #expect(error?.missing.map(\.module) == [Self.absent])
        #expect(error?.description.contains("pip install \(Self.absent)") == true)
    }

    @Test func aNameThatIsNotAModuleIsNeverRunThroughPython() {
        let missing = PythonModules.missing(["os; import shutil"])
        #expect(missing.first?.reason == "not a Python module name")
    }

    @Test(.enabled(if: PythonModules.available(["sys"]), "python3 is not installed"))
    func aStandardModuleImports() {
        #expect(PythonModules.missing(["json", "sys"]).isEmpty)
    }
}
