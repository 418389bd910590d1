"""Discrete-event, trace-driven simulator that runs the live policy objects."""
