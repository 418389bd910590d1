"""Placement and scheduling policies: pure objects shared by the Global Scheduler and the simulator.

``get_policy(name, **params)`` builds one by name; ``policy_names()`` lists the installed ones
(found through the ``notebookos.policies`` entry-point group, see ``registry``). The extension
points a policy implements are listed in ``framework``.
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
from notebookos.policies.framework import (
    ContainerLifetimeStrategy,
    GpuBindingStrategy,
    PostFilterAction,
    PostFilterDecision,
)
from notebookos.policies.registry import (
    DEFAULT_POLICY,
    broken_policies,
    get_policy,
    policy_class,
    policy_names,
)

__all__ = [
    "DEFAULT_POLICY",
    "ContainerLifetime",
    "ContainerLifetimeStrategy",
    "ExecutorDecision",
    "GpuBinding",
    "GpuBindingStrategy",
    "MigrationDecision",
    "Policy",
    "PolicyKind",
    "PostFilterAction",
    "PostFilterDecision",
    "QueuedJob",
    "ScalingDecision",
    "ScalingView",
    "broken_policies",
    "get_policy",
    "policy_class",
    "policy_names",
]
