// The OrchardSchedulerApple module; see README.md for its role.
