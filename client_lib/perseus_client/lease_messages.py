"""Lease messages of the wire protocol: the hello that opens a process's session (and lists the GPUs it may
claim), claiming and releasing GPUs, and the admin's reset; a release or reset says which GPUs were put back
as they were before any lease. `perseus_client.message_types` registers them, `perseus_client.protocol`
re-exports them.
"""

from __future__ import annotations

from dataclasses import dataclass

from perseus_client.message import GpusMessage, JobMessage, Message
from perseus_client.version import since


@dataclass(frozen=True)
class GpuCapabilities:
    """What a client may ask of one GPU."""

    uuid: str
    name: str
    supported_sm_clocks_mhz: tuple[int, ...]
    power_limit_min_w: float
    power_limit_max_w: float
    power_limit_default_w: float
    energy_counter_supported: bool


@dataclass(frozen=True)
class Hello(JobMessage, wire_type="hello"):
    """Client -> daemon: register this process (identity comes from the kernel, never from here)."""

    client_version: str


@dataclass(frozen=True)
class HelloOk(Message, wire_type="hello_ok"):
    daemon_version: str
    protocol: int
    """The daemon's major (the only one it speaks)."""
    gpus: tuple[GpuCapabilities, ...]
    protocol_minor: int = since(1, 0)
    """The newest minor of `protocol` the daemon speaks (it speaks every older one too)."""
    visible_gpus: tuple[str, ...] | None = since(5, None)
    """The UUIDs of the GPUs this process may claim, in its own device order (index 0 first: what
    `CUDA_VISIBLE_DEVICES` indexes in its container); None: every GPU of `gpus`, in their order."""
    event_socket: str | None = since(10, None)
    """The name, in the runtime directory, of the daemon's SOCK_SEQPACKET event socket
    (`SEQPACKET_EVENT_SOCKET_NAME`); None: events go to the ZeroMQ event socket only."""


@dataclass(frozen=True)
class Claim(GpusMessage, wire_type="claim"):
    """Lease GPUs (by UUID) for this process; the original state is saved before any write."""

    job: str


@dataclass(frozen=True)
class ClaimOk(GpusMessage, wire_type="claim_ok"):
    """The GPUs now leased to this process."""


@dataclass(frozen=True)
class Release(GpusMessage, wire_type="release"):
    """Release leases (an empty tuple releases all of this process's leases); GPUs are restored."""


@dataclass(frozen=True)
class RestoreReply(GpusMessage):
    """GPUs put back as they were before any lease (`gpus`), and those whose restore failed (`failed`)."""

    failed: tuple[str, ...]


@dataclass(frozen=True)
class ReleaseOk(RestoreReply, wire_type="release_ok"):
    """The leases released: GPUs restored, and those whose restore failed."""


@dataclass(frozen=True)
class AdminReset(GpusMessage, wire_type="admin_reset"):
    """Admin: restore saved originals, unlock clocks and drop leases (empty tuple: every GPU)."""


@dataclass(frozen=True)
class AdminResetOk(RestoreReply, wire_type="admin_reset_ok"):
    """The GPUs reset, and those whose restore or unlock failed."""
