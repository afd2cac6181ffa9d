"""The id of the current run of a job, from the launcher's environment (stdlib only).

Processes of one run of a job on several nodes must name the same run, and another run of the same job name
(a second launch, another user) must not: the daemons join registrations into one job only when their runs
match (docs/cluster.md). Launchers already give every process of a run the same id.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

RUN_VARIABLES = ("PERSEUS_RUN_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "LSB_JOBID", "PBS_JOBID")
"""Checked in order: an explicit id, torchrun's rendezvous id, Slurm's, LSF's and PBS's job ids."""


def launcher_run_id(environ: Mapping[str, str] | None = None) -> str:
    """The first of `RUN_VARIABLES` set (torchrun's default rendezvous id "none" does not count); "" when
    none is: the job's name, owner and shape alone then say which registrations are one job."""
    environ = os.environ if environ is None else environ
    for name in RUN_VARIABLES:
        value = environ.get(name, "").strip()
        if value and value != "none":
            return value[:128]
    return ""
