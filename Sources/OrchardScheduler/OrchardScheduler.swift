// The OrchardScheduler module; see README.md for its role.
