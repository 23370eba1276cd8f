// The trust roots a SuperLink address names live with the HTTP plumbing every Orchard client shares; an app
// that imports OrchardFlower spells them without importing that module.
@_exported public import struct OrchardHTTPClient.TrustRoots
@_exported public import struct OrchardHTTPClient.ConnectionError
