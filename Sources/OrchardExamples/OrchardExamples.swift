// The OrchardExamples module; see README.md for its role.
