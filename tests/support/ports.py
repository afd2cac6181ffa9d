"""Free loopback TCP ports for the servers tests start (etcd members, Slurm daemons, metrics endpoints)."""

from __future__ import annotations

import socket


def free_ports(count: int) -> list[int]:
    """`count` distinct free TCP ports on 127.0.0.1 (bound, read, released)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()
