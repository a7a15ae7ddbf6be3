"""The `zmqflow` command: click groups that turn flags into jobs and services, nothing more."""
