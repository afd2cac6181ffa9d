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


class RefusedError(PerseusError):
    """A request refused by the domain: what the caller asked cannot be done as asked.

    Libraries raise these and know nothing of the wire: the daemon's one table (`perseusd.daemon.wire_errors`)
    gives each kind its error code. `field` is where in the request the problem is (`plan[3].freq_mhz`; ""
    for the request as a whole), which the daemon names on the wire after the request's type
    (`set_plan.plan[3].freq_mhz: ...`); None when the message says what it is about.
    """

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field

    def located(self, request: str = "") -> str:
        """The message after where it is, `request.field: message` (the request's type when given)."""
        if self.field is None:
            return str(self)
        path = ".".join(part for part in (request, self.field) if part)
        return f"{path}: {self}" if path else str(self)


class InvalidValueError(RefusedError):
    """A value of the request cannot be right (out of range, inconsistent with what the daemon holds)."""


class NotPermittedError(RefusedError):
    """The caller may not do this (another user's GPU, a GPU its container or Slurm job does not hold)."""


class LimitReachedError(RefusedError):
    """A limit of the daemon is reached (sessions per user, descriptors, open Slurm jobs): retry later."""


class NotRegisteredError(RefusedError):
    """The calling process has no session (it sent no hello, or it is gone)."""


class GpuBusyError(RefusedError):
    """The GPU is leased by another process of the same user."""


class NotLeasedError(RefusedError):
    """The caller holds no lease on the GPU it names."""


class InconsistentStateError(RefusedError):
    """What the daemon holds contradicts the request in a way no caller should cause (an internal error)."""
