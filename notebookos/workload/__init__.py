"""Workloads: trace readers, the Sensei-calibrated generator, the replay driver."""
