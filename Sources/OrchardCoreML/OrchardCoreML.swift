// The OrchardCoreML module; see README.md for its role.
