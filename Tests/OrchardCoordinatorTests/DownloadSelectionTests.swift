import OrchardSupport
import OrchardCoordinator
import OrchardProtocol
import Testing

@Suite struct DownloadSelectionTests {
    let etag = "\"p.3\""

    @Test func noRangeSendsEverythingAndAHeldEntityIsNotModified() throws {
        #expect(try DownloadSelection.select(total: 100, etag: etag, range: nil, ifRange: nil, ifNoneMatch: nil) == .whole)
        #expect(try DownloadSelection.select(total: 100, etag: etag, range: "bytes=10-", ifRange: nil, ifNoneMatch: etag) == .notModified)
        #expect(try DownloadSelection.select(total: 100, etag: etag, range: nil, ifRange: nil, ifNoneMatch: "\"x\", *") == .notModified)
        #expect(try DownloadSelection.select(total: 100, etag: etag, range: nil, ifRange: nil, ifNoneMatch: "\"p.2\"") == .whole)
    }

    @Test func aRangeOfTheSameEntityIsServedAndOfAnotherEntityIsNot() throws {
        #expect(try DownloadSelection.select(total: 100, etag: etag, range: "bytes=40-", ifRange: etag, ifNoneMatch: nil) == .partial(40..<100))
        #expect(try DownloadSelection.select(total: 100, etag: etag, range: "bytes=0-9", ifRange: nil, ifNoneMatch: nil) == .partial(0..<10))
        #expect(try DownloadSelection.select(total: 100, etag: etag, range: "bytes=-5", ifRange: nil, ifNoneMatch: nil) == .partial(95..<100))
        #expect(try DownloadSelection.select(total: 100, etag: etag, range: "bytes=90-500", ifRange: nil, ifNoneMatch: nil) == .partial(90..<100))
        // The held bytes belong to an older checkpoint: everything again, never a splice of two entities.
        #expect(try DownloadSelection.select(total: 100, etag: etag, range: "bytes=40-", ifRange: "\"p.2\"", ifNoneMatch: nil) == .whole)
    }

    @Test(arguments: ["bytes=100-", "bytes=5-2", "bytes=0-1,4-5", "items=0-1", "bytes=-0", "bytes=x-"])
    func unsatisfiableOrMalformedRangesAreRefused(range: String) {
        let error = #expect(throws: CoordinatorError.self) {
            try DownloadSelection.select(total: 100, etag: etag, range: range, ifRange: nil, ifNoneMatch: nil)
        }
        #expect(error?.code == .rangeNotSatisfiable)
        #expect(error?.httpStatus == 416)
    }
}

@Suite struct ErrorStatusTests {
    @Test func everyWireCodeHasItsStatusAtTheEdge() {
        let expected: [(WireErrorCode, Int)] = [
            (.malformedJSON, 400), (.malformedSafetensors, 400), (.invalidRequest, 400), (.invalidConfiguration, 400),
            (.unsupportedVersion, 400), (.unauthorized, 401), (.forbidden, 403), (.sessionProcessMismatch, 403), (.invalidRequestKey, 403),
            (.unknownWorker, 404), (.unknownProcess, 404), (.unknownCheckpoint, 404), (.notFound, 404),
            (.methodNotAllowed, 405), (.reportAlreadyReceived, 409), (.deadlinePassed, 409), (.processExists, 409),
            (.payloadTooLarge, 413), (.rangeNotSatisfiable, 416), (.tensorMismatch, 422), (.shapeMismatch, 422),
            (.dtypeMismatch, 422), (.nonFiniteValues, 422), (.frozenTensorChanged, 422), (.invalidSampleCount, 422),
            (.updateNormExceeded, 422),
            (.internalError, 500), (WireErrorCode("something_new"), 500),
        ]
        for (code, status) in expected {
            #expect(CoordinatorError(code, "m").httpStatus == status, "\(code)")
        }
        #expect(CoordinatorError(.processExists, "a process named x 1.0 exists").description == "process_exists: a process named x 1.0 exists")
    }
}
