"""Checkpoints, rollback, forks and checkpoint images of snapshot-mode sandboxes
(docs/snapshots.md), through the backend's snapshot capability."""
