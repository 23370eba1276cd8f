import HeapModule
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
/// Each device's place — its waiting call's time, or else its clock — is kept in a min-heap updated lazily (a change
/// pushes a new key and outdates the old one), so finding the earliest device costs O(log n) per event rather than a
/// scan of the fleet: a round of a thousand devices makes tens of thousands of calls and clock moves.
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
        /// The version of this device's current key in ``places``; older keys are stale.
        var version = 0
    }

    /// A device's place in the order at one version: its waiting call's time, or its clock.
    private struct Place: Comparable {
        var time: Double
        var device: Int
        var version: Int
        static func < (a: Place, b: Place) -> Bool { (a.time, a.device) < (b.time, b.device) }
        static func == (a: Place, b: Place) -> Bool { a.time == b.time && a.device == b.device && a.version == b.version }
    }

    private var entries: [Int: Entry] = [:]
    private var places = Heap<Place>()
    private var calling = false
    private var deadline = Double.infinity
    private var end: (time: Double, closed: Bool)?

    /// Records a device's current place (after its clock moved or it began or stopped waiting).
    private func place(_ device: Int) {
        guard var entry = entries[device] else { return }
        entry.version += 1
        entries[device] = entry
        places.insert(Place(time: entry.waiting?.time ?? entry.clock.seconds, device: device, version: entry.version))
    }

    /// The earliest device with its current key; stale keys on top are dropped.
    private func earliest() -> Place? {
        while let top = places.min {
            if let entry = entries[top.device], entry.version == top.version {
                // A busy device's clock may have moved since its key was pushed (its `moved` is on its way): refresh it.
                let now = entry.waiting?.time ?? entry.clock.seconds
                if now == top.time { return top }
                place(top.device)
            }
            places.removeMin()
        }
        return nil
    }

    /// Starts a round with its devices (their clocks already at their check-in times) and the cycle's deadline.
    func begin(deadline: Double, devices: [(device: Int, clock: ManualClock)]) {
        precondition(entries.isEmpty && !calling, "a round began before the previous one wound down")
        self.deadline = deadline
        end = nil
        places = Heap()
        for (device, clock) in devices {
            entries[device] = Entry(clock: clock)
            place(device)
        }
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
    func moved(_ device: Int) {
        place(device)
        dispatch()
    }

    /// Waits until the device may make its call at `time`, then holds the coordinator for it until ``release(closedCycle:)``.
    func acquire(_ device: Int, at time: Double) async throws {
        guard end == nil else { throw RoundOver() }
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
            guard entries[device] != nil else {
                continuation.resume(throwing: RoundOver())
                return
            }
            entries[device]?.waiting = (time, continuation)
            place(device)
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
            if let first = earliest(), first.time < deadline {
                guard let waiting = entries[first.device]?.waiting else { return }
                entries[first.device]?.waiting = nil
                place(first.device)
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
