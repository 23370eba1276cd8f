import Foundation
import OrchardData
import OrchardProtocol
import Testing
@testable import OrchardSimulation

@Suite struct ConfigurationTests {
    @Test func parsesEveryChoice() throws {
        #expect(try DatasetChoice(parsing: "housing") == .housing)
        #expect(try DatasetChoice(parsing: "fashion-mnist") == .fashionMNIST)
        #expect(try DatasetChoice(parsing: "idx:/data/mnist") == .idx("/data/mnist"))
        #expect(try DatasetChoice(parsing: "idx:/data/mnist").imageDirectory == "/data/mnist")
        #expect(try ModelChoice(parsing: "CNN") == .cnn)
        #expect(try TransportChoice(parsing: "memory") == .memory)
        #expect(try PartitionStrategy(parsing: "iid") == .iid)
        #expect(try PartitionStrategy(parsing: "shards") == .labelShards(perClient: 2))
        #expect(try PartitionStrategy(parsing: "dirichlet:0.3") == .dirichlet(alpha: 0.3))
        #expect(try PartitionStrategy(parsing: "sampled:60") == .sampled(perClient: 60))
        #expect(try AggregatorConfig.Kind(parsing: "FedYogi") == .fedYogi)
        #expect(try Availability(parsing: "diurnal") == .diurnal)
    }

    @Test(arguments: ["csv", "idx:", "mnist"])
    func rejectsUnknownDatasets(_ text: String) {
        #expect(throws: SimulationError.self) { try DatasetChoice(parsing: text) }
    }

    @Test(arguments: ["dirichlet:0", "dirichlet:-1", "dirichlet:x", "shards:3", "noniid", "sampled:0", "sampled:-5", "sampled:x", "sampled:"])
    func rejectsBadPartitions(_ text: String) {
        #expect(throws: SimulationError.self) { try PartitionStrategy(parsing: text) }
    }

    @Test func rejectsMissingTraceFiles() {
        #expect(throws: SimulationError.self) { try Availability(parsing: "trace:/nonexistent/trace.csv") }
    }

    @Test func validationNamesTheFieldNotACommandLineOption() {
        func message(_ change: (inout SimulationConfiguration) -> Void) -> String? {
            var c = SimulationConfiguration.housing
            change(&c)
            do { try c.validate() } catch { return error.message }
            return nil
        }
        #expect(message { _ in } == nil)
        #expect(message { $0.clients = 0 }?.hasPrefix("clients ") == true)
        #expect(message { $0.fraction = 1.5 }?.hasPrefix("fraction ") == true)
        #expect(message { $0.dropout = -0.1 }?.hasPrefix("dropout ") == true)
        #expect(message { $0.windowSeconds = 0 }?.hasPrefix("windowSeconds ") == true)
        #expect(message { $0.secondsPerUpdate = 0 }?.hasPrefix("secondsPerUpdate ") == true)
        #expect(message { $0.learningRate = .nan }?.hasPrefix("learningRate ") == true)
        #expect(message { $0.model = .cnn }?.contains("does not fit") == true)
        let parseErrors: [SimulationError?] = [
            Self.error { () throws(SimulationError) in _ = try DatasetChoice(parsing: "csv") },
            Self.error { () throws(SimulationError) in _ = try ModelChoice(parsing: "gpt") },
            Self.error { () throws(SimulationError) in _ = try TransportChoice(parsing: "udp") },
            Self.error { () throws(SimulationError) in _ = try PartitionStrategy(parsing: "noniid") },
            Self.error { () throws(SimulationError) in _ = try AggregatorConfig.Kind(parsing: "sgd") },
            Self.error { () throws(SimulationError) in _ = try Availability(parsing: "weekly") },
        ]
        for error in parseErrors {
            #expect(error?.code == .invalidOption)
            #expect(error?.message.contains("--") == false, "\(String(describing: error))")
        }
    }

    private static func error(_ body: () throws(SimulationError) -> Void) -> SimulationError? {
        do { try body() } catch { return error }
        return nil
    }

    @Test func goalRoundsUp() {
        var c = SimulationConfiguration.images(.fashionMNIST)
        #expect(c.goal == 10)
        c.fraction = 0.001
        #expect(c.goal == 1)
    }
}
