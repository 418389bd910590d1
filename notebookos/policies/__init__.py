"""Placement and scheduling policies: pure objects shared by the Global Scheduler and the simulator.

``get_policy(name, **params)`` builds one by name; ``policy_names()`` lists them.
"""

from notebookos.policies.base import (
    ContainerLifetime,
    ExecutorDecision,
    GpuBinding,
    MigrationDecision,
    Policy,
    PolicyKind,
    QueuedJob,
    ScalingDecision,
    ScalingView,
)
from notebookos.policies.registry import DEFAULT_POLICY, get_policy, policy_class, policy_names

__all__ = [
    "DEFAULT_POLICY",
    "ContainerLifetime",
    "ExecutorDecision",
    "GpuBinding",
    "MigrationDecision",
    "Policy",
    "PolicyKind",
    "QueuedJob",
    "ScalingDecision",
    "ScalingView",
    "get_policy",
    "policy_class",
    "policy_names",
]
