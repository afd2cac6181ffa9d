"""`JobInfo` replies built in a test, for the renderers and the code that combines daemons' views of a job.

`BARE_JOB` is a job with nothing to show yet: registered, no pipelines, no profiling, no plan, no straggler,
no error. A test takes it and states only what its case is about, `dataclasses.replace(BARE_JOB, ...)`
(which mypy checks field by field). Every field it needs is empty (`None` where it may be, else its type's
zero) but for the job's name, owner, state, schedule (one stage, one microbatch, one chunk) and policy, and
the others keep their defaults: a field added to `JobInfo` needs nothing here unless `_empty` lacks its type.
"""

from __future__ import annotations

from dataclasses import MISSING, fields, replace
from typing import Any

from perseus_client.protocol import JobInfo

_ZEROS: dict[str, Any] = {"str": "", "int": 0, "float": 0.0, "bool": False}


def _empty(annotation: str) -> Any:
    """The empty value of a field annotated `annotation` (a string: `JobInfo`'s module postpones them)."""
    if annotation.endswith("| None"):
        return None
    if annotation.startswith("tuple["):
        return ()
    return _ZEROS[annotation]


_EMPTY_JOB = JobInfo(
    **{
        f.name: _empty(str(f.type))
        for f in fields(JobInfo)
        if f.default is MISSING and f.default_factory is MISSING
    }
)

BARE_JOB = replace(
    _EMPTY_JOB,
    job="train",
    uid=1000,
    state="registered",
    schedule="1f1b",
    num_stages=1,
    num_microbatches=1,
    chunks=1,
    policy="fastest",
)
