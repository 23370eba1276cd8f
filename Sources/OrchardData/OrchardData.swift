// The OrchardData module; see README.md for its role.
