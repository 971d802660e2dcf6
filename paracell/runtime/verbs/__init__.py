"""The runc-compatible verbs: thin adapters over the sandbox and state layers."""
