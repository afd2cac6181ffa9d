"""Per-GPU plan switching: a job's frequency plan played on its GPUs at the client's instants, the deadline
timer that ends a plan's stretches early, the energy sampler. Below jobs and the daemon, above gpu/profiling.
"""

from __future__ import annotations
