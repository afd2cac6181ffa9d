"""The one exception tree of the project.

Every error a user can meet derives from `PerseusError`; messages say what is wrong and what to do next.
"""

from __future__ import annotations


class PerseusError(Exception):
    """Root of every error raised on purpose by Perseus."""


class ProfileError(PerseusError):
    """A profile file is malformed. The message names the file, line and column."""

    def __init__(self, path: str, line: int, column: str | None, problem: str) -> None:
        where = f"{path}:{line}" + (f": column '{column}'" if column else "")
        super().__init__(f"{where}: {problem}")
        self.path = path
        self.line = line
        self.column = column
        self.problem = problem


class PlanningError(PerseusError):
    """The planner cannot build a frontier from its inputs (bad schedule, failed cost model fit, ...)."""


class PlanFormatError(PerseusError):
    """A plan or frontier document is malformed or has an unsupported version."""


class GpuError(PerseusError):
    """A GPU operation failed. Subclasses carry the cause; see `perseusd.gpu.errors`."""


class ConfigError(PerseusError):
    """The daemon configuration is invalid."""


class JobNotFoundError(PerseusError):
    """A request names a job this node does not have."""

    def __init__(self, job: str) -> None:
        super().__init__(f"no job {job!r} on this node")
        self.job = job


class JobOwnerError(PerseusError):
    """A request names a job that another user registered: refused the same way by every job request
    (the job's name is known to exist anyway: registering it again is refused too)."""

    def __init__(self, job: str) -> None:
        super().__init__(f"job {job!r} belongs to another user")
        self.job = job
