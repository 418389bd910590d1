"""The distributed kernel replica: an ipykernel subclass with Raft, executor election, state sync."""
