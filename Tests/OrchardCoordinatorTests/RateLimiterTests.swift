import Foundation
@testable import OrchardCoordinator
import OrchardProtocol
import Testing

@Suite("Token buckets and the per-key rate limiter")
struct RateLimiterTests {
    let start = Date(timeIntervalSince1970: 1_000_000)

    @Test func aBucketAllowsItsBurstThenOneRequestPerRefill() {
        let limit = RateLimit(burst: 2, perSecond: 0.5)
        var bucket = TokenBucket(limit, now: start)
        #expect(bucket.take(at: start, limit) == nil)
        #expect(bucket.take(at: start, limit) == nil)
        #expect(bucket.take(at: start, limit) == 2)
        #expect(bucket.take(at: start.addingTimeInterval(1.5), limit) == 0.5)
        #expect(bucket.take(at: start.addingTimeInterval(2), limit) == nil)
        // Idle time refills up to the burst, not beyond it.
        let later = start.addingTimeInterval(1000)
        #expect(bucket.take(at: later, limit) == nil)
        #expect(bucket.take(at: later, limit) == nil)
        #expect(bucket.take(at: later, limit) != nil)
    }

    @Test func aClockThatGoesBackRefillsNothing() {
        let limit = RateLimit.once(per: 10)
        var bucket = TokenBucket(limit, now: start)
        #expect(bucket.take(at: start, limit) == nil)
        #expect(bucket.take(at: start.addingTimeInterval(-3600), limit) == 10)
        #expect(bucket.take(at: start.addingTimeInterval(10), limit) == nil)
    }

    @Test func keysHaveTheirOwnBucketsAndFullOnesAreForgottenAtCapacity() {
        var limiter = RateLimiter<String>(RateLimit.once(per: 10), capacity: 2)
        #expect(limiter.take("a", at: start) == nil)
        #expect(limiter.take("b", at: start) == nil)
        #expect(limiter.take("a", at: start) == 10)
        // Full: no bucket has refilled, so a new key is refused rather than forgetting a limited one.
        #expect(limiter.take("c", at: start) == 10)
        #expect(limiter.count == 2)
        // Once "a" and "b" refilled, they are forgotten and "c" gets a bucket.
        #expect(limiter.take("c", at: start.addingTimeInterval(10)) == nil)
        #expect(limiter.count == 1)
    }

    @Test func aRateLimitedErrorAsksForWholeSecondsAndMapsTo429() {
        #expect(CoordinatorError.rateLimited("slow down", retryAfter: 0.2).retryAfter == 1)
        #expect(CoordinatorError.rateLimited("slow down", retryAfter: 9.01).retryAfter == 10)
        #expect(CoordinatorError.rateLimited("slow down", retryAfter: 9.01).message.hasSuffix("retry after 10 s"))
        #expect(CoordinatorError.status(of: .rateLimited) == 429)
        #expect(CoordinatorError.status(of: .workerLimitReached) == 403)
        #expect(RateLimit(burst: 0, perSecond: 1).validationFailure() != nil)
        #expect(RateLimit(burst: 1, perSecond: 0).validationFailure() != nil)
        #expect(RateLimit(burst: 1, perSecond: .infinity).validationFailure() != nil)
        #expect(RateLimit(burst: 1, perSecond: 1).validationFailure() == nil)
    }
}
