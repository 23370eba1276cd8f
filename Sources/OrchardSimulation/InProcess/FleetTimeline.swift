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
///
/// Devices join the round lazily, in check-in order: a device not yet started holds its place at its check-in time
/// (its first call can come no earlier), and the runner starts it (``launches()``) once it is among the next
/// `lookahead` devices of the order to become the earliest. When a check-in is turned away because the cycle is full,
/// every device not yet started would be turned away too — admission is first come, and a cycle's assignments only
/// grow — so with ``TurnedAwayChoice/modeled`` those devices are counted as turned away
/// (``modeledTurnedAway(before:)``) without running their stack; a round costs what its participants do, not what the
/// population does.
actor FleetTimeline {
    /// A call refused because the round ended first.
    struct RoundOver: Error {}

    /// What a call did to the round, as its answer tells.
    enum Effect: Sendable {
        case none
        /// A report (or secure-aggregation message) closed the cycle.
        case closedCycle
        /// A check-in was turned away because the cycle had admitted all it may.
        case cycleFull
    }

    private struct Entry {
        /// The device's clock once it started; before, its place is its check-in time.
        var clock: ManualClock?
        let checkIn: Double
        var waiting: (time: Double, continuation: CheckedContinuation<Void, any Error>)?
        /// The version of this device's current key in ``places``; older keys are stale.
        var version = 0

        var time: Double { waiting?.time ?? clock?.seconds ?? checkIn }
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
    /// A check-in not yet handed to the runner, ordered by time (ties by device).
    private struct CheckIn: Comparable {
        var time: Double
        var device: Int
        static func < (a: CheckIn, b: CheckIn) -> Bool { (a.time, a.device) < (b.time, b.device) }
    }

    /// The round's check-ins not yet handed to the runner: a heap, built in linear time, from which a round takes only as
    /// many as it reaches (sorting every available device's check-in cost more than the rest of a round of a population).
    private var pending = Heap<CheckIn>()
    private var lookahead = 1
    private var turnedAway = TurnedAwayChoice.modeled
    private var endsAtClose = true
    /// Devices to start, handed out by ``launches()``, and the runner waiting for them.
    private var due: [(time: Double, device: Int)] = []
    private var launcher: CheckedContinuation<[(time: Double, device: Int)]?, Never>?
    /// The check-ins left when the cycle filled (turned away without running), if it filled.
    private var leftWhenFull: [CheckIn]?

    /// Records a device's current place (after its clock moved or it began or stopped waiting).
    private func place(_ device: Int) {
        guard var entry = entries[device] else { return }
        entry.version += 1
        entries[device] = entry
        places.insert(Place(time: entry.time, device: device, version: entry.version))
    }

    /// The earliest device with its current key; stale keys on top are dropped. A device not yet started that would
    /// come first is handed to the runner first (with the next `lookahead` − 1), or, once the cycle is full, the
    /// devices not yet started are counted as turned away.
    private func earliest() -> Place? {
        while true {
            var top = places.min
            while let candidate = top {
                if let entry = entries[candidate.device], entry.version == candidate.version {
                    // A busy device's clock may have moved since its key was pushed (its `moved` is on its way): refresh it.
                    if entry.time == candidate.time { break }
                    place(candidate.device)
                }
                places.removeMin()
                top = places.min
            }
            guard let next = pending.min else { return top }
            if next.time >= deadline {
                // No call at or past the deadline goes through: the rest never check in.
                dropPending(turnedAway: false)
                return top
            }
            if let top, (top.time, top.device) < (next.time, next.device) { return top }
            hand(count: lookahead)
        }
    }

    /// Hands the next `count` devices not yet started to the runner; each holds its place at its check-in time.
    private func hand(count: Int) {
        for _ in 0..<count {
            guard let next = pending.popMin() else { break }
            entries[next.device] = Entry(checkIn: next.time)
            place(next.device)
            due.append((next.time, next.device))
        }
        wakeLauncher()
    }

    private func wakeLauncher() {
        guard let launcher else { return }
        if !due.isEmpty {
            self.launcher = nil
            launcher.resume(returning: due)
            due = []
        } else if pending.isEmpty {
            self.launcher = nil
            launcher.resume(returning: nil)
        }
    }

    /// Starts a round: its check-ins (virtual time and device, in any order), the cycle's deadline, how many devices to
    /// start ahead of need, and what to do with check-ins once the cycle is full. With `endsAtClose` false (buffered
    /// aggregation) a closing cycle does not end the round: it runs to its deadline, through every release.
    func begin(deadline: Double, checkIns: [(time: Double, device: Int)], lookahead: Int, turnedAway: TurnedAwayChoice, endsAtClose: Bool = true) {
        self.endsAtClose = endsAtClose
        precondition(entries.isEmpty && !calling && launcher == nil, "a round began before the previous one wound down")
        self.deadline = deadline
        end = nil
        places = Heap()
        pending = Heap(checkIns.lazy.map { CheckIn(time: $0.time, device: $0.device) })
        due = []
        self.lookahead = max(1, lookahead)
        self.turnedAway = turnedAway
        leftWhenFull = nil
        if turnedAway == .fullStack { hand(count: pending.count) }
        dispatch()
    }

    /// The next devices to start (their check-in times and indices), nil once no device is left to start this round.
    func launches() async -> [(time: Double, device: Int)]? {
        if !due.isEmpty {
            defer { due = [] }
            return due
        }
        if pending.isEmpty { return nil }
        return await withCheckedContinuation { launcher = $0 }
    }

    /// A handed device started: its clock (at its check-in time) now gives its place.
    func started(_ device: Int, clock: ManualClock) {
        guard entries[device] != nil else { return }
        entries[device]?.clock = clock
        place(device)
        dispatch()
    }

    /// Drops the devices not yet handed: turned away when the cycle filled (those before the round's end), else (the
    /// round ended) they never check in.
    private func dropPending(turnedAway: Bool) {
        if turnedAway && leftWhenFull == nil { leftWhenFull = Array(pending.unordered) }
        pending = Heap()
        wakeLauncher()
    }

    /// The devices turned away without running: those the round reached after its cycle filled, before `end` (a device
    /// whose check-in falls after the round's end would not have checked in).
    func modeledTurnedAway(before end: Double) -> Int {
        leftWhenFull?.count { $0.time < end } ?? 0
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

    /// The call at `time` is done, with its effect on the round: closing the cycle ends the round at `time`; a full
    /// cycle turns away every device not yet started (``TurnedAwayChoice/modeled``).
    func release(at time: Double, effect: Effect) {
        calling = false
        switch effect {
        case .none: break
        case .closedCycle: if endsAtClose { finish(at: time, closed: true) }
        case .cycleFull: if turnedAway == .modeled { dropPending(turnedAway: true) }
        }
        dispatch()
    }

    /// The end of the round: its virtual time, and whether the coordinator closed the cycle. Read once every
    /// device has left, when the round has necessarily ended.
    func roundEnd() -> (time: Double, closed: Bool) {
        guard let end else { preconditionFailure("the round's end was read while devices were still in it") }
        return end
    }

    private func finish(at time: Double, closed: Bool) {
        guard end == nil else { return }
        end = (time, closed)
        // Devices not yet started never make a call; those handed but not yet taken are not started at all.
        for (_, device) in due { entries[device] = nil }
        due = []
        dropPending(turnedAway: false)
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
