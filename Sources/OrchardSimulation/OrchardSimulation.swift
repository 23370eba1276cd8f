// The OrchardSimulation module; see README.md for its role.
