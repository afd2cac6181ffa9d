"""`ClusterPlane`: one background thread between the daemon's hot path and etcd.

The daemon only calls non-blocking methods: `publish_pipeline`, `announce_straggler` (and their removals)
record what this node wants etcd to hold and wake the thread; `snapshot(job)` returns the last view of a job
read from etcd, with its state (fresh, stale, expired; see `ViewState`). Nothing on those paths waits on the
network: they take one lock that the thread holds only for in-memory bookkeeping, never during a request.

The thread works in rounds (every `refresh_interval_s`, or at once when woken, at most four times as often):
grant a lease if it has none, keep it alive every third of the TTL, delete and write what changed (every key
attached to the lease), then re-read the followed jobs that changed. A job is re-read when its watch (one
etcd watch stream per followed job, `RangeWatch`) says a key under it changed, and every job every quarter
TTL whatever happens (so a view is fresh while etcd answers, and a watch that hangs costs latency, never
correctness): a thousand nodes polling their jobs twice a second would be thousands of reads a second on
etcd, where a straggler announcement now costs one read per node of its job. Any failure ends the round
early and is retried the next round; the views are kept as they were, so they turn stale and, once no
keep-alive has succeeded for a whole TTL, expired. A lease that expired (locally or in etcd) is replaced: a
new one is granted, everything is written again under it, and the old one is revoked (best effort) so keys
withdrawn meanwhile disappear.

Before it writes anything under a lease, the plane claims its node name (`<prefix>/nodes/<node>`, created only
if absent, attached to the lease): a second daemon configured with the same `cluster_node_name` would
overwrite this node's member records and pipelines, so it publishes nothing, says why in its status and log,
and claims the name once the other lease is gone (a restarted node waits out its previous run's lease).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType

from perseusd.cluster import span_sync
from perseusd.cluster.config import ClusterConfig
from perseusd.cluster.etcd_store import (
    ClusterError,
    EtcdStore,
    LeaseLostError,
    compare_create,
    prefix_end,
    put_op,
)
from perseusd.cluster.etcd_watch import RangeWatch
from perseusd.cluster.job_board import (
    JobView,
    PipelineFacts,
    SpanView,
    StragglerAnnouncement,
    ViewState,
    build_full_view,
    encode_announcement,
    encode_facts,
    pipeline_key,
    straggler_key,
    view_state,
)
from perseusd.cluster.span_board import (
    BlobRef,
    MemberRecord,
    PlanRecord,
    blob_chunks,
    blob_job_prefix,
    blob_prefix,
    check_name,
    chunk_key,
    encode_member,
    encode_plan,
    job_prefix,
    member_key,
    plan_key,
)
from perseusd.threads import NamedThread

logger = logging.getLogger(__name__)

MAX_BLOBS = 16
"""Fetched blobs kept (the newest); a job needs one solution and, on its leader, each node's profile."""

ROUNDS_PER_INTERVAL_MAX = 4
"""Publications wake the thread at once, but rounds never start more often than this per interval."""


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


@dataclass
class _View:
    pipelines: dict[int, PipelineFacts]
    stragglers: dict[int, StragglerAnnouncement]
    refreshed_at_s: float
    span: SpanView | None = None


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
        self._lock = threading.Lock()
        self._wake, self._stopping = threading.Event(), threading.Event()
        self._thread: threading.Thread | None = None
        self._revoke_on_stop = True
        # Guarded by _lock: what this node wants in etcd, what is there under the current lease, the views.
        self._desired: dict[str, str] = {}
        self._written: dict[str, str] = {}
        self._to_delete: set[str] = set()
        self._followed: set[str] = set()
        self._views: dict[str, _View] = {}
        self._campaigns: set[str] = set()
        self._resigns: set[str] = set()
        self._wanted_blobs: dict[tuple[str, str], BlobRef] = {}
        self._blobs: dict[tuple[str, str], bytes] = {}
        self._kept_alive_at_s: float | None = None
        self._round_ok_at_s: float | None = None
        self._rounds = self._errors = self._grants = self._skipped = 0
        self._last_error: str | None = None
        self._changed: set[str] = set()
        """Jobs whose watch reported a change (or that were just followed): re-read at the next round."""
        # Owned by the thread.
        self._lease_id: int | None = None
        self._claimed_under: int | None = None
        """The lease this node's name is claimed under (None: not claimed yet)."""
        self._old_leases: list[int] = []
        self._watches: dict[str, RangeWatch] = {}
        self._views_read_at_s: float | None = None
        self.view_reads = 0

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
        with self._lock:
            self._follow_locked(check_name("job", job))

    def forget_job(self, job: str) -> None:
        """Withdraw every key this node published for `job` and stop keeping its view."""
        prefixes = (job_prefix(self.config.prefix, job), blob_job_prefix(self.config.prefix, job))
        with self._lock:
            for key in [k for k in self._desired if k.startswith(prefixes)]:
                del self._desired[key]
                self._to_delete.add(key)
            self._followed.discard(job)
            self._views.pop(job, None)
            if job in self._campaigns:
                self._campaigns.discard(job)
                self._resigns.add(job)
            for wanted in [w for w in (*self._wanted_blobs, *self._blobs) if w[0] == job]:
                self._wanted_blobs.pop(wanted, None)
                self._blobs.pop(wanted, None)
        self._wake.set()

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
        with self._lock:
            for old in [k for k in self._desired if k.startswith(prefix) and k not in keys]:
                del self._desired[old]
                self._to_delete.add(old)
            self._blobs[(job, ref.digest)] = data
        for key, chunk in keys.items():
            self._want(job, key, chunk)
        return ref

    def withdraw_blob(self, job: str, name: str) -> None:
        """Stop sharing blob `name` of `job`."""
        prefix = blob_prefix(self.config.prefix, job, name)
        with self._lock:
            for key in [k for k in self._desired if k.startswith(prefix)]:
                del self._desired[key]
                self._to_delete.add(key)
        self._wake.set()

    def blob(self, job: str, ref: BlobRef) -> bytes | None:
        """The blob `ref` once fetched (or shared by this node); None asks the thread to fetch it."""
        with self._lock:
            data = self._blobs.get((job, ref.digest))
            if data is None:
                self._wanted_blobs[(job, ref.digest)] = ref
        if data is None:
            self._wake.set()
        return data

    def campaign(self, job: str) -> None:
        """Take part in the job's leader election from now on (the role goes to one node at a time)."""
        check_name("job", job)
        with self._lock:
            self._follow_locked(job)
            self._resigns.discard(job)
            if job not in self._campaigns:
                self._campaigns.add(job)
                self._wake.set()

    def resign(self, job: str) -> None:
        """Give the job's leader role back (if this node holds it) and stop campaigning."""
        with self._lock:
            if job in self._campaigns:
                self._campaigns.discard(job)
                self._resigns.add(job)
        self._wake.set()

    def snapshot(self, job: str) -> JobView:
        """The last view of `job` read from etcd, and how far to trust it (follows `job` if it was not)."""
        check_name("job", job)
        with self._lock:
            self._follow_locked(job)
            view, now_s = self._views.get(job), self._clock()
            refreshed_at_s = view.refreshed_at_s if view else None
            state = view_state(
                now_s,
                refreshed_at_s,
                self._kept_alive_at_s,
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
        with self._lock:
            state = view_state(
                self._clock(),
                self._round_ok_at_s,
                self._kept_alive_at_s,
                self.config.stale_after_s,
                self.config.lease_ttl_s,
            )
            return PlaneStatus(
                state,
                self._store.endpoint,
                self._lease_id,
                self._grants,
                self._rounds,
                self._errors,
                self._store.rotations,
                self._skipped,
                self._last_error,
            )

    def _want(self, job: str, key: str, value: str) -> None:
        with self._lock:
            self._follow_locked(job)
            self._to_delete.discard(key)
            changed = self._desired.get(key) != value
            self._desired[key] = value
        if changed:
            self._wake.set()

    def _unwant(self, key: str) -> None:
        with self._lock:
            if self._desired.pop(key, None) is None and key not in self._written:
                return
            self._to_delete.add(key)
        self._wake.set()

    def _follow_locked(self, job: str) -> None:
        if job not in self._followed:
            self._followed.add(job)
            self._wake.set()

    # -- life cycle --------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the thread (once)."""
        if self._thread is not None:
            raise ClusterError("the cluster plane was already started")
        self._thread = NamedThread(target=self._run, name="perseusd-cluster", daemon=True)
        self._thread.start()

    def stop(self, revoke: bool = True) -> None:
        """Stop the thread; with `revoke`, revoke the lease so this node's keys vanish at once.

        `revoke=False` leaves the keys to expire with the lease, as after a crash. Waits at most about one
        full set of retries; the thread is a daemon thread, so an unreachable etcd never blocks exit.
        """
        self._revoke_on_stop = revoke
        self._stopping.set()
        self._wake.set()
        if self._thread is None:
            self._store.close()
            return
        self._thread.join(timeout=2 * self._store.attempts * self.config.timeout_s + 1.0)

    def _run(self) -> None:
        min_gap_s = self.config.refresh_interval_s / ROUNDS_PER_INTERVAL_MAX
        while not self._stopping.is_set():
            self._wake.clear()
            self._round()
            if self._stopping.wait(min_gap_s):
                break
            self._wake.wait(self.config.refresh_interval_s - min_gap_s)
        self._shut_down()

    def _shut_down(self) -> None:
        for watch in self._watches.values():
            watch.stop()
        if self._revoke_on_stop and self._lease_id is not None:
            try:
                self._store.revoke(self._lease_id)
            except ClusterError as exc:
                logger.warning("cluster plane: could not revoke lease %x on stop: %s", self._lease_id, exc)
        self._store.close()

    # -- one round (the thread) --------------------------------------------------------------------

    def _round(self) -> None:
        try:
            self._ensure_lease()
            self._claim_node_name()
            self._sync_keys()
            self._elect()
            self._refresh_views()
            self._fetch_blobs()
            self._revoke_old_leases()
        except LeaseLostError as exc:
            self._failed(exc)
            with self._lock:
                self._lease_id = None  # granted again next round; everything is written again under it
            self._wake.set()
        except ClusterError as exc:
            self._failed(exc)
        else:
            with self._lock:
                if self._last_error is not None:
                    logger.info("cluster plane: etcd is reachable again (%s)", self._store.endpoint)
                self._rounds += 1
                self._round_ok_at_s, self._last_error = self._clock(), None

    def _failed(self, exc: ClusterError) -> None:
        with self._lock:
            if self._last_error is None:
                logger.warning("cluster plane: %s (serving the last views)", exc)
            self._errors += 1
            self._last_error = str(exc)

    def _ensure_lease(self) -> None:
        """Keep our lease alive when due; grant a new one when there is none or ours lapsed."""
        if self._lease_id is not None:
            self._keep_alive_if_due(self._lease_id)
        if self._lease_id is None:
            self._grant_lease()

    def _keep_alive_if_due(self, lease_id: int) -> None:
        """Renew the lease every third of the TTL. One that lapsed here (no renewal for a whole TTL, so the
        views were reported expired) is never revived, even if etcd still knows it: it is replaced."""
        ttl_s, started_s = self.config.lease_ttl_s, self._clock()
        with self._lock:
            last_s = self._kept_alive_at_s
        if last_s is not None and started_s - last_s < self.config.keepalive_interval_s:
            return
        if last_s is not None and started_s - last_s < ttl_s:
            self._store.keep_alive(lease_id)
            if self._clock() - last_s < ttl_s:
                with self._lock:
                    self._kept_alive_at_s = started_s
                return
        self._old_leases.append(lease_id)
        with self._lock:
            self._lease_id = None

    def _grant_lease(self) -> None:
        """A new lease; everything this node wants in etcd is written again under it."""
        ttl_s, started_s = self.config.lease_ttl_s, self._clock()
        lease_id = self._store.grant_lease(ttl_s)
        with self._lock:
            self._lease_id, self._grants = lease_id, self._grants + 1
            self._kept_alive_at_s = started_s
            self._written.clear()
        logger.info("cluster plane: lease %x granted (TTL %d s) by %s", lease_id, ttl_s, self.endpoint)

    def _claim_node_name(self) -> None:
        """Hold `<prefix>/nodes/<node>` under the current lease (see module); `NodeNameTakenError` while
        another daemon's lease holds it."""
        lease_id = self._lease_id
        assert lease_id is not None
        if self._claimed_under == lease_id:
            return
        key, node = node_name_key(self.config.prefix, self.config.node_name), self.config.node_name
        created, _revision = self._store.txn([compare_create(key, 0)], [put_op(key, node, lease_id)])
        if not created:
            held = [entry for entry in self._store.range_prefix(key)[1] if entry.key == key]
            if held and held[0].lease_id not in (0, lease_id, *self._old_leases):
                raise NodeNameTakenError(
                    f"node name {node} is held under another lease ({held[0].lease_id:x}): another perseusd "
                    "runs with this node name (set cluster_node_name), or this node's previous run, whose "
                    f"lease expires within {self.config.lease_ttl_s} s; publishing nothing until then"
                )
            self._store.put(key, node, lease_id)
        self._claimed_under = lease_id

    @property
    def endpoint(self) -> str:
        """The etcd endpoint the plane talks to now."""
        return self._store.endpoint

    def _sync_keys(self) -> None:
        with self._lock:
            deletes = sorted(self._to_delete)
            writes = {k: v for k, v in self._desired.items() if self._written.get(k) != v}
        for key in deletes:
            self._store.delete(key)
            with self._lock:
                self._written.pop(key, None)
                if key not in self._desired:
                    self._to_delete.discard(key)
        assert self._lease_id is not None
        for key, value in writes.items():
            self._store.put(key, value, self._lease_id)
            with self._lock:
                self._written[key] = value

    def _refresh_views(self) -> None:
        """Re-read the jobs that changed, and every job every quarter TTL (see module)."""
        now_s = self._clock()
        with self._lock:
            jobs = sorted(self._followed)
            changed, self._changed = self._changed, set()
        self._watch(jobs)
        last_s = self._views_read_at_s
        every = last_s is None or now_s - last_s >= self.config.lease_ttl_s / 4
        todo = [job for job in jobs if every or job in changed or job not in self._views]
        for position, job in enumerate(todo):
            started_s = self._clock()
            try:
                entries = self._store.get_prefix(job_prefix(self.config.prefix, job))
            except ClusterError:
                with self._lock:
                    self._changed |= set(todo[position:])  # read again next round
                raise
            self.view_reads += 1
            pipelines, stragglers, span, skipped = build_full_view(job, self.config.prefix, entries)
            with self._lock:
                if job in self._followed:
                    self._views[job] = _View(pipelines, stragglers, started_s, span)
                self._skipped += skipped
        if every:
            self._views_read_at_s = now_s

    def _watch(self, jobs: list[str]) -> None:
        """One watch per followed job (started and stopped here, on the plane's thread)."""
        for job in [j for j in self._watches if j not in jobs]:
            self._watches.pop(job).stop()
        for job in [j for j in jobs if j not in self._watches]:
            prefix = job_prefix(self.config.prefix, job)
            watch = RangeWatch(
                self.config.parsed_endpoints,
                prefix,
                prefix_end(prefix),
                functools.partial(self._job_changed, job),
                self.config.timeout_s,
                name="perseusd-cluster-watch",
            )
            watch.start()
            self._watches[job] = watch

    def _job_changed(self, job: str, _events: object) -> None:
        with self._lock:
            self._changed.add(job)
        self._wake.set()

    def _elect(self) -> None:
        """Campaign for the jobs without a leader; give back the roles resigned."""
        with self._lock:
            resigns, self._resigns = set(self._resigns), set()
            candidates = [
                job
                for job in sorted(self._campaigns)
                if (view := self._views.get(job)) is None or view.span is None or view.span.leader is None
            ]
        node, prefix = self.config.node_name, self.config.prefix
        for job in sorted(resigns):
            span_sync.resign(self._store, prefix, job, node)
        assert self._lease_id is not None
        for job in candidates:
            if span_sync.campaign(self._store, prefix, job, node, self._lease_id):
                logger.info("cluster plane: this node now solves and re-plans job %s", job)

    def _fetch_blobs(self) -> None:
        with self._lock:
            wanted = dict(self._wanted_blobs)
        for (job, digest), ref in wanted.items():
            try:
                data = span_sync.fetch_blob(self._store, self.config.prefix, job, ref)
            except ValueError as exc:  # not (completely) written yet: asked again next round
                logger.debug("cluster plane: blob %s of job %s: %s", ref.name, job, exc)
                continue
            with self._lock:
                if self._wanted_blobs.pop((job, digest), None) is not None:
                    self._blobs[(job, digest)] = data
                    for old in list(self._blobs)[:-MAX_BLOBS]:
                        del self._blobs[old]

    def _revoke_old_leases(self) -> None:
        while self._old_leases:
            with contextlib.suppress(LeaseLostError):  # it expired by itself: nothing left to clean
                self._store.revoke(self._old_leases[-1])
            self._old_leases.pop()


class NodeNameTakenError(ClusterError):
    """Another daemon's lease holds this node's name in the cluster plane."""


def node_name_key(prefix: str, node: str) -> str:
    """The key a node's plane holds its name under."""
    return f"{prefix}/nodes/{check_name('node', node)}"
