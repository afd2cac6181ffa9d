"""`PoolWatches`: the etcd watches that wake a pool agent's rounds (`RangeWatch`s, each on its own thread).

Every node watches two ranges: its own grant (a new value is handed to the agent from the event itself, so
it is applied without a read: the allocator's moves reach a thousand nodes at once; a deletion, or a
reconnection, asks for a read), and the allocator key and the budget, deletions only. While a node
allocates it also watches the requested budget and the reports' deletions (a node's lease expiring, or the
node leaving), so that it acts on those at once rather than at its next round: one node's two streams, not
every node's. Each event sets the agent's wake event (`perseusd.pool.agent`).
"""

from __future__ import annotations

import base64
import threading
from typing import TYPE_CHECKING, Any

from perseusd.cluster.config import ClusterConfig
from perseusd.cluster.etcd_store import prefix_end
from perseusd.pool.keys import PoolKeys, decode_grant

if TYPE_CHECKING:
    from perseusd.cluster.etcd_watch import RangeWatch


class PoolWatches:
    """A node's watches on its pool (see module); `enabled=False`: none (the agent reads every round)."""

    def __init__(self, cluster: ClusterConfig, keys: PoolKeys, wake: threading.Event, enabled: bool) -> None:
        self._cluster, self._keys, self._wake = cluster, keys, wake
        self._lock = threading.Lock()
        self._pushed: tuple[float, int, int] | None = None
        """(grant W, lease, revision) from this node's grant watch, not applied yet."""
        self._pushed_read = False
        self._watches = self._make_watches() if enabled else []
        self.leader_watches: list[RangeWatch] = []
        """While this node allocates: its watches on the requested budget and on reports vanishing."""

    def start(self) -> None:
        for watch in self._watches:
            watch.start()

    def stop(self) -> None:
        """Stop the node's own watches (the allocator's stop when the agent's thread ends)."""
        for watch in self._watches:
            watch.stop()

    def stop_leader_watches(self) -> None:
        """Stop the allocator's watches: the agent's thread ends."""
        for watch in self.leader_watches:
            watch.stop()

    @property
    def enabled(self) -> bool:
        """Whether this node watches (else every round reads)."""
        return bool(self._watches)

    def take_pushed(self) -> tuple[tuple[float, int, int] | None, bool]:
        """The grant the watch brought since the last call ((grant W, lease, revision); None: none), and
        whether the watch asks for a read (its grant deleted, or unreadable, or the watch reconnected)."""
        with self._lock:
            pushed, must_read = self._pushed, self._pushed_read
            self._pushed, self._pushed_read = None, False
        return pushed, must_read

    def _make_watches(self) -> list[RangeWatch]:
        from perseusd.cluster.etcd_watch import NO_PUT, RangeWatch

        endpoints, timeout_s = self._cluster.parsed_endpoints, self._cluster.timeout_s
        keys = self._keys
        return [
            RangeWatch(
                endpoints,
                keys.grant(self._cluster.node_name),
                None,
                self._grant_event,
                timeout_s,
                name="pool-grant",
            ),
            # "allocator" < "budget/..." < "grants/": the allocator key and the budgets, nothing else.
            RangeWatch(
                endpoints,
                keys.allocator,
                prefix_end(keys.root + "budget/"),
                self._woken,
                timeout_s,
                filters=(NO_PUT,),
                name="pool-budget",
            ),
        ]

    def follow_leadership(self, leader: bool) -> None:
        """Open the allocator's own watches when this node becomes the allocator (a budget requested, a
        node's report gone: its lease expired or it left), close them when it no longer is."""
        leader = leader and bool(self._watches)
        if leader == bool(self.leader_watches):
            return
        if not leader:
            for watch in self.leader_watches:
                watch.stop()
            self.leader_watches = []
            return
        from perseusd.cluster.etcd_watch import NO_PUT, RangeWatch

        endpoints, timeout_s, keys = self._cluster.parsed_endpoints, self._cluster.timeout_s, self._keys
        self.leader_watches = [
            RangeWatch(endpoints, keys.request, None, self._woken, timeout_s, name="pool-request"),
            RangeWatch(
                endpoints,
                keys.nodes,
                prefix_end(keys.nodes),
                self._woken,
                timeout_s,
                filters=(NO_PUT,),
                name="pool-reports-gone",
            ),
        ]
        for watch in self.leader_watches:
            watch.start()

    def _woken(self, _events: object) -> None:
        self._wake.set()

    def _grant_event(self, events: list[dict[str, Any]]) -> None:
        """This node's grant changed: a new value is handed to the agent from the event itself, without a
        read; a deletion, or a reconnection, makes a read."""
        pushed = None
        if events and events[-1].get("type", "PUT") == "PUT":
            kv = events[-1].get("kv", {})
            try:
                grant_w = decode_grant(base64.b64decode(kv.get("value", "")))
                pushed = (grant_w, int(kv.get("lease", 0)), int(kv.get("mod_revision", 0)))
            except (ValueError, TypeError):
                pushed = None
        with self._lock:
            self._pushed = pushed
            self._pushed_read = pushed is None
        self._wake.set()
