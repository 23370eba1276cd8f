import Foundation
import OrchardData
import OrchardML
import Testing

/// The text corpus: the `bible` program's output parsed into chapters and books, the character vocabulary and its
/// JSON, next-character sequences with their padding, and the natural split by chapter or book.
@Suite struct TextCorpusTests {
    static let sample = """

        Genesis 1

          1 In the beginning God created the heaven and the earth.
          2 And the earth was without form, and void.

        Genesis 2

          1 Thus the heavens and the earth were finished.

        1 John 1

          1 That which was from the beginning,
        which we have heard.
        """

    @Test func theProgramsOutputBecomesChaptersGroupedByBook() throws {
        let corpus = try TextCorpus.kingJamesBible(parsing: Self.sample)
        #expect(corpus.documents.map(\.name) == ["Genesis 1", "Genesis 2", "1 John 1"])
        #expect(corpus.groups == ["Genesis", "1 John"])
        #expect(corpus.documents[0].text == "In the beginning God created the heaven and the earth. And the earth was without form, and void.")
        #expect(corpus.documents[2].text == "That which was from the beginning, which we have heard.", "a wrapped verse is joined")
    }

    @Test func textThatIsNotTheProgramsOutputIsRefused() {
        #expect(throws: DataError.self) { _ = try TextCorpus.kingJamesBible(parsing: "") }
        #expect(throws: DataError.self) { _ = try TextCorpus.kingJamesBible(parsing: "  1 a verse before any chapter\n") }
    }

    @Test func theVocabularyIndexesCharactersAfterPaddingAndUnknownAndRoundTripsThroughJSON() throws {
        let corpus = try TextCorpus.kingJamesBible(parsing: Self.sample)
        let vocabulary = CharacterVocabulary(corpus: corpus)
        #expect(vocabulary.characters.first == " ", "code-point order: the space first")
        #expect(vocabulary.index(of: " ") == 2 && vocabulary.index(of: "Z") == CharacterVocabulary.unknown)
        #expect(vocabulary.character(at: vocabulary.index(of: "G")) == "G" && vocabulary.character(at: 0) == nil)
        // Characters of several scalars sort by their scalars in turn after the one they start with, never by a set's
        // order: "\r" before "\r\n", "e" before "e" with a combining acute.
        let mixed = TextCorpus(documents: [TextCorpus.Document(name: "a 1", group: "a", text: "e\u{301}\r\ne\rx")])
        for _ in 0..<20 {
            #expect(CharacterVocabulary(corpus: mixed).characters.map { Array($0.unicodeScalars) } == [["\r"], ["\r", "\n"], ["e"], ["e", "\u{301}"], ["x"]])
        }
        let decoded = try CharacterVocabulary.decode(json: vocabulary.json())
        #expect(decoded == vocabulary && decoded.size == vocabulary.size)
        #expect(vocabulary.json().contains("\"padding\":0") && vocabulary.json().contains("\"unknown\":1"))
        for bad in [#"{"characters":["ab"]}"#, #"{"characters":["a","a"]}"#, #"{"characters":["a"],"padding":3}"#, "[]"] {
            #expect(throws: DataError.self, "\(bad)") { _ = try CharacterVocabulary.decode(json: bad) }
        }
    }

    @Test func sequencesPredictTheNextCharacterAndPadTheLastWindow() throws {
        let corpus = TextCorpus(documents: [TextCorpus.Document(name: "A 1", group: "A", text: "abcdefg")])
        let vocabulary = CharacterVocabulary(characters: Array("abcdefg"))
        let sequences = try NextCharacterSequences(corpus: corpus, vocabulary: vocabulary, length: 4)
        // "abcd" → "bcde"; "efg" (3 characters left) → "fg", padded.
        #expect(sequences.count == 2 && sequences.documents == [0, 0])
        let a = Float(vocabulary.index(of: "a"))
        #expect(Array(sequences.inputs[0..<4]) == [a, a + 1, a + 2, a + 3])
        #expect(Array(sequences.targets[0..<4]) == [a + 1, a + 2, a + 3, a + 4])
        #expect(Array(sequences.inputs[4..<8]) == [a + 4, a + 5, 0, 0])
        #expect(Array(sequences.targets[4..<8]) == [a + 5, a + 6, -1, -1])
        let dataset = try sequences.dataset([1])
        #expect(dataset.count == 1 && dataset.targets.shape == [1, 4])
        #expect(throws: DataError.self) { _ = try sequences.dataset([2]) }
        #expect(throws: DataError.self) { _ = try NextCharacterSequences(corpus: corpus, vocabulary: vocabulary, length: 1) }
    }

    @Test func theNaturalSplitHoldsOutTheEndOfEachChapterAndGroupsByBookOnRequest() throws {
        let corpus = TextCorpus(documents: [
            TextCorpus.Document(name: "A 1", group: "A", text: String(repeating: "ab", count: 20)),
            TextCorpus.Document(name: "A 2", group: "A", text: String(repeating: "ba", count: 20)),
            TextCorpus.Document(name: "B 1", group: "B", text: "abab"),
        ])
        let sequences = try NextCharacterSequences(corpus: corpus, vocabulary: CharacterVocabulary(characters: ["a", "b"]), length: 4)
        // 40 characters: 10 sequences each (the last one a single step); "abab": 1.
        #expect(sequences.documents == Array(repeating: 0, count: 10) + Array(repeating: 1, count: 10) + [2])
        let chapters = sequences.naturalSplit(corpus: corpus, byGroup: false, testFraction: 0.2)
        #expect(chapters.ownerNames == ["A 1", "A 2", "B 1"])
        #expect(chapters.owners[0] == Array(0..<8) && chapters.owners[2] == [20])
        #expect(chapters.tests == [[8, 9], [18, 19], []])
        let books = sequences.naturalSplit(corpus: corpus, byGroup: true, testFraction: 0.2)
        #expect(books.ownerNames == ["A", "B"] && books.owners[0] == Array(0..<8) + Array(10..<18))
        #expect(books.tests == [[8, 9, 18, 19], []])
    }
}
