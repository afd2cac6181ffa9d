"""A test's own ZeroMQ sockets on a daemon's runtime directory: connected with linger 0, in a context that is
destroyed when the test is done with them (unsent frames are dropped, nothing blocks)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import zmq

Context = zmq.Context[zmq.Socket[bytes]]


@contextmanager
def zmq_context() -> Iterator[Context]:
    """A context for the sockets of a `with`; destroyed (its sockets closed, linger 0) on exit."""
    ctx: Context = zmq.Context()
    try:
        yield ctx
    finally:
        ctx.destroy(linger=0)


def connected(ctx: Context, kind: int, path: Path) -> zmq.Socket[bytes]:
    """A socket of `kind` connected to the IPC socket at `path`, dropping what is unsent when closed."""
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(f"ipc://{path}")
    return sock
