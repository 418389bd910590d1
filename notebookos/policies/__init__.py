"""Placement and scheduling policies: pure objects shared by the Global Scheduler and the simulator."""
