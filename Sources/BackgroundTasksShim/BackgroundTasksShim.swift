// The BackgroundTasksShim module; see README.md for its role.
