// The OrchardProtocol module; see README.md for its role.
