public import Foundation
public import OrchardML

/// A text corpus as named documents, each in a group: the chapters of the King James Bible, grouped by book. The
/// grouping is a natural partition for federated learning: devices that hold one book, or one chapter, see text of
/// their own style (the way LEAF partitions Shakespeare by role).
public struct TextCorpus: Sendable, Hashable {
    /// One document.
    public struct Document: Sendable, Hashable {
        /// Its name (`Genesis 1`).
        public var name: String
        /// Its group (`Genesis`).
        public var group: String
        /// Its text.
        public var text: String

        /// Creates a document.
        public init(name: String, group: String, text: String) {
            (self.name, self.group, self.text) = (name, group, text)
        }
    }

    /// The documents in order.
    public var documents: [Document]

    /// Creates a corpus.
    public init(documents: [Document]) { self.documents = documents }

    /// The groups in order of first appearance.
    public var groups: [String] {
        var seen: Set<String> = []
        return documents.map(\.group).filter { seen.insert($0).inserted }
    }

    /// The King James Bible from the output of Debian's `bible` program (package `bible-kjv`, text in
    /// `bible-kjv-text`; the translation of 1611 is in the public domain): `bible -l0 gen1:1-rev22:21` prints each
    /// chapter as a heading line (`Genesis 1`) and its verses as lines starting with the verse number; a verse that
    /// wraps continues on lines without a number. Each chapter becomes a document (its verses joined by spaces) in the
    /// group of its book.
    /// - Throws: ``DataError`` `empty_data` when the text holds no chapter, `malformed_value` for verse text before the first heading.
    public static func kingJamesBible(parsing output: String) throws(DataError) -> TextCorpus {
        var documents: [Document] = []
        var verses: [String] = []
        var heading: (name: String, group: String)?
        func close() {
            if let heading, !verses.isEmpty {
                documents.append(Document(name: heading.name, group: heading.group, text: verses.joined(separator: " ")))
            }
            verses = []
        }
        for (number, raw) in output.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            let line = raw.trimmingCharacters(in: .whitespaces)
            guard !line.isEmpty else { continue }
            if !raw.hasPrefix(" "), let space = line.lastIndex(of: " "), Int(line[line.index(after: space)...]) != nil,
                line[..<space].contains(where: \.isLetter)
            {
                // A heading: the book's name and the chapter's number.
                close()
                heading = (line, String(line[..<space]))
                continue
            }
            guard heading != nil else {
                throw DataError(.malformedValue, "text before the first chapter heading: '\(line.prefix(40))'", line: number + 1)
            }
            let parts = line.split(separator: " ", maxSplits: 1)
            if raw.hasPrefix(" "), parts.count == 2, Int(parts[0]) != nil {
                verses.append(String(parts[1]))
            } else if !verses.isEmpty {
                verses[verses.count - 1] += " " + line
            } else {
                verses.append(line)
            }
        }
        close()
        guard !documents.isEmpty else { throw DataError(.emptyData, "the text holds no chapter (expected the output of `bible gen1:1-rev22:21`)") }
        return TextCorpus(documents: documents)
    }
}

/// The characters a next-character model reads and predicts, in a fixed order: index 0 is padding (input positions
/// past a sequence's end), index 1 stands for any character not in the list, then the characters. It travels with
/// the model as JSON (in the checkpoint's metadata under ``metadataKey``).
public struct CharacterVocabulary: Sendable, Hashable, Codable {
    /// The metadata key the vocabulary's JSON is stored under in a model's safetensors.
    public static let metadataKey = "orchard.vocabulary"
    /// The index of padding.
    public static let padding = 0
    /// The index of an unknown character.
    public static let unknown = 1

    /// The characters, from index 2 on.
    public private(set) var characters: [String]
    private var index: [Character: Int]

    enum CodingKeys: String, CodingKey { case characters, padding, unknown }

    /// A vocabulary of `characters` (each one character; duplicates are dropped, order kept).
    public init(characters: [Character]) {
        var seen: Set<Character> = []
        let unique = characters.filter { seen.insert($0).inserted }
        self.characters = unique.map(String.init)
        index = Dictionary(uniqueKeysWithValues: unique.enumerated().map { ($0.element, $0.offset + 2) })
    }

    /// The characters of `corpus` in code-point order (a character of several scalars, such as `e` with a combining
    /// accent or `\r\n`, by its scalars in turn, so the order never depends on a set's).
    public init(corpus: TextCorpus) {
        var all: Set<Character> = []
        for document in corpus.documents { all.formUnion(document.text) }
        self.init(characters: all.sorted { $0.unicodeScalars.map(\.value).lexicographicallyPrecedes($1.unicodeScalars.map(\.value)) })
    }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        let characters = try container.decode([String].self, forKey: .characters)
        guard characters.allSatisfy({ $0.count == 1 }) else {
            throw DecodingError.dataCorruptedError(forKey: .characters, in: container, debugDescription: "every entry must be one character")
        }
        guard Set(characters).count == characters.count else {
            throw DecodingError.dataCorruptedError(forKey: .characters, in: container, debugDescription: "characters repeat")
        }
        let padding = try container.decodeIfPresent(Int.self, forKey: .padding) ?? Self.padding
        let unknown = try container.decodeIfPresent(Int.self, forKey: .unknown) ?? Self.unknown
        guard padding == Self.padding, unknown == Self.unknown else {
            throw DecodingError.dataCorruptedError(forKey: .padding, in: container, debugDescription: "padding is 0 and unknown is 1")
        }
        self.init(characters: characters.map { $0.first! })
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(characters, forKey: .characters)
        try container.encode(Self.padding, forKey: .padding)
        try container.encode(Self.unknown, forKey: .unknown)
    }

    /// Symbols a model distinguishes: padding, unknown and the characters.
    public var size: Int { characters.count + 2 }

    /// The index of `character` (``unknown`` when it is not in the vocabulary).
    public func index(of character: Character) -> Int { index[character] ?? Self.unknown }

    /// The character at `index`, nil for padding, unknown or an index out of range.
    public func character(at index: Int) -> Character? {
        index >= 2 && index < size ? characters[index - 2].first : nil
    }

    /// The vocabulary as JSON (snake_case keys), as it travels in a model's metadata.
    public func json() -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return String(decoding: (try? encoder.encode(self)) ?? Data(), as: UTF8.self)
    }

    /// Reads the JSON ``json()`` writes.
    /// - Throws: ``DataError`` `unreadable` naming what is wrong.
    public static func decode(json: String) throws(DataError) -> CharacterVocabulary {
        do {
            return try JSONDecoder().decode(CharacterVocabulary.self, from: Data(json.utf8))
        } catch {
            throw DataError(.unreadable, "not a character vocabulary: \(error)")
        }
    }
}

/// Next-character sequences cut from a corpus: each document is encoded with a vocabulary and cut into windows of
/// `length` + 1 characters that start `length` apart; a window's first `length` characters are the input and its last
/// `length` the targets (each position predicts the next character). A document's last window is shorter: its input is
/// padded with index 0 and its targets with −1 (`CompiledModel.paddingTarget`), which the loss and the
/// metrics skip. Every sequence remembers its document, so the documents or their groups are a natural partition.
public struct NextCharacterSequences: Sendable {
    /// The vocabulary.
    public let vocabulary: CharacterVocabulary
    /// Characters per sequence.
    public let length: Int
    /// The inputs, `[count × length]` indices.
    public let inputs: [Float]
    /// The targets, `[count × length]` indices or −1.
    public let targets: [Float]
    /// Each sequence's document (its index in the corpus).
    public let documents: [Int]

    /// Cuts `corpus` into sequences of `length` characters.
    /// - Throws: ``DataError`` `invalid_argument` for a length below 2.
    public init(corpus: TextCorpus, vocabulary: CharacterVocabulary, length: Int) throws(DataError) {
        guard length >= 2 else { throw DataError(.invalidArgument, "a sequence needs at least 2 characters, not \(length)") }
        self.vocabulary = vocabulary
        self.length = length
        var inputs: [Float] = [], targets: [Float] = [], documents: [Int] = []
        for (number, document) in corpus.documents.enumerated() {
            let encoded = document.text.map { Float(vocabulary.index(of: $0)) }
            var start = 0
            while start + 1 < encoded.count {
                let end = min(start + length + 1, encoded.count)
                let window = encoded[start..<end]
                let used = window.count - 1
                inputs += window.prefix(used) + [Float](repeating: Float(CharacterVocabulary.padding), count: length - used)
                targets += window.dropFirst() + [Float](repeating: CompiledModel.paddingTarget, count: length - used)
                documents.append(number)
                start += length
            }
        }
        (self.inputs, self.targets, self.documents) = (inputs, targets, documents)
    }

    /// The number of sequences.
    public var count: Int { documents.count }

    /// The sequences `indices` as a dataset: input `name` `[count, length]` (categorical indices), targets `[count, length]`.
    public func dataset(_ indices: [Int], inputName: String = "chars") throws(DataError) -> TensorDataset {
        var x: [Float] = [], y: [Float] = []
        x.reserveCapacity(indices.count * length)
        y.reserveCapacity(indices.count * length)
        for i in indices {
            guard (0..<count).contains(i) else { throw DataError(.invalidArgument, "sequence \(i) is not in 0..<\(count)") }
            x += inputs[(i * length)..<((i + 1) * length)]
            y += targets[(i * length)..<((i + 1) * length)]
        }
        do throws(EngineError) {
            return try TensorDataset(
                inputs: [inputName: Tensor(shape: [indices.count, length], scalars: x)], targets: Tensor(shape: [indices.count, length], scalars: y))
        } catch {
            throw DataError(.sizeMismatch, error.message)
        }
    }

    /// A split of the sequences into training and held-out test sequences, and the training ones by owner: the
    /// last `testFraction` of each document's sequences (rounded down; none from a document of one sequence) are held
    /// out, and the rest belong to their document (`byGroup` false) or to their document's group (true), owners in order
    /// of first appearance. `tests` holds each owner's held-out sequences.
    public func naturalSplit(corpus: TextCorpus, byGroup: Bool, testFraction: Double) -> (owners: [[Int]], ownerNames: [String], tests: [[Int]]) {
        var perDocument: [[Int]] = Array(repeating: [], count: corpus.documents.count)
        for (index, document) in documents.enumerated() { perDocument[document].append(index) }
        var owners: [[Int]] = [], names: [String] = [], ownerOf: [String: Int] = [:], tests: [[Int]] = []
        for (number, sequences) in perDocument.enumerated() where !sequences.isEmpty {
            let held = Int(Double(sequences.count) * testFraction)
            let key = byGroup ? corpus.documents[number].group : corpus.documents[number].name
            if ownerOf[key] == nil {
                ownerOf[key] = owners.count
                owners.append([])
                tests.append([])
                names.append(key)
            }
            owners[ownerOf[key]!] += sequences.dropLast(held)
            tests[ownerOf[key]!] += sequences.suffix(held)
        }
        return (owners, names, tests)
    }
}
