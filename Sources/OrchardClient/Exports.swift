// The trust roots a device's configuration names live with the HTTP plumbing every Orchard client shares; an app
// that imports the SDK spells them without importing that module.
@_exported public import struct OrchardHTTPClient.TrustRoots
@_exported public import struct OrchardHTTPClient.ConnectionError
