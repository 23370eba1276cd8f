import OrchardSupport
import Foundation
import OrchardData
import OrchardML
import Testing

@Suite("Preprocessing")
struct PreprocessingTests {
    @Test("z-score uses the sample standard deviation")
    func sampleStandardDeviation() throws {
        // Mean 5; squared deviations sum to 32; sample variance 32/7 (the population variance would be 4).
        let s = try Standardizer(fitting: [[2, 4, 4, 4, 5, 5, 7, 9]])
        #expect(s.means == [5])
        #expect(abs(s.standardDeviations[0] - (32.0 / 7).squareRoot()) < 1e-12)
        #expect(abs(s.transform(9, column: 0) - 4 / (32.0 / 7).squareRoot()) < 1e-12)
        #expect(abs(s.inverse(s.transform(3.3, column: 0), column: 0) - 3.3) < 1e-12)
    }

    @Test("a constant column is centred, not divided by zero")
    func zeroVariance() throws {
        let s = try Standardizer(fitting: [[3, 3, 3], [1, 2, 3]])
        #expect(s.standardDeviations == [0, 1])
        #expect(s.transform(3, column: 0) == 0)
        #expect(s.transform(5, column: 0) == 2)
        #expect(s.transform(3, column: 1) == 1)
    }

    @Test("a standard deviation needs two values")
    func tooFewValues() {
        #expect { try Standardizer(fitting: [[1]]) } throws: { ($0 as? DataError)?.code == .tooFewSamples }
    }

    @Test("categories are indexed in numeric order when all are numbers, else lexicographically")
    func ordinalOrder() throws {
        let rad = try OrdinalEncoder(fitting: ["24", "1", "8", "1", "2"])
        #expect(rad.categories == ["1", "2", "8", "24"])
        #expect(try rad.encode("24") == 3)
        #expect(try rad.encode(["2", "1"]) == [1, 0])
        #expect(rad.vocabularySize == 4)
        let text = try OrdinalEncoder(fitting: ["pear", "apple", "fig"])
        #expect(text.categories == ["apple", "fig", "pear"])
        // Equal values ("1" and "01") by their text, NaN last: the order never follows the set's, which varies by run.
        for _ in 0..<20 {
            let tied = try OrdinalEncoder(fitting: ["2", "1", "NaN", "01", "-1", "1.0"])
            #expect(tied.categories == ["-1", "01", "1", "1.0", "2", "NaN"])
        }
    }

    @Test("an unseen category throws, or maps to the reserved index")
    func unknownCategory() throws {
        let strict = try OrdinalEncoder(fitting: ["0", "1"])
        #expect { try strict.encode("7") } throws: { ($0 as? DataError)?.code == .unknownCategory }
        let lenient = try OrdinalEncoder(fitting: ["0", "1"], unknownPolicy: .reservedIndex)
        #expect(try lenient.encode("7") == 2)
        #expect(try lenient.encode("1") == 1)
        #expect(lenient.vocabularySize == 3)
    }

    @Test("numeric categories are matched by value, not spelling")
    func numericCategoryLabels() throws {
        let table = try TabularReader().read(text: "c\n1\n1.0\n24\n")
        #expect(try table.categories("c") == ["1", "1", "24"])
        #expect(Table.categoryLabel(0.5) == "0.5")
    }

    @Test("the preprocessor is fitted on training rows and applies the same transform to new rows")
    func preprocessor() throws {
        let train = try TabularReader().read(text: "x,y,cat,t\n1,10,5,100\n3,10,7,200\n5,10,5,300\n")
        let p = try TabularPreprocessor(fitting: train, numeric: ["x", "y"], categorical: ["cat"], target: "t")
        // x: mean 3, sample sd 2. y: constant 10, centred only.
        #expect(p.standardizer.means == [3, 10])
        #expect(p.standardizer.standardDeviations == [2, 0])
        #expect(p.inputSpecs == [FeatureSpec(name: "numeric", shape: [2]), FeatureSpec(name: "cat", shape: [1])])
        #expect(try p.vocabularySize(of: "cat") == 2)

        let device = try TabularReader().read(text: "x,y,cat,t\n7,12,7,42\n")
        let data = try p.transform(device)
        #expect(data.count == 1)
        #expect(read(data, input: "numeric", sample: 0) == [2, 2])  // (7 − 3) / 2, (12 − 10) / 1
        #expect(read(data, input: "cat", sample: 0) == [1])
        #expect(readTarget(data, sample: 0) == [42])

        let unseen = try TabularReader().read(text: "x,y,cat,t\n7,12,9,42\n")
        #expect { try p.transform(unseen) } throws: { ($0 as? DataError)?.code == .unknownCategory }
    }

    @Test("the preprocessor round-trips through JSON")
    func preprocessorJSON() throws {
        let train = try TabularReader(configuration: .init(textColumns: ["cat"])).read(text: "x,cat,t\n1,a,1\n2,b,2\n4,a,3\n")
        let p = try TabularPreprocessor(fitting: train, numeric: ["x"], categorical: ["cat"], target: "t", unknownCategories: .reservedIndex)
        let decoded = try TabularPreprocessor.decode(json: try p.jsonData())
        #expect(decoded == p)
        #expect(try decoded.vocabularySize(of: "cat") == 3)
        #expect { try TabularPreprocessor.decode(json: Data("{}".utf8)) } throws: { ($0 as? DataError)?.code == .unreadable }
    }

    @Test("a category training never saw is reported with its row, then encoded as the reserved index")
    func unseenCategoriesAreReported() throws {
        let train = try TabularReader(configuration: .init(textColumns: ["cat"])).read(text: "x,cat,t\n1,a,1\n2,b,2\n4,a,3\n")
        let p = try TabularPreprocessor(fitting: train, numeric: ["x"], categorical: ["cat"], target: "t", unknownCategories: .reservedIndex)
        var unseen: [TabularPreprocessor.UnseenCategory] = []
        let data = try p.deviceData(csvText: "x,cat,t\n1,a,1\n2,zz,2\n3,b,1\n4,q,0\n") { unseen.append($0) }
        #expect(unseen == [.init(row: 2, column: "cat", value: "zz"), .init(row: 4, column: "cat", value: "q")])
        #expect(data.count == 4)
        // Under the strict policy nothing is reported: encoding refuses the value instead.
        let strict = try TabularPreprocessor(fitting: train, numeric: ["x"], categorical: ["cat"], target: "t")
        var told = 0
        #expect(throws: DataError.self) { try strict.deviceData(csvText: "x,cat,t\n2,zz,2\n") { _ in told += 1 } }
        #expect(told == 0)
    }

    @Test("a numeric category reads 1.0 as 1, and NA or an empty field as unseen, not as a malformed number")
    func numericCategoriesInDeviceRows() throws {
        let train = try TabularReader().read(text: "x,rad,t\n1,1,1\n2,24,2\n4,1,3\n")
        let p = try TabularPreprocessor(fitting: train, numeric: ["x"], categorical: ["rad"], target: "t", unknownCategories: .reservedIndex)
        var unseen: [TabularPreprocessor.UnseenCategory] = []
        let data = try p.deviceData(csvText: "x,rad,t\n1,1.0,1\n2,NA,2\n3,,1\n4,2.4e1,0\n5,7,1\n") { unseen.append($0) }
        #expect(unseen.map(\.value) == ["NA", "", "7"] && unseen.map(\.row) == [2, 3, 5])
        #expect(data.count == 5)
        let rad = try #require(data.inputs[data.inputSpecs.firstIndex { $0.name == "rad" }!])
        let reserved = rad.scalars[1]
        #expect(rad.scalars[0] == 0 && rad.scalars[3] == 1 && rad.scalars[2] == reserved && rad.scalars[4] == reserved && reserved != 0 && reserved != 1)
        // A value a 32-bit float cannot hold is refused, naming the row, instead of written as infinity.
        #expect { try p.deviceData(csvText: "x,rad,t\n1e39,1,1\n") } throws: { ($0 as? DataError)?.message.contains("row 1") == true }
        #expect { try p.deviceData(csvText: "x,rad,t\n1,1,-1e40\n") } throws: { ($0 as? DataError)?.message.contains("row 1: t") == true }
    }

    @Test("a column cannot be both a feature and the target")
    func overlappingColumns() throws {
        let train = try TabularReader().read(text: "x,t\n1,1\n2,2\n")
        #expect(throws: DataError.self) { try TabularPreprocessor(fitting: train, numeric: ["x", "t"], categorical: [], target: "t") }
    }

    @Test("train/test split is a seeded partition of the rows", arguments: [0.2, 0.5, 0.9])
    func split(testFraction: Double) throws {
        var g1 = OrchardRandom(seed: 7)
        var g2 = OrchardRandom(seed: 7)
        var g3 = OrchardRandom(seed: 8)
        let a = try TrainTestSplit(count: 50, testFraction: testFraction, using: &g1)
        let b = try TrainTestSplit(count: 50, testFraction: testFraction, using: &g2)
        let c = try TrainTestSplit(count: 50, testFraction: testFraction, using: &g3)
        #expect(a == b)
        #expect(a != c)
        #expect(a.test.count == Int((50 * testFraction).rounded()))
        #expect((a.train + a.test).sorted() == Array(0..<50))
    }

    @Test("a split that would leave a side empty is rejected")
    func degenerateSplit() {
        var g = OrchardRandom(seed: 1)
        #expect(throws: DataError.self) { try TrainTestSplit(count: 3, testFraction: 0.1, using: &g) }
        #expect(throws: DataError.self) { try TrainTestSplit(count: 10, testFraction: 1, using: &g) }
    }
}

func read(_ data: some Dataset, input: Int, sample: Int) -> [Float] {
    var out = [Float](repeating: .nan, count: data.inputSpecs[input].elementCount)
    out.withUnsafeMutableBufferPointer { data.copyInput(input, of: sample, into: $0) }
    return out
}

func read(_ data: some Dataset, input name: String, sample: Int) -> [Float] {
    read(data, input: data.inputSpecs.firstIndex { $0.name == name }!, sample: sample)
}

func readTarget(_ data: some Dataset, sample: Int) -> [Float] {
    var out = [Float](repeating: .nan, count: data.targetSpec.elementCount)
    out.withUnsafeMutableBufferPointer { data.copyTarget(of: sample, into: $0) }
    return out
}
