"""The ``notebookos`` policy's defaults: the one place both the live Global Scheduler (through
``notebookos.config``) and the simulator (through ``NotebookOSPolicy``'s constructor) take them
from, so that a cluster started with default settings runs the policy the simulator models.

Section 3.4 of the paper: the cluster-wide subscription-ratio limit is dynamic (total subscribed
GPUs / total GPUs, ``NotebookOSPolicy.sr_limit_for``), kept in [1, ``MAX_SUBSCRIPTION_RATIO``].
"""

from __future__ import annotations

REPLICAS_PER_KERNEL = 3
MAX_SUBSCRIPTION_RATIO = 7.0
"""The most a host's SR = subscribed GPUs / (GPUs x replicas) may reach under the dynamic limit
(``cluster.max_subscription_ratio``; below 1 it is a fixed limit instead)."""
HOST_OVERSUBSCRIPTION = REPLICAS_PER_KERNEL * MAX_SUBSCRIPTION_RATIO
"""A host's hard cap on subscribed resources as a multiple of its capacity (3 x 7 = 21), so that
the policy's limit, not the host's cap, is what refuses a replica (``cluster.oversubscription``)."""
SR_LIMIT = "paper"
SCALE_IN = "empty"
SCALE_FACTOR = 1.05
MIN_HOSTS = 3
