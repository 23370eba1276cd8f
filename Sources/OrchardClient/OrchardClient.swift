// The OrchardClient module; see README.md for its role.
