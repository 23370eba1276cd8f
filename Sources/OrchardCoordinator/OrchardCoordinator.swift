// The OrchardCoordinator module; see README.md for its role.
