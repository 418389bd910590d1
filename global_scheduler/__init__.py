"""The Global Scheduler: registry, placement, routing, migration, autoscaling, prewarm pool."""
