"""The bundle and its config.json: validated once, into typed values."""
