import Foundation
import OrchardProtocol
import OrchardTesting
import Testing

/// The validator behind the OpenAPI conformance checks: each keyword accepts what it should and refuses what it
/// should, and the document uses no keyword it does not understand.
@Suite struct JSONSchemaValidatorTests {
    let validator = JSONSchemaValidator(
        root: try! JSONValue.parse(
            Array(
                #"""
                {"components": {"schemas": {
                    "Name": {"type": "string", "minLength": 1, "maxLength": 3, "pattern": "^[a-z]+$"},
                    "Thing": {"type": "object", "required": ["name"], "additionalProperties": false,
                              "properties": {"name": {"$ref": "#/components/schemas/Name"}, "size": {"type": "integer", "minimum": 1, "maximum": 9},
                                             "rate": {"type": "number", "minimum": 0, "exclusiveMinimum": true, "exclusiveMaximum": 1},
                                             "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 1, "maxItems": 2},
                                             "note": {"type": "string", "nullable": true}}},
                    "Either": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
                    "Loose": {"type": "object", "additionalProperties": {"type": "number"}},
                    "Any": {"anyOf": [{"type": "string"}, {"type": "number", "minimum": 5}]},
                    "Broken": {"$ref": "#/components/schemas/Nowhere"}
                }}}
                """#.utf8)))

    private func problems(_ json: String, _ schema: String) -> [SchemaViolation] {
        validator.validate(try! JSONValue.parse(Array(json.utf8)), against: .object(["$ref": .string("#/components/schemas/\(schema)")]))
    }

    @Test(arguments: [
        (#"{"name":"abc"}"#, "Thing"),
        (#"{"name":"a","size":9,"rate":0.5,"tags":["a","b"],"note":null}"#, "Thing"),
        (#"{"name":"a","size":1.0}"#, "Thing"),
        (#""x""#, "Either"), ("3", "Either"),
        (#"{"a":1,"b":2.5}"#, "Loose"),
        (#""s""#, "Any"), ("5", "Any"),
    ])
    func conformingValuesPass(json: String, schema: String) {
        #expect(problems(json, schema).isEmpty, "\(problems(json, schema))")
    }

    @Test(arguments: [
        (#"{}"#, "Thing", "required property 'name' is missing"),
        (#"{"name":"abcd"}"#, "Thing", "above maxLength 3"),
        (#"{"name":""}"#, "Thing", "below minLength 1"),
        (#"{"name":"A"}"#, "Thing", "does not match"),
        (#"{"name":"a","extra":1}"#, "Thing", "property 'extra' is not allowed"),
        (#"{"name":"a","size":0}"#, "Thing", "below the minimum 1"),
        (#"{"name":"a","size":10}"#, "Thing", "above the maximum 9"),
        (#"{"name":"a","size":1.5}"#, "Thing", "expected integer"),
        (#"{"name":"a","size":"1"}"#, "Thing", "expected integer, found string"),
        (#"{"name":"a","rate":0}"#, "Thing", "(exclusive)"),
        (#"{"name":"a","rate":1}"#, "Thing", "is not below 1"),
        (#"{"name":"a","tags":[]}"#, "Thing", "fewer than minItems"),
        (#"{"name":"a","tags":["a","b","a"]}"#, "Thing", "more than maxItems"),
        (#"{"name":"a","tags":["c"]}"#, "Thing", "is not one of"),
        (#"{"name":"a","note":1}"#, "Thing", "expected string"),
        (#"{"name":null}"#, "Thing", "expected string, found null"),
        ("true", "Either", "matches none of oneOf"),
        (#"{"a":"x"}"#, "Loose", "expected number"),
        ("4", "Any", "matches none of anyOf"),
        ("1", "Broken", "does not resolve"),
    ])
    func violationsAreCaughtAndNamed(json: String, schema: String, expected: String) {
        let found = problems(json, schema)
        #expect(found.contains { $0.description.contains(expected) }, "\(found)")
    }

    @Test func oneOfRefusesAValueMatchingSeveralBranches() {
        let both = JSONValue.object(["oneOf": .array([.object(["type": .string("number")]), .object(["type": .string("integer")])])])
        #expect(validator.validate(.number(3), against: both).contains { $0.message.contains("matches 2 of oneOf") })
        #expect(validator.validate(.number(3.5), against: both).isEmpty)
    }

    @Test func theDocumentUsesOnlyKeywordsTheValidatorUnderstands() throws {
        let document = try JSONValue.parse(OpenAPI.document)
        var problems: [String] = []
        for (name, schema) in document["components"]?["schemas"]?.objectValue ?? [:] {
            problems += JSONSchemaValidator.unsupportedKeywords(in: schema, at: name)
        }
        #expect(problems.isEmpty, "\(problems)")
        #expect(JSONSchemaValidator.unsupportedKeywords(in: .object(["type": .string("string"), "uniqueItems": .bool(true)])) == ["$: uniqueItems"])
    }
}
