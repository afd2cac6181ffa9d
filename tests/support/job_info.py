"""`JobInfo` replies built in a test, for the renderers and the code that combines daemons' views of a job.

`BARE_JOB` is a job with nothing to show yet: registered, no pipelines, no profiling, no plan, no straggler,
no error. A test takes it and states only what its case is about, `dataclasses.replace(BARE_JOB, ...)`
(which mypy checks field by field), so a field added to `JobInfo` is added here once.
"""

from __future__ import annotations

from perseus_client.protocol import JobInfo

BARE_JOB = JobInfo(
    job="train",
    uid=1000,
    state="registered",
    state_for_s=0.0,
    schedule="1f1b",
    num_stages=1,
    num_microbatches=1,
    chunks=1,
    pipelines=(),
    policy="fastest",
    target=0.0,
    cached=False,
    profiling=None,
    frontier_points=0,
    plan_index=None,
    plan_time_s=None,
    plan_energy_j=None,
    fastest_time_s=None,
    clock_changes_per_iteration=None,
    wrong_clock_fraction=None,
    error="",
    straggler=None,
    target_time_s=None,
    all_max_time_s=None,
    all_max_energy_j=None,
    energy_saved_j=0.0,
    cluster="",
)
