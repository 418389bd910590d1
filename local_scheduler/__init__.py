"""The Local Scheduler: one per GPU host; launches replicas, binds GPUs, forwards messages."""
