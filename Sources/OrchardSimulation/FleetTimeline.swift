import OrchardSupport
/// Puts the fleet's calls to the coordinator in virtual-time order.
///
/// Every device of a round runs concurrently on its own ``OrchardSupport/ManualClock``; its computation never waits for the
/// others. Only its calls to the coordinator do: a call at virtual time `t` goes through when no device of the
/// round could still make an earlier one — every other device is either waiting with a later call (ties by
/// device id) or busy with its clock past `t`, since a device's clock only moves forward. Calls go one at a
/// time, so the coordinator sees the same sequence on every run whatever the thread scheduling (a conservative
/// discrete-event simulation).
///
/// The round ends at the first of: the coordinator closing the cycle with a report (its time), or every device
/// being past the deadline or done (the deadline). After that, every call fails with ``RoundOver`` — all of them
/// are at or after the end, by the ordering — and the devices wind down.
actor FleetTimeline {
    /// A call refused because the round ended first.
    struct RoundOver: Error {}

    private struct Entry {
        let clock: ManualClock
        var waiting: (time: Double, continuation: CheckedContinuation<Void, any Error>)?
    }

    private var entries: [Int: Entry] = [:]
    private var calling = false
    private var deadline = Double.infinity
    private var end: (time: Double, closed: Bool)?

    /// Starts a round with its devices (their clocks already at their check-in times) and the cycle's deadline.
    func begin(deadline: Double, devices: [(device: Int, clock: ManualClock)]) {
        precondition(entries.isEmpty && !calling, "a round began before the previous one wound down")
        self.deadline = deadline
        end = nil
        for (device, clock) in devices { entries[device] = Entry(clock: clock) }
        dispatch()
    }

    /// A device's round is over: it makes no more calls.
    func leave(_ device: Int) {
        if let waiting = entries.removeValue(forKey: device)?.waiting {
            waiting.continuation.resume(throwing: RoundOver())
        }
        dispatch()
    }

    /// A device moved its clock forward (the minimum may have changed).
    func moved() { dispatch() }

    /// Waits until the device may make its call at `time`, then holds the coordinator for it until ``release(closedCycle:)``.
    func acquire(_ device: Int, at time: Double) async throws {
        guard end == nil else { throw RoundOver() }
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
            guard entries[device] != nil else {
                continuation.resume(throwing: RoundOver())
                return
            }
            entries[device]?.waiting = (time, continuation)
            dispatch()
        }
    }

    /// The call is done; when it closed the cycle, the round ends at `time`.
    func release(closedCycleAt time: Double?) {
        calling = false
        if let time { finish(at: time, closed: true) }
        dispatch()
    }

    /// The end of the round: its virtual time, and whether the coordinator closed the cycle. Read once every
    /// device has left, when the round has necessarily ended.
    func roundEnd() -> (time: Double, closed: Bool) {
        guard let end else { preconditionFailure("the round's end was read while devices were still in it") }
        return end
    }

    private func finish(at time: Double, closed: Bool) {
        if end == nil { end = (time, closed) }
    }

    private func dispatch() {
        guard !calling else { return }
        if end == nil {
            var first: (time: Double, device: Int, waiting: Bool)?
            for (device, entry) in entries {
                let key = (time: entry.waiting?.time ?? entry.clock.seconds, device: device, waiting: entry.waiting != nil)
                if let current = first, (current.time, current.device) < (key.time, key.device) { continue }
                first = key
            }
            if let first, first.time < deadline {
                guard first.waiting, let waiting = entries[first.device]?.waiting else { return }
                entries[first.device]?.waiting = nil
                calling = true
                waiting.continuation.resume()
                return
            }
            // Nobody can call before the deadline any more: the cycle's timer decides the round.
            finish(at: deadline, closed: false)
        }
        for device in entries.keys {
            guard let waiting = entries[device]?.waiting else { continue }
            entries[device]?.waiting = nil
            waiting.continuation.resume(throwing: RoundOver())
        }
    }
}
