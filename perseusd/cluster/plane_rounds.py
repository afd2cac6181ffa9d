"""`PlaneRounds`: the cluster plane's thread, the only one that talks to etcd (`perseusd.cluster.plane`).

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

What the rounds read and write in memory is the `PlaneState` shared with the daemon's side, under its lock.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Callable

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
from perseusd.cluster.job_board import build_full_view
from perseusd.cluster.plane_state import LastView, PlaneState
from perseusd.cluster.span_board import check_name, job_prefix

logger = logging.getLogger(__name__)

MAX_BLOBS = 16
"""Fetched blobs kept (the newest); a job needs one solution and, on its leader, each node's profile."""

ROUNDS_PER_INTERVAL_MAX = 4
"""Publications wake the thread at once, but rounds never start more often than this per interval."""


class PlaneRounds:
    """The plane's thread: its rounds against etcd until it is asked to stop (see module)."""

    def __init__(
        self,
        config: ClusterConfig,
        store: EtcdStore,
        state: PlaneState,
        clock: Callable[[], float],
    ) -> None:
        self._config = config
        self._store, self._state, self._clock = store, state, clock
        self._stopping = threading.Event()
        self._revoke_on_stop = True
        # Owned by the thread.
        self._claimed_under: int | None = None
        """The lease this node's name is claimed under (None: not claimed yet)."""
        self._old_leases: list[int] = []
        self._watches: dict[str, RangeWatch] = {}
        self._views_read_at_s: float | None = None
        self.view_reads = 0

    # -- life cycle --------------------------------------------------------------------------------

    def request_stop(self, revoke: bool) -> None:
        """Ask the thread to end after its round, revoking the lease with `revoke` (`ClusterPlane.stop`)."""
        self._revoke_on_stop = revoke
        self._stopping.set()
        self._state.wake.set()

    def run(self) -> None:
        """The thread's body: rounds until `request_stop`, then stop the watches and close the store."""
        wake = self._state.wake
        min_gap_s = self._config.refresh_interval_s / ROUNDS_PER_INTERVAL_MAX
        while not self._stopping.is_set():
            wake.clear()
            self._round()
            if self._stopping.wait(min_gap_s):
                break
            wake.wait(self._config.refresh_interval_s - min_gap_s)
        self._shut_down()

    def _shut_down(self) -> None:
        for watch in self._watches.values():
            watch.stop()
        if self._revoke_on_stop and self._state.lease_id is not None:
            try:
                self._store.revoke(self._state.lease_id)
            except ClusterError as exc:
                logger.warning(
                    "cluster plane: could not revoke lease %x on stop: %s", self._state.lease_id, exc
                )
        self._store.close()

    # -- one round ---------------------------------------------------------------------------------

    def _round(self) -> None:
        state = self._state
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
            with state.lock:
                state.lease_id = None  # granted again next round; everything is written again under it
            state.wake.set()
        except ClusterError as exc:
            self._failed(exc)
        else:
            with state.lock:
                if state.last_error is not None:
                    logger.info("cluster plane: etcd is reachable again (%s)", self._store.endpoint)
                state.rounds += 1
                state.round_ok_at_s, state.last_error = self._clock(), None

    def _failed(self, exc: ClusterError) -> None:
        state = self._state
        with state.lock:
            if state.last_error is None:
                logger.warning("cluster plane: %s (serving the last views)", exc)
            state.errors += 1
            state.last_error = str(exc)

    def _ensure_lease(self) -> None:
        """Keep our lease alive when due; grant a new one when there is none or ours lapsed."""
        if self._state.lease_id is not None:
            self._keep_alive_if_due(self._state.lease_id)
        if self._state.lease_id is None:
            self._grant_lease()

    def _keep_alive_if_due(self, lease_id: int) -> None:
        """Renew the lease every third of the TTL. One that lapsed here (no renewal for a whole TTL, so the
        views were reported expired) is never revived, even if etcd still knows it: it is replaced."""
        state, ttl_s, started_s = self._state, self._config.lease_ttl_s, self._clock()
        with state.lock:
            last_s = state.kept_alive_at_s
        if last_s is not None and started_s - last_s < self._config.keepalive_interval_s:
            return
        if last_s is not None and started_s - last_s < ttl_s:
            self._store.keep_alive(lease_id)
            if self._clock() - last_s < ttl_s:
                with state.lock:
                    state.kept_alive_at_s = started_s
                return
        self._old_leases.append(lease_id)
        with state.lock:
            state.lease_id = None

    def _grant_lease(self) -> None:
        """A new lease; everything this node wants in etcd is written again under it."""
        state, ttl_s, started_s = self._state, self._config.lease_ttl_s, self._clock()
        lease_id = self._store.grant_lease(ttl_s)
        with state.lock:
            state.lease_id, state.grants = lease_id, state.grants + 1
            state.kept_alive_at_s = started_s
            state.written.clear()
        logger.info("cluster plane: lease %x granted (TTL %d s) by %s", lease_id, ttl_s, self._store.endpoint)

    def _claim_node_name(self) -> None:
        """Hold `<prefix>/nodes/<node>` under the current lease (see module); `NodeNameTakenError` while
        another daemon's lease holds it."""
        lease_id = self._state.lease_id
        assert lease_id is not None
        if self._claimed_under == lease_id:
            return
        key, node = node_name_key(self._config.prefix, self._config.node_name), self._config.node_name
        created, _revision = self._store.txn([compare_create(key, 0)], [put_op(key, node, lease_id)])
        if not created:
            held = [entry for entry in self._store.range_prefix(key)[1] if entry.key == key]
            if held and held[0].lease_id not in (0, lease_id, *self._old_leases):
                raise NodeNameTakenError(
                    f"node name {node} is held under another lease ({held[0].lease_id:x}): another perseusd "
                    "runs with this node name (set cluster_node_name), or this node's previous run, whose "
                    f"lease expires within {self._config.lease_ttl_s} s; publishing nothing until then"
                )
            self._store.put(key, node, lease_id)
        self._claimed_under = lease_id

    def _sync_keys(self) -> None:
        state = self._state
        with state.lock:
            deletes = sorted(state.to_delete)
            writes = {k: v for k, v in state.desired.items() if state.written.get(k) != v}
        for key in deletes:
            self._store.delete(key)
            with state.lock:
                state.written.pop(key, None)
                if key not in state.desired:
                    state.to_delete.discard(key)
        assert state.lease_id is not None
        for key, value in writes.items():
            self._store.put(key, value, state.lease_id)
            with state.lock:
                state.written[key] = value

    def _refresh_views(self) -> None:
        """Re-read the jobs that changed, and every job every quarter TTL (see module)."""
        state, now_s = self._state, self._clock()
        with state.lock:
            jobs = sorted(state.followed)
            changed, state.changed = state.changed, set()
        self._watch(jobs)
        last_s = self._views_read_at_s
        every = last_s is None or now_s - last_s >= self._config.lease_ttl_s / 4
        todo = [job for job in jobs if every or job in changed or job not in state.views]
        for position, job in enumerate(todo):
            started_s = self._clock()
            try:
                entries = self._store.get_prefix(job_prefix(self._config.prefix, job))
            except ClusterError:
                with state.lock:
                    state.changed |= set(todo[position:])  # read again next round
                raise
            self.view_reads += 1
            pipelines, stragglers, span, skipped = build_full_view(job, self._config.prefix, entries)
            with state.lock:
                if job in state.followed:
                    state.views[job] = LastView(pipelines, stragglers, started_s, span)
                state.skipped += skipped
        if every:
            self._views_read_at_s = now_s

    def _watch(self, jobs: list[str]) -> None:
        """One watch per followed job (started and stopped here, on the plane's thread)."""
        for job in [j for j in self._watches if j not in jobs]:
            self._watches.pop(job).stop()
        for job in [j for j in jobs if j not in self._watches]:
            prefix = job_prefix(self._config.prefix, job)
            watch = RangeWatch(
                self._config.parsed_endpoints,
                prefix,
                prefix_end(prefix),
                functools.partial(self._job_changed, job),
                self._config.timeout_s,
                name="perseusd-cluster-watch",
            )
            watch.start()
            self._watches[job] = watch

    def _job_changed(self, job: str, _events: object) -> None:
        with self._state.lock:
            self._state.changed.add(job)
        self._state.wake.set()

    def _elect(self) -> None:
        """Campaign for the jobs without a leader; give back the roles resigned."""
        state = self._state
        with state.lock:
            resigns, state.resigns = set(state.resigns), set()
            candidates = [
                job
                for job in sorted(state.campaigns)
                if (view := state.views.get(job)) is None or view.span is None or view.span.leader is None
            ]
        node, prefix = self._config.node_name, self._config.prefix
        for job in sorted(resigns):
            span_sync.resign(self._store, prefix, job, node)
        assert state.lease_id is not None
        for job in candidates:
            if span_sync.campaign(self._store, prefix, job, node, state.lease_id):
                logger.info("cluster plane: this node now solves and re-plans job %s", job)

    def _fetch_blobs(self) -> None:
        state = self._state
        with state.lock:
            wanted = dict(state.wanted_blobs)
        for (job, digest), ref in wanted.items():
            try:
                data = span_sync.fetch_blob(self._store, self._config.prefix, job, ref)
            except ValueError as exc:  # not (completely) written yet: asked again next round
                logger.debug("cluster plane: blob %s of job %s: %s", ref.name, job, exc)
                continue
            with state.lock:
                if state.wanted_blobs.pop((job, digest), None) is not None:
                    state.blobs[(job, digest)] = data
                    for old in list(state.blobs)[:-MAX_BLOBS]:
                        del state.blobs[old]

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
