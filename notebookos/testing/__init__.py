"""Helpers shared by the tests and the benchmarks: real service launchers, process hygiene."""
