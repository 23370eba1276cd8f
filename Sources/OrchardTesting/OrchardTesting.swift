// The OrchardTesting module; see README.md for its role.
