"""`ClusterPlane`: one background thread between the daemon's hot path and etcd.

The daemon only calls non-blocking methods: `publish_pipeline`, `announce_straggler` (and their removals)
record what this node wants etcd to hold and wake the thread; `snapshot(job)` returns the last view of a job
read from etcd, with its state (fresh, stale, expired; see `ViewState`). Nothing on those paths waits on the
network: they take one lock that the thread holds only for in-memory bookkeeping, never during a request.

Both sides share a `PlaneState` (`perseusd.cluster.plane_state`); the thread's rounds (its lease, the claim
of this node's name, writes, watches and reads) are `PlaneRounds` (`perseusd.cluster.plane_rounds`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType

from perseusd.cluster.config import ClusterConfig
from perseusd.cluster.etcd_store import ClusterError, EtcdStore
from perseusd.cluster.job_board import (
    JobView,
    PipelineFacts,
    StragglerAnnouncement,
    ViewState,
    encode_announcement,
    encode_facts,
    pipeline_key,
    straggler_key,
    view_state,
)
from perseusd.cluster.plane_rounds import PlaneRounds
from perseusd.cluster.plane_state import PlaneState
from perseusd.cluster.span_blobs import blob_chunks
from perseusd.cluster.span_board import (
    BlobRef,
    MemberRecord,
    PlanRecord,
    blob_job_prefix,
    blob_prefix,
    check_name,
    chunk_key,
    job_prefix,
    member_key,
    plan_key,
)
from perseusd.cluster.span_codec import encode_member, encode_plan
from perseusd.threads import NamedThread


@dataclass(frozen=True)
class PlaneStatus:
    """The plane's health, for `perseusctl status` and logs."""

    state: ViewState
    endpoint: str
    lease_id: int | None
    lease_grants: int
    rounds: int
    errors: int
    rotations: int
    skipped_values: int
    last_error: str | None

    def to_json(self) -> dict[str, object]:
        """A JSON-ready dict (the lease id in hex, as etcdctl prints it)."""
        return {
            "state": self.state.value,
            "endpoint": self.endpoint,
            "lease_id": None if self.lease_id is None else f"{self.lease_id:x}",
            "lease_grants": self.lease_grants,
            "rounds": self.rounds,
            "errors": self.errors,
            "rotations": self.rotations,
            "skipped_values": self.skipped_values,
            "last_error": self.last_error,
        }


class ClusterPlane:
    """Publishes this node's facts and keeps views of its jobs, on a thread of its own (see module)."""

    def __init__(
        self,
        config: ClusterConfig,
        store: EtcdStore | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self._store = store or EtcdStore(config.parsed_endpoints, config.timeout_s)
        self._clock = clock
        self._state = PlaneState()
        self._rounds = PlaneRounds(config, self._store, self._state, clock)
        self._thread: threading.Thread | None = None

    # -- the daemon's side: never blocks on etcd -----------------------------------------------------------

    def publish_pipeline(
        self,
        job: str,
        pipeline: int,
        iteration_time_s: float,
        t_min_s: float,
        t_max_s: float,
        plan_time_s: float | None = None,
    ) -> None:
        """Share a local pipeline's measured compute time, frontier time range and running point's time
        (ValueError if bad)."""
        facts = PipelineFacts(self.config.node_name, iteration_time_s, t_min_s, t_max_s, plan_time_s)
        self._want(job, pipeline_key(self.config.prefix, job, pipeline), encode_facts(facts))

    def withdraw_pipeline(self, job: str, pipeline: int) -> None:
        """Stop sharing one pipeline (its job ended here)."""
        self._unwant(pipeline_key(self.config.prefix, job, pipeline))

    def announce_straggler(self, job: str, pipeline: int, factor: float) -> None:
        """Announce that `pipeline` of `job` straggles by `factor` (ValueError if invalid)."""
        announcement = StragglerAnnouncement(self.config.node_name, factor)
        self._want(job, straggler_key(self.config.prefix, job, pipeline), encode_announcement(announcement))

    def clear_straggler(self, job: str, pipeline: int) -> None:
        """Withdraw a straggler announcement (only this node's own announcements are withdrawn)."""
        self._unwant(straggler_key(self.config.prefix, job, pipeline))

    def follow(self, job: str) -> None:
        """Keep a view of `job` from now on (publishing or asking for a snapshot also does)."""
        with self._state.lock:
            self._follow_locked(check_name("job", job))

    def forget_job(self, job: str) -> None:
        """Withdraw every key this node published for `job` and stop keeping its view."""
        prefixes = (job_prefix(self.config.prefix, job), blob_job_prefix(self.config.prefix, job))
        with self._state.lock:
            for key in [k for k in self._state.desired if k.startswith(prefixes)]:
                del self._state.desired[key]
                self._state.to_delete.add(key)
            self._state.followed.discard(job)
            self._state.views.pop(job, None)
            if job in self._state.campaigns:
                self._state.campaigns.discard(job)
                self._state.resigns.add(job)
            for wanted in [w for w in (*self._state.wanted_blobs, *self._state.blobs) if w[0] == job]:
                self._state.wanted_blobs.pop(wanted, None)
                self._state.blobs.pop(wanted, None)
        self._state.wake.set()

    # -- jobs whose pipelines span nodes (docs/cluster.md) ------------------------------------------------

    def publish_member(self, job: str, record: MemberRecord) -> None:
        """Share this node's record of a spanning job (written when it changed)."""
        self._want(job, member_key(self.config.prefix, job, self.config.node_name), encode_member(record))

    def publish_plan(self, job: str, plan: PlanRecord) -> None:
        """Share the job's plan (the leader's decision)."""
        self._want(job, plan_key(self.config.prefix, job), encode_plan(plan))

    def publish_blob(self, job: str, name: str, data: bytes) -> BlobRef:
        """Share `data` as blob `name` of `job` (replacing this node's earlier version); returns its ref."""
        ref, chunks = blob_chunks(name, data)
        prefix = blob_prefix(self.config.prefix, job, name)
        keys = {chunk_key(self.config.prefix, job, ref, i): chunk for i, chunk in enumerate(chunks)}
        with self._state.lock:
            for old in [k for k in self._state.desired if k.startswith(prefix) and k not in keys]:
                del self._state.desired[old]
                self._state.to_delete.add(old)
            self._state.blobs[(job, ref.digest)] = data
        for key, chunk in keys.items():
            self._want(job, key, chunk)
        return ref

    def withdraw_blob(self, job: str, name: str) -> None:
        """Stop sharing blob `name` of `job`."""
        prefix = blob_prefix(self.config.prefix, job, name)
        with self._state.lock:
            for key in [k for k in self._state.desired if k.startswith(prefix)]:
                del self._state.desired[key]
                self._state.to_delete.add(key)
        self._state.wake.set()

    def blob(self, job: str, ref: BlobRef) -> bytes | None:
        """The blob `ref` once fetched (or shared by this node); None asks the thread to fetch it."""
        with self._state.lock:
            data = self._state.blobs.get((job, ref.digest))
            if data is None:
                self._state.wanted_blobs[(job, ref.digest)] = ref
        if data is None:
            self._state.wake.set()
        return data

    def campaign(self, job: str) -> None:
        """Take part in the job's leader election from now on (the role goes to one node at a time)."""
        check_name("job", job)
        with self._state.lock:
            self._follow_locked(job)
            self._state.resigns.discard(job)
            if job not in self._state.campaigns:
                self._state.campaigns.add(job)
                self._state.wake.set()

    def resign(self, job: str) -> None:
        """Give the job's leader role back (if this node holds it) and stop campaigning."""
        with self._state.lock:
            if job in self._state.campaigns:
                self._state.campaigns.discard(job)
                self._state.resigns.add(job)
        self._state.wake.set()

    def snapshot(self, job: str) -> JobView:
        """The last view of `job` read from etcd, and how far to trust it (follows `job` if it was not)."""
        check_name("job", job)
        with self._state.lock:
            self._follow_locked(job)
            view, now_s = self._state.views.get(job), self._clock()
            refreshed_at_s = view.refreshed_at_s if view else None
            state = view_state(
                now_s,
                refreshed_at_s,
                self._state.kept_alive_at_s,
                self.config.stale_after_s,
                self.config.lease_ttl_s,
            )
            if view is None:
                return JobView(job, state=state)
            return JobView(
                job,
                MappingProxyType(dict(view.pipelines)),
                MappingProxyType(dict(view.stragglers)),
                state,
                now_s - view.refreshed_at_s,
                view.span,
            )

    def status(self) -> PlaneStatus:
        """The plane's health and counters."""
        with self._state.lock:
            state = view_state(
                self._clock(),
                self._state.round_ok_at_s,
                self._state.kept_alive_at_s,
                self.config.stale_after_s,
                self.config.lease_ttl_s,
            )
            return PlaneStatus(
                state,
                self._store.endpoint,
                self._state.lease_id,
                self._state.grants,
                self._state.rounds,
                self._state.errors,
                self._store.rotations,
                self._state.skipped,
                self._state.last_error,
            )

    def _want(self, job: str, key: str, value: str) -> None:
        with self._state.lock:
            self._follow_locked(job)
            self._state.to_delete.discard(key)
            changed = self._state.desired.get(key) != value
            self._state.desired[key] = value
        if changed:
            self._state.wake.set()

    def _unwant(self, key: str) -> None:
        with self._state.lock:
            if self._state.desired.pop(key, None) is None and key not in self._state.written:
                return
            self._state.to_delete.add(key)
        self._state.wake.set()

    def _follow_locked(self, job: str) -> None:
        if job not in self._state.followed:
            self._state.followed.add(job)
            self._state.wake.set()

    # -- life cycle --------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the thread (once)."""
        if self._thread is not None:
            raise ClusterError("the cluster plane was already started")
        self._thread = NamedThread(target=self._rounds.run, name="perseusd-cluster", daemon=True)
        self._thread.start()

    def stop(self, revoke: bool = True) -> None:
        """Stop the thread; with `revoke`, revoke the lease so this node's keys vanish at once.

        `revoke=False` leaves the keys to expire with the lease, as after a crash. Waits at most about one
        full set of retries; the thread is a daemon thread, so an unreachable etcd never blocks exit.
        """
        self._rounds.request_stop(revoke)
        if self._thread is None:
            self._store.close()
            return
        self._thread.join(timeout=2 * self._store.attempts * self.config.timeout_s + 1.0)

    @property
    def endpoint(self) -> str:
        """The etcd endpoint the plane talks to now."""
        return self._store.endpoint
