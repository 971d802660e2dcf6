"""OCI runtime: bundle validation, state, lifecycle verbs and the host shim."""
