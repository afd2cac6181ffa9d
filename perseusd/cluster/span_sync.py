"""The cluster plane thread's etcd work for jobs whose pipelines span nodes: the leader election of a job,
giving the role back, and fetching blobs. Each function makes one or two requests; `ClusterError` on failure.
"""

from __future__ import annotations

from perseusd.cluster.etcd_store import EtcdStore, compare_create, compare_value, delete_op, put_op
from perseusd.cluster.span_blobs import join_blob
from perseusd.cluster.span_board import BlobRef, blob_prefix, leader_key
from perseusd.cluster.span_codec import encode_leader


def campaign(store: EtcdStore, prefix: str, job: str, node: str, lease_id: int) -> bool:
    """Become the job's leader if nobody is (create the leader key, attached to `lease_id`); True if won."""
    key = leader_key(prefix, job)
    won, _ = store.txn([compare_create(key, 0)], [put_op(key, encode_leader(node), lease_id)])
    return won


def resign(store: EtcdStore, prefix: str, job: str, node: str) -> None:
    """Delete the job's leader key if it is still this node's (never another node's that won meanwhile)."""
    key = leader_key(prefix, job)
    store.txn([compare_value(key, encode_leader(node))], [delete_op(key)])


def fetch_blob(store: EtcdStore, prefix: str, job: str, ref: BlobRef) -> bytes:
    """The blob's bytes (ValueError when its chunks are incomplete or do not match its digest)."""
    chunk_prefix = f"{blob_prefix(prefix, job, ref.name)}{ref.digest}/"
    chunks: dict[int, bytes] = {}
    for key, value in store.get_prefix(chunk_prefix):
        index = key.removeprefix(chunk_prefix)
        if index.isdigit():
            chunks[int(index)] = value
    return join_blob(ref, chunks)
