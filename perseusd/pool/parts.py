"""`PartSender`: the parts of one allocator move that may land in any order, sent to etcd at once.

A move of a thousand grants is nine transactions at etcd's default `--max-txn-ops`. Sent one after another,
each waiting for the one before, the move takes nine round trips through a quorum, while the first parts'
nodes already write their acknowledgements (for lowers) against the next ones. Lowers keep the sum of the
grants within the budget whatever their order, and so do raises once the budget allows them (the
allocator's ordering: the active budget's lowering after every lower, its raising before every raise, a
released grant before the raises that hand out its share), so those parts go together, each on a
connection of its own (`requests` sessions are not shared between threads), each guarded on its own keys.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from perseusd.cluster.etcd_store import EtcdStore, LeaseLostError

MAX_PARTS_AT_ONCE = 8
"""At most this many transactions of one move in flight (the rest queue behind them)."""

Txn = tuple[list[dict[str, Any]], list[dict[str, Any]]]
"""A transaction's comparisons and writes."""


class PartSender:
    """Sends several transactions at once, each on a store of its own thread (made by `make_store`)."""

    def __init__(self, make_store: Callable[[], EtcdStore]) -> None:
        self._make_store = make_store
        self._local = threading.local()
        self._stores: list[EtcdStore] = []
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None

    def send(self, txns: list[Txn]) -> list[tuple[bool, int]]:
        """Each transaction's (applied, revision), in order; one refused for a lease gone is not applied.
        An etcd failure (`ClusterError`) is raised once every transaction has come back."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(MAX_PARTS_AT_ONCE, thread_name_prefix="perseusd-pool-txn")
        futures = [self._pool.submit(self._txn, compares, writes) for compares, writes in txns]
        errors = [f.exception() for f in futures]
        for error in errors:
            if error is not None:
                raise error
        return [f.result() for f in futures]

    def _txn(self, compares: list[dict[str, Any]], writes: list[dict[str, Any]]) -> tuple[bool, int]:
        store: EtcdStore | None = getattr(self._local, "store", None)
        if store is None:
            store = self._make_store()
            self._local.store = store
            with self._lock:
                self._stores.append(store)
        try:
            return store.txn(compares, writes)
        except LeaseLostError:  # a node's lease expired since the read (not ours): read again
            return False, 0

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        with self._lock:
            stores, self._stores = self._stores, []
        for store in stores:
            store.close()
        self._local = threading.local()
