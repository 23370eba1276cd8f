import Foundation
#if canImport(Glibc)
import Glibc
#endif
import OrchardCoordinator
import OrchardFormats
import OrchardProtocol
import OrchardSupport
import Testing

/// Reports streamed over real loopback HTTP: the cap on uploads in flight (503 with `Retry-After`), and an upload
/// whose device goes away mid-body, which leaves nothing behind.
@Suite struct UploadLimitTests {
    @Test func uploadsBeyondTheCapAreTurnedAwayWithRetryAfter() async throws {
        let harness = try await Harness.start(
            configuration: CoordinatorConfiguration(adminToken: Harness.adminToken, maximumUploadsInFlight: 1, uploadRetryAfter: .seconds(7)))
        try await harness.stopping {
            _ = try await harness.host()
            let first = try await harness.device()
            let second = try await harness.device()
            let firstAssignment = try await harness.join(first)
            let secondAssignment = try await harness.join(second)

            // The first device's upload holds the only place (started through the coordinator, its body not sent).
            let held = try await harness.coordinator.beginUpload(session: harness.coordinator.session(forToken: first.sessionToken))
            #expect(harness.coordinator.uploadsInFlight == 1)
            let refused = try await harness.report(second, secondAssignment, diff: Fixture.diff(0.1), samples: 2)
            #expect(refused.status == 503)
            #expect(refused.errorCode == "too_many_uploads")
            #expect(refused.header("Retry-After") == "7")

            // A forged token is refused before it could take a place.
            let forged = try await harness.http.send("POST", Endpoint.report, body: [0, 0], token: "forged", headers: ["Content-Type": MediaType.safetensors])
            #expect(forged.status == 401)

            await held.abandon()
            #expect(harness.coordinator.uploadsInFlight == 0)
            #expect(try await harness.report(second, secondAssignment, diff: Fixture.diff(0.1), samples: 2).status == 200)
            #expect(try await harness.report(first, firstAssignment, diff: Fixture.diff(0.2), samples: 3).status == 200)
            #expect(harness.coordinator.uploadsInFlight == 0)
        }
    }

    /// One session cannot take every upload place: a worker holds at most `maximumUploadsPerWorker` at once, and the
    /// others' reports are still received meanwhile.
    @Test func oneWorkerCannotTakeEveryUploadPlace() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            _ = try await harness.host()
            let greedy = try await harness.device()
            let other = try await harness.device()
            let otherAssignment = try await harness.join(other)
            let session = try await harness.coordinator.session(forToken: greedy.sessionToken)
            let cap = harness.configuration.maximumUploadsPerWorker
            var held: [ReportUpload] = []
            for _ in 0..<cap { held.append(try harness.coordinator.beginUpload(session: session)) }
            let refused = try await harness.http.send(
                "POST", Endpoint.report, body: [1, 2, 3], token: greedy.sessionToken, headers: ["Content-Type": MediaType.safetensors])
            #expect(refused.status == 503)
            #expect(refused.errorCode == "too_many_uploads")
            #expect(String(decoding: refused.body, as: UTF8.self).contains("worker \(greedy.workerID)"))
            #expect(harness.coordinator.uploadsInFlight == cap)
            #expect(try await harness.report(other, otherAssignment, diff: Fixture.diff(0.1), samples: 2).status == 200)
            for upload in held { await upload.abandon() }
            #expect(harness.coordinator.uploadsInFlight == 0)
            // Given back, the places are the worker's again.
            let again = try harness.coordinator.beginUpload(session: session)
            await again.abandon()
        }
    }

    /// A device that sends the header and half the data, then closes its connection: the server gives back the
    /// place, deletes the staged diff and undoes the admission, so the device can send the report again.
    @Test func anUploadCutOffMidBodyLeavesNothingBehind() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            _ = try await harness.host()
            let device = try await harness.device()
            let assignment = try await harness.join(device)
            let body = ReportEnvelope.encode(
                diff: Fixture.diff(0.3), metadata: ReportMetadata(workerID: device.workerID, requestKey: assignment.requestKey, sampleCount: 4))

            let head =
                "POST \(Endpoint.report) HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer \(device.sessionToken)\r\n"
                + "Content-Type: \(MediaType.safetensors)\r\nContent-Length: \(body.count)\r\n\r\n"
            let port = try #require(harness.server.baseURL.port)
            let ended = harness.coordinator.uploadsEnded
            try sendAndClose(port: port, bytes: Array(head.utf8) + body[0..<(body.count - 6)])

            // The server notices the closed connection on its own schedule: wait (bounded) for that upload to end (its
            // admission is undone before its place is given back; the place may not even have been taken yet when
            // the bytes are sent).
            var waited = 0
            while harness.coordinator.uploadsEnded == ended && waited < 1000 {
                try await Task.sleep(for: .milliseconds(10))
                waited += 1
            }
            #expect(harness.coordinator.uploadsInFlight == 0)
            let spool = URL(fileURLWithPath: harness.databasePath + "-spool")
            let staged = FileManager.default.enumerator(atPath: spool.path)?.compactMap { $0 as? String }.filter { $0.hasSuffix(".f32") } ?? []
            #expect(staged.isEmpty, "staged diffs left: \(staged)")

            let resent = try await harness.report(device, assignment, diff: Fixture.diff(0.3), samples: 4)
            #expect(resent.status == 200, "\(String(decoding: resent.body, as: UTF8.self))")
        }
    }

    /// A device that sends the header and part of the data, then nothing while keeping its connection open: after
    /// the idle timeout the connection is closed and the upload abandoned, so it holds neither its place nor its
    /// cycle (which then closes on the goal of the other reports).
    @Test func aStalledUploadIsAbandonedAfterTheIdleTimeout() async throws {
        let harness = try await Harness.start(idleTimeout: .seconds(1))
        try await harness.stopping {
            let hosted = try await harness.host(Fixture.host(goal: 2, overSelection: 1))
            let stalled = try await harness.device()
            let other = try await harness.device()
            let stalledAssignment = try await harness.join(stalled)
            let otherAssignment = try await harness.join(other)
            let body = ReportEnvelope.encode(
                diff: Fixture.diff(0.3), metadata: ReportMetadata(workerID: stalled.workerID, requestKey: stalledAssignment.requestKey, sampleCount: 4))
            let head =
                "POST \(Endpoint.report) HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer \(stalled.sessionToken)\r\n"
                + "Content-Type: \(MediaType.safetensors)\r\nContent-Length: \(body.count)\r\n\r\n"
            let port = try #require(harness.server.baseURL.port)
            let fd = try connectLoopback(port: port)
            defer { close(fd) }
            try transmit(fd, Array(head.utf8) + body[0..<(body.count - 6)])
            var waited = 0
            while harness.coordinator.uploadsInFlight == 0 && waited < 500 {
                try await Task.sleep(for: .milliseconds(10))
                waited += 1
            }
            #expect(harness.coordinator.uploadsInFlight == 1, "the stalled upload was admitted")
            // The server closes the stalled connection on its own schedule: wait (bounded) for the place to return.
            waited = 0
            while harness.coordinator.uploadsInFlight != 0 && waited < 1000 {
                try await Task.sleep(for: .milliseconds(10))
                waited += 1
            }
            #expect(harness.coordinator.uploadsInFlight == 0)
            #expect(try await harness.report(other, otherAssignment, diff: Fixture.diff(0.1), samples: 2).status == 200)
            // The stalled device may still report in full, which closes the cycle on its goal of two.
            #expect(try await harness.report(stalled, stalledAssignment, diff: Fixture.diff(0.3), samples: 4).status == 200)
            #expect(try await harness.status(hosted.processID).cyclesCompleted == 1)
        }
    }

    /// An upload that keeps trickling in (so the idle timeout never fires) is refused once its cycle's deadline and the
    /// report grace have passed: it gives back its place and its admission, and the cycle closes at its deadline
    /// instead of waiting for it forever.
    @Test func anUploadTricklingPastItsDeadlineCannotHoldTheCycle() async throws {
        var configuration = CoordinatorConfiguration(adminToken: Harness.adminToken)
        configuration.reportUploadGrace = .seconds(60)
        let harness = try await Harness.start(configuration: configuration)
        try await harness.stopping {
            let hosted = try await harness.host(Fixture.host(goal: 2, minimum: 1, overSelection: 1, cycleLength: 600))
            let slow = try await harness.device()
            let assignment = try await harness.join(slow)
            let body = ReportEnvelope.encode(
                diff: Fixture.diff(0.3), metadata: ReportMetadata(workerID: slow.workerID, requestKey: assignment.requestKey, sampleCount: 4))
            let upload = try await harness.coordinator.beginUpload(session: harness.coordinator.session(forToken: slow.sessionToken))
            // The header and a few data bytes: admitted, and in time.
            let headerLength = Int(body[0..<8].withUnsafeBytes { $0.loadUnaligned(as: UInt64.self).littleEndian })
            try await upload.consume(body[0..<(8 + headerLength + 4)])
            #expect(harness.coordinator.uploadsInFlight == 1)
            // Past the deadline, within the grace: still taken, and the cycle waits for it.
            harness.clock.advance(bySeconds: 630)
            try await upload.consume(body[(8 + headerLength + 4)..<(8 + headerLength + 8)])
            await harness.coordinator.tick()
            #expect(try await harness.status(hosted.processID).cyclesAbandoned == 0, "the cycle closed under an upload still in its grace")
            // Past the grace: the next bytes are refused, the place and the admission given back, and the cycle closes.
            harness.clock.advance(bySeconds: 31)
            await #expect(throws: CoordinatorError.self) { try await upload.consume(body[(8 + headerLength + 8)..<(8 + headerLength + 12)]) }
            #expect(harness.coordinator.uploadsInFlight == 0)
            await harness.coordinator.tick()
            let status = try await harness.status(hosted.processID)
            #expect(status.cyclesAbandoned == 1, "the cycle did not close at its deadline: \(status)")
        }
    }

    /// A secure-aggregation body is bounded by its process before any of it is read: a process without secure
    /// aggregation is refused at once (a device announcing 100 MB and sending nothing more gets its answer), and a
    /// secure one takes no more than its masked input and roster-sized messages need.
    @Test func secureAggregationBodiesAreBoundedByTheirProcessBeforeTheyAreRead() async throws {
        let harness = try await Harness.start()
        try await harness.stopping {
            let port = try #require(harness.server.baseURL.port)
            _ = try await harness.host()
            let plain = try await harness.device()
            let fd = try connectLoopback(port: port)
            defer { close(fd) }
            let head =
                "POST \(Endpoint.secureAggregation) HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer \(plain.sessionToken)\r\n"
                + "Content-Type: application/json\r\nContent-Length: 100000000\r\n\r\n{\"worker_id\""
            try transmit(fd, Array(head.utf8))
            let answer = try receiveHead(fd)
            #expect(answer.hasPrefix("HTTP/1.1 4"), "\(answer)")
            #expect(answer.contains("aggregation_mode_mismatch"), "\(answer)")

            var request = SecureFixture.host(goal: 3, minimum: 3)
            request.name = "secure"
            _ = try await harness.host(request)
            let device = try await harness.device(name: "secure")
            let tooLarge = [UInt8](repeating: 0x20, count: 400_000)
            let refused = try await harness.http.send(
                "POST", Endpoint.secureAggregation, body: tooLarge, token: device.sessionToken, headers: ["Content-Type": "application/json"])
            #expect(refused.status == 413)
            #expect(refused.errorCode == "payload_too_large")
        }
    }

    /// The status line and headers of an answer (and what came with them), within 10 seconds.
    func receiveHead(_ fd: Int32) throws -> String {
        var timeout = timeval(tv_sec: 120, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        var received: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while !String(decoding: received, as: UTF8.self).contains("\r\n\r\n") {
            let count = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            guard count > 0 else { break }
            received += buffer[0..<count]
        }
        // The error body follows the headers; take what is there within a moment.
        let count = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
        if count > 0 { received += buffer[0..<count] }
        return String(decoding: received, as: UTF8.self)
    }

    func connectLoopback(port: Int) throws -> Int32 {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        try #require(fd >= 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        try #require(connected == 0)
        return fd
    }

    func transmit(_ fd: Int32, _ bytes: [UInt8]) throws {
        var sent = 0
        while sent < bytes.count {
            let count = bytes[sent...].withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, 0) }
            try #require(count > 0)
            sent += count
        }
    }

    /// Writes `bytes` to a new loopback connection and closes it without reading an answer.
    func sendAndClose(port: Int, bytes: [UInt8]) throws {
        let fd = try connectLoopback(port: port)
        defer { close(fd) }
        try transmit(fd, bytes)
    }
}
