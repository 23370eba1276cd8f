import Foundation
import OrchardData
import OrchardFormats
import OrchardML
import OrchardProtocol
@testable import OrchardSimulation
import OrchardSupport
import OrchardTesting
import Testing

/// The King James Bible from Debian's `bible-kjv` as a federated next-character task: the installed text parses into
/// its 1,189 chapters and 66 books, and a short simulation trains the char-lstm model across chapters, carrying the
/// vocabulary in the model's weights and reporting accuracy and perplexity.
@Suite(SystemDatasets.requirement(file: KingJamesBible.program, package: "bible-kjv"), .serialized)
struct TextSimulationTests {
    @Test func theInstalledTextHasEveryChapterAndBook() throws {
        let corpus = try KingJamesBible.corpus()
        #expect(corpus.documents.count == KingJamesBible.chapters)
        #expect(corpus.groups.count == KingJamesBible.books)
        #expect(corpus.documents.first?.name == "Genesis 1" && corpus.documents.last?.name == "Revelation 22")
        #expect(corpus.documents[0].text.hasPrefix("In the beginning God created the heaven and the earth."))
        let task = try TextTask(corpus: corpus, length: 80, partition: .book, devices: nil)
        #expect(task.devices.count == KingJamesBible.books && task.deviceNames.first == "Genesis")
        #expect(throws: DataError.self) { _ = try TextTask(corpus: corpus, length: 80, partition: .book, devices: 67) }
    }

    @Test func aShortFederatedRunOverChaptersLearnsAndCarriesTheVocabulary() async throws {
        var configuration = SimulationConfiguration.text()
        // 30 chapters, 6 a round, short sequences: a few seconds of training in a debug build.
        configuration.clients = 30
        configuration.fraction = 0.2
        configuration.localEpochs = 2
        configuration.learningRate = 4
        configuration.rounds = 3
        configuration.sequenceLength = 20
        configuration.transport = .memory
        configuration.output = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-text-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: configuration.output!) }
        let prepared = try SimulationRunner.prepare(configuration, progress: ProgressDisplay(interactive: false) { _ in })
        let process = try SimulationRunner.hostedProcess(configuration, model: prepared.model, workload: prepared.workload)
        let metadata = try Safetensors.decode(process.initialWeights).metadata
        let vocabulary = try CharacterVocabulary.decode(json: try #require(metadata[CharacterVocabulary.metadataKey]))
        #expect(prepared.model.outputShape == [20, vocabulary.size])
        let result = try await SimulationRunner.run(configuration, progress: ProgressDisplay(interactive: false) { _ in }, clock: ManualClock())
        #expect(result.summary.aggregatedRounds == 3)
        let initial = try #require(result.summary.initial.perplexity), final = try #require(result.summary.final.perplexity)
        #expect(final < initial, "perplexity falls: \(initial) → \(final)")
        #expect(final < Double(vocabulary.size), "better than guessing uniformly")
        #expect(result.rounds.allSatisfy { $0.testPerplexity != nil && $0.testAccuracy != nil })
        #expect(result.summary.settings["partition"] == "natural(chapter)")
    }

    @Test func badTextOptionsAreRefused() {
        var configuration = SimulationConfiguration.text()
        configuration.model = .mlp2nn
        #expect(throws: SimulationError.self) { try configuration.validate() }
        configuration = SimulationConfiguration.text()
        configuration.sequenceLength = 1
        #expect(throws: SimulationError.self) { try configuration.validate() }
        configuration = SimulationConfiguration.text()
        configuration.attack = AttackConfiguration(fraction: 0.1, kind: .labelFlip)
        #expect(throws: SimulationError.self) { try configuration.validate() }
    }
}

/// The text task's checks that need no installed corpus.
@Suite struct TextTaskTests {
    /// Two chapters of a few long sequences each hold out nothing (a tenth, rounded down): refused with what to change,
    /// instead of a test set of nothing reported as loss 0 and accuracy 0 every round.
    @Test func devicesThatHoldOutNoTestSequenceAreRefused() throws {
        let text = String(repeating: "In the beginning God created the heaven and the earth. ", count: 4)
        let corpus = TextCorpus(documents: [
            TextCorpus.Document(name: "Genesis 1", group: "Genesis", text: text), TextCorpus.Document(name: "Genesis 2", group: "Genesis", text: text),
        ])
        #expect {
            try TextTask(corpus: corpus, length: 50, partition: .chapter, devices: nil)
        } throws: { ($0 as? DataError)?.message.contains("hold out no test sequence") == true }
        // Short sequences: each chapter has ten or more, and holds one out.
        let task = try TextTask(corpus: corpus, length: 10, partition: .chapter, devices: nil)
        #expect(task.test.count >= 2 && task.devices.count == 2)
    }
}
