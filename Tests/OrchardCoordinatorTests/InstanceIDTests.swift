import OrchardCoordinator
import Testing

/// The default instance id (`orchard serve` without `--instance-id`): distinct for replicas whose host names share a
/// long prefix, and always an id the configuration accepts.
@Suite struct InstanceIDTests {
    @Test func replicasWithALongCommonPrefixGetDistinctValidIDs() {
        // Kubernetes pods of one ReplicaSet: a long deployment name, then the random suffix that tells them apart.
        let prefix = "orchard-coordinator-production-europe-west4-deployment-7d9c"
        let a = CoordinatorConfiguration.defaultInstanceID(hostName: prefix + "-x2kqp", port: 8080)
        let b = CoordinatorConfiguration.defaultInstanceID(hostName: prefix + "-z8mwd", port: 8080)
        #expect(a != b, "the 50-character prefix alone made these equal")
        for id in [a, b] {
            #expect(id.utf8.count <= 64 && id.hasPrefix(String(prefix.prefix(40))) && id.hasSuffix("-8080"))
            #expect(CoordinatorConfiguration(instanceID: id).validationFailure() == nil, "\(id)")
        }
        // Stable: the same name gives the same id (a restarted instance finds its own partial sum again).
        #expect(CoordinatorConfiguration.defaultInstanceID(hostName: prefix + "-x2kqp", port: 8080) == a)
        // A short name stays as it was; characters an id cannot hold become '-'.
        #expect(CoordinatorConfiguration.defaultInstanceID(hostName: "node-1.example", port: 443) == "node-1.example-443")
        #expect(CoordinatorConfiguration.defaultInstanceID(hostName: "höst:1", port: 1) == "h-st-1-1")
        let odd = CoordinatorConfiguration.defaultInstanceID(hostName: String(repeating: "é", count: 80), port: 65535)
        #expect(CoordinatorConfiguration(instanceID: odd).validationFailure() == nil, "\(odd)")
    }
}
