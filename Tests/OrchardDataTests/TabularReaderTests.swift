import Foundation
import OrchardData
import Testing

@Suite("Tabular reader")
struct TabularReaderTests {
    @Test("reads a CSV file with a header, numbers and a text column")
    func csvWithHeader() throws {
        let text = "a,b,kind\n1,2.5,x\n-3,1e2,\"y, z\"\n"
        let table = try TabularReader(configuration: .init(textColumns: ["kind"])).read(text: text)
        #expect(table.columnNames == ["a", "b", "kind"])
        #expect(table.rowCount == 2)
        #expect(try table.numeric("a") == [1, -3])
        #expect(try table.numeric("b") == [2.5, 100])
        #expect(try table.categories("kind") == ["x", "y, z"])
    }

    @Test("reads whitespace-separated text without a header, skipping blank and comment lines")
    func whitespaceWithoutHeader() throws {
        let text = "# comment\n  0.1   2\t 3\n\n4 5 6\r\n"
        let reader = TabularReader(configuration: .init(separator: .whitespace, header: .absent()))
        let table = try reader.read(text: text)
        #expect(table.columnNames == ["column1", "column2", "column3"])
        #expect(try table.numeric("column1") == [0.1, 4])
        #expect(try table.numeric("column3") == [3, 6])

        let named = try TabularReader(configuration: .init(separator: .whitespace, header: .absent(names: ["x", "y", "z"]))).read(text: text)
        #expect(try named.numeric("y") == [2, 5])
    }

    @Test(
        "a malformed number names its line and column",
        arguments: [
            ("a,b\n1,2\n3,oops\n", 3, 2),
            ("a,b\n\n# note\n1,\n", 4, 2),
            ("a,b\n1,2\nnan,4\n", 3, 1),
            ("a,b\n1,inf\n", 2, 2),
        ])
    func malformedValue(text: String, line: Int, column: Int) {
        #expect {
            try TabularReader().read(text: text)
        } throws: { error in
            guard let error = error as? DataError else { return false }
            return error.code == .malformedValue && error.line == line && error.column == column
        }
    }

    @Test("the error message names the column and value")
    func malformedMessage() throws {
        do {
            _ = try TabularReader().read(text: "RM,MEDV\n6.5,24\n6.1,x1\n")
            Issue.record("expected an error")
        } catch {
            #expect(error.description == "malformed_value at line 3, column 2: 'x1' in numeric column 'MEDV' is not a finite number")
        }
    }

    @Test("a row with the wrong number of fields is rejected with its line")
    func wrongFieldCount() {
        #expect {
            try TabularReader().read(text: "a,b\n1,2\n3\n")
        } throws: { ($0 as? DataError)?.code == .fieldCount && ($0 as? DataError)?.line == 3 }
    }

    @Test("an unterminated quote is rejected")
    func unterminatedQuote() {
        #expect {
            try TabularReader(configuration: .init(textColumns: ["s"])).read(text: "s\n\"abc\n")
        } throws: { ($0 as? DataError)?.code == .malformedValue && ($0 as? DataError)?.line == 2 }
    }

    @Test("empty input, empty header names and unknown text columns are errors")
    func structuralErrors() {
        #expect(throws: DataError.self) { try TabularReader().read(text: "\n\n") }
        #expect(throws: DataError.self) { try TabularReader().read(text: "a,,c\n1,2,3\n") }
        #expect(throws: DataError.self) { try TabularReader().read(text: "a,a\n1,2\n") }
        #expect(throws: DataError.self) { try TabularReader(configuration: .init(textColumns: ["nope"])).read(text: "a\n1\n") }
        #expect(throws: DataError.self) { try TabularReader().read(text: "a\n1\n").numeric("b") }
    }

    @Test("a header with no rows gives an empty table")
    func headerOnly() throws {
        let table = try TabularReader().read(text: "a,b\n")
        #expect(table.rowCount == 0)
        #expect(try table.numeric("b").isEmpty)
    }

    @Test("rows(_:) selects rows in the given order")
    func selectRows() throws {
        let table = try TabularReader().read(text: "a,b\n1,10\n2,20\n3,30\n")
        let picked = table.rows([2, 0])
        #expect(try picked.numeric("a") == [3, 1])
        #expect(try picked.numeric("b") == [30, 10])
    }

    @Test("reads a file from disk and reports a missing file")
    func fileIO() throws {
        let url = FileManager.default.temporaryDirectory.appendingPathComponent("orchard-reader-\(UUID().uuidString).csv")
        try Data("x;y\n1;2\n".utf8).write(to: url)
        defer { try? FileManager.default.removeItem(at: url) }
        let table = try TabularReader(configuration: .init(separator: .character(";"))).read(contentsOf: url)
        #expect(try table.numeric("y") == [2])
        #expect { try TabularReader().read(contentsOf: url.appendingPathExtension("missing")) } throws: {
            ($0 as? DataError)?.code == .unreadable
        }
    }
}
