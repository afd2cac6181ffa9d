"""The cluster plane: the daemons of one job share per-pipeline facts through etcd (only when configured).

One node needs none of this. Nothing here is imported unless the daemon is configured with etcd endpoints;
`etcd3gw` (the `cluster` extra) is imported only by `etcd_store`.

- `config`: `ClusterConfig`, the frozen settings the daemon's configuration carries.
- `job_board`: what the daemons share (keys, JSON values, the per-job view), pure data, no I/O.
- `etcd_store`: the etcd client wrapper (endpoint rotation, bounded retries, per-call timeouts).
- `plane`: `ClusterPlane`, the background thread between the daemon's hot path and etcd.
- `plane_state`: `PlaneState`, what the daemon's side and the plane's thread share under one lock.
- `plane_rounds`: `PlaneRounds`, the plane's thread: its lease, node name claim, writes, watches and reads.
- `span_board`: the records and keys of pipelines that span nodes; their JSON in `span_codec` (field checks in
  `span_fields`), a profile's chunks in `span_blobs`; `span_sync`: the plane's etcd work for them (a job's
  leader election, giving the role back, fetching blobs); `etcd_watch`: a watch on a key range, as a wake-up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from perseusd.cluster.config import ClusterConfig
from perseusd.errors import ConfigError

if TYPE_CHECKING:
    from perseusd.cluster.plane import ClusterPlane


def start_plane(config: ClusterConfig) -> ClusterPlane:
    """Build and start the cluster plane (the composition root's one entry point into this package).

    Raises:
        ConfigError: `etcd3gw` is not installed.
    """
    try:
        from perseusd.cluster.plane import ClusterPlane
    except ImportError as exc:
        raise ConfigError(
            f"the cluster plane needs etcd3gw ({exc}): pip install 'perseusd[cluster]', or remove the etcd "
            "endpoints from the configuration to run this node alone"
        ) from exc
    plane = ClusterPlane(config)
    plane.start()
    return plane


__all__ = ["ClusterConfig", "start_plane"]
