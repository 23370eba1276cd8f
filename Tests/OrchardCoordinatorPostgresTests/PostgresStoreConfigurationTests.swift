import Foundation
import OrchardCoordinatorPostgres
import Testing

/// Database URLs: what parses, what is refused and how, and that the password never shows.
@Suite struct PostgresStoreConfigurationTests {
    @Test func aFullURLParses() throws {
        let configuration = try PostgresStoreConfiguration(
            url: "postgres://orchard:pa%3Ass%40word@db.example.org:6543/fl?sslmode=verify-full&sslrootcert=/etc/orchard/ca.pem&pool_size=16&connect_timeout=3")
        #expect(configuration.host == "db.example.org")
        #expect(configuration.port == 6543)
        #expect(configuration.user == "orchard")
        #expect(configuration.password == "pa:ss@word")
        #expect(configuration.database == "fl")
        #expect(configuration.tlsMode == .verifyFull)
        #expect(configuration.rootCertificatePath == "/etc/orchard/ca.pem")
        #expect(configuration.poolSize == 16)
        #expect(configuration.connectTimeout == .seconds(3))
    }

    @Test func defaultsApply() throws {
        let configuration = try PostgresStoreConfiguration(url: "postgresql://orchard@localhost/orchard")
        #expect(configuration.port == 5432)
        #expect(configuration.password == nil)
        #expect(configuration.tlsMode == .prefer)
        #expect(configuration.rootCertificatePath == nil)
        #expect(configuration.poolSize == PostgresStoreConfiguration.defaultPoolSize)
        #expect(configuration.spoolDirectory == nil)
    }

    @Test func anIPv6HostParses() throws {
        let configuration = try PostgresStoreConfiguration(url: "postgres://u:p@[::1]:5433/d?sslmode=disable")
        #expect(configuration.host == "::1" && configuration.port == 5433 && configuration.tlsMode == .disable)
        #expect(configuration.description == "postgres://u:***@[::1]:5433/d?sslmode=disable")
    }

    @Test(arguments: PostgresStoreConfiguration.TLSMode.allCases)
    func everySSLModeParses(_ mode: PostgresStoreConfiguration.TLSMode) throws {
        #expect(try PostgresStoreConfiguration(url: "postgres://u@h/d?sslmode=\(mode.rawValue)").tlsMode == mode)
    }

    @Test func aSeparatePasswordReplacesTheURLs() throws {
        #expect(try PostgresStoreConfiguration(url: "postgres://u:old@h/d", password: "from-env").password == "from-env")
        #expect(try PostgresStoreConfiguration(url: "postgres://u@h/d", password: "from-file").password == "from-file")
        #expect(try PostgresStoreConfiguration(url: "postgres://u:kept@h/d", password: nil).password == "kept")
    }

    @Test func theDescriptionRedactsThePassword() throws {
        let configuration = try PostgresStoreConfiguration(url: "postgres://orchard:hunter2-secret@db:5432/fl?sslmode=require")
        #expect(configuration.description == "postgres://orchard:***@db:5432/fl?sslmode=require")
        #expect(!"\(configuration)".contains("hunter2-secret"))
        #expect(!String(reflecting: configuration).contains("hunter2-secret"))
        var dumped = ""
        dump(configuration, to: &dumped)
        #expect(!dumped.contains("hunter2-secret"))
        #expect(try PostgresStoreConfiguration(url: "postgres://orchard@db/fl").description == "postgres://orchard@db:5432/fl?sslmode=prefer")
    }

    /// Each bad URL is refused with a message that names the problem (and never the password).
    @Test(arguments: [
        ("localhost:5432/orchard", "must start with postgres:// or postgresql://"),
        ("mysql://u:secretpw@h/d", "scheme is 'mysql'"),
        ("postgres://u:secretpw@/d", "names no host"),
        ("postgres://u:secretpw@:5432/d", "names no host"),
        ("postgres://h/d", "names no user"),
        ("postgres://:secretpw@h/d", "names no user"),
        ("postgres://u:secretpw@h:abc/d", "port 'abc' is not a number between 1 and 65535"),
        ("postgres://u:secretpw@h:0/d", "port '0'"),
        ("postgres://u:secretpw@h:70000/d", "port '70000'"),
        ("postgres://u:secretpw@h:5432", "names no database"),
        ("postgres://u:secretpw@h/", "names no database"),
        ("postgres://u:secretpw@h/d/e", "not a single database name"),
        ("postgres://u:secretpw@h/d?sslmode=verify-ca", "unknown sslmode 'verify-ca'"),
        ("postgres://u:secretpw@h/d?sslmode=", "unknown sslmode ''"),
        ("postgres://u:secretpw@h/d?application_name=x", "unknown parameter 'application_name'"),
        ("postgres://u:secretpw@h/d?sslmode", "is not name=value"),
        ("postgres://u:secretpw@h/d?pool_size=0", "pool_size '0'"),
        ("postgres://u:secretpw@h/d?connect_timeout=-1", "connect_timeout '-1'"),
        ("postgres://u:secretpw@h/d?sslmode=require&sslmode=disable", "sets 'sslmode' twice"),
        ("postgres://u:secretpw@h/d?sslmode=require&sslrootcert=/ca.pem", "sslrootcert is used only with sslmode=verify-full"),
        ("postgres://u:secretpw@[::1/d", "no closing ']'"),
        ("postgres://u:secretpw@a,b/d", "several hosts"),
    ])
    func aBadURLIsRefusedClearly(_ url: String, _ expected: String) throws {
        let error = try #require(throws: PostgresURLError.self) { try PostgresStoreConfiguration(url: url) }
        #expect(error.message.contains(expected), "\(error.message)")
        #expect(!error.message.contains("secretpw"))
        #expect("\(error)".hasPrefix("invalid_url: "))
    }
}
