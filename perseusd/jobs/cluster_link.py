"""The jobs' side of the cluster plane: what a node shares about its pipelines and reads about the others'.

Only built when the daemon is configured with etcd endpoints; every call is non-blocking (the plane's thread
talks to etcd). Entries this node published come back in the view too; they are left out here, the job
manager knows its own pipelines first-hand.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from perseusd.cluster.job_board import PipelineFacts

if TYPE_CHECKING:
    from perseusd.cluster.plane import ClusterPlane

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RemoteView:
    """Other nodes' pipelines and straggler announcements for one job, and how far to trust them."""

    pipelines: dict[int, PipelineFacts] = field(default_factory=dict)
    stragglers: dict[int, float] = field(default_factory=dict)
    state: str = ""
    """"fresh", "stale" or "expired" (the no-slowdown plan then)."""

    @property
    def usable(self) -> bool:
        return self.state in ("fresh", "stale")


def significant(value: float, digits: int = 3) -> float:
    """`value` to `digits` significant digits: a steady pipeline's published facts stop changing, so the
    plane writes to etcd only when something did."""
    return float(f"{value:.{digits}g}")


class ClusterLink:
    """Publishes this node's pipelines and straggler decisions; reads the others'."""

    def __init__(self, plane: ClusterPlane, node_name: str) -> None:
        self._plane = plane
        self.node_name = node_name

    def publish(
        self, job: str, pipeline: int, compute_s: float, t_min_s: float, t_max_s: float, plan_s: float
    ) -> None:
        try:
            self._plane.publish_pipeline(
                job, pipeline, significant(compute_s), t_min_s, t_max_s, significant(plan_s, 6)
            )
        except ValueError as exc:  # a job name etcd cannot key, or a nonsense time: never fatal
            logger.debug("job %s pipeline %d not shared: %s", job, pipeline, exc)

    def announce(self, job: str, pipeline: int, factor: float) -> bool:
        try:
            self._plane.announce_straggler(job, pipeline, significant(factor, 4))
        except ValueError as exc:
            logger.warning("job %s: straggler pipeline %d not shared: %s", job, pipeline, exc)
            return False
        return True

    def clear(self, job: str, pipeline: int) -> None:
        with contextlib.suppress(ValueError):
            self._plane.clear_straggler(job, pipeline)

    def withdraw(self, job: str, pipeline: int) -> None:
        with contextlib.suppress(ValueError):
            self._plane.withdraw_pipeline(job, pipeline)

    def forget(self, job: str) -> None:
        with contextlib.suppress(ValueError):
            self._plane.forget_job(job)

    @property
    def plane(self) -> ClusterPlane:
        """The plane itself, for a spanning job's records (`perseusd.jobs.spanning`)."""
        return self._plane

    def remote(self, job: str) -> RemoteView:
        """The other nodes' view of `job` (empty and expired when the job name is not a valid key)."""
        try:
            view = self._plane.snapshot(job)
        except ValueError:
            return RemoteView(state="expired")
        pipelines = {p: f for p, f in view.pipelines.items() if f.node != self.node_name}
        stragglers = {p: a.factor for p, a in view.stragglers.items() if a.node != self.node_name}
        return RemoteView(pipelines, stragglers, view.state.value)
