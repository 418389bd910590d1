"""The workload driver: `notebookos replay` (docs/replay.md)."""
