"""The agent channel: frames, payload codecs, the relay (docs/agent-protocol.md)."""
