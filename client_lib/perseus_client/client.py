"""`PerseusClient`: what a training process uses to talk to perseusd (pyzmq and the protocol module only).

The client never harms training. By default it **fails open**: a daemon that is absent, stopped, restarting,
upgrading or refusing leaves the job running unmanaged, at the GPUs' own clocks:

- Events (computation and step begin/end) never block or raise: without a daemon session they are dropped
  and counted (`events_dropped`), at a fraction of a sent event's cost.
- Calls that change something (connect/hello, claim, release, set_clock, set_plan, clear_plan, register,
  set_policy, profile_import, announce/clear_straggler) log a warning and return None (claim: (), set_plan:
  0, clear_plan: False) when the daemon is out of reach or refuses; they are counted in `calls_skipped`.
  A client that cannot reach the daemon at start logs one warning naming the cause.
- Calls that ask for something (status, jobs, frontier, plan, profile_export, event_count) raise
  `PerseusClientError`: there is no answer to return.
- Arguments that are wrong whatever the daemon says (a negative pipeline, a straggler factor below 1) raise
  `ValueError` before anything is sent.

A monitor thread watches the connection: when the daemon (re)appears, the client says hello again and
replays what it asked, the calls skipped while the daemon was away included (claims, plans, registrations,
imported profiles, policies: `perseus_client.session`); a job the daemon finds in its cache runs its plan at
once, without profiling. `strict=True`, or `PERSEUSD_CLIENT_STRICT=1`, makes every control call raise
`PerseusClientError` instead (and the constructor too, when the daemon cannot be reached).

Events go to a daemon of protocol 6.10 or later as datagrams on its SOCK_SEQPACKET event socket: one
non-blocking send(2) from the training thread, no queue and no I/O thread (`perseus_client.seqpacket`); to an
older daemon, or where that socket cannot be opened, on ZeroMQ's event socket as before.

Send events from one thread per client (ZeroMQ sockets are not thread-safe); control calls are locked.

`PerseusClient` puts its parts together: its state, sockets and sessions (`perseus_client.connection`), its
control calls (`perseus_client.control_calls`) and its events (`perseus_client.event_sending`); here it
connects, closes, and names the GPU this process computes on.
"""

from __future__ import annotations

import os
from pathlib import Path

import zmq

from perseus_client import devices, reach
from perseus_client.closing import Closing
from perseus_client.connection import CLIENT_VERSION
from perseus_client.control_calls import ControlCalls
from perseus_client.event_sending import EventSending
from perseus_client.link import PerseusClientError, unreachable
from perseus_client.protocol import CONTROL_SOCKET_NAME, HelloOk

__all__ = ["CLIENT_VERSION", "DEFAULT_RUNTIME_DIR", "PerseusClient", "PerseusClientError"]

DEFAULT_RUNTIME_DIR = reach.DEFAULT_RUNTIME_DIR
CONNECT_PROBE_S = 0.05
"""At connect, how long the link may take before the client looks at why (a daemon that is up connects in
well under this; one that is not there fails at once instead of after the whole timeout)."""


class PerseusClient(EventSending, ControlCalls, Closing):
    """A connection to perseusd from one training process.

    Args:
        runtime_dir: the daemon's runtime directory (its sockets live there); default
            `$PERSEUSD_RUNTIME_DIR`, else `/run/perseusd`.
        job: a name for this job, shown in `perseusctl status`.
        timeout_s: the timeout of each control call.
        connect: connect and say hello now (otherwise call `connect()`).
        strict: raise `PerseusClientError` when the daemon is out of reach or refuses, instead of going on
            unmanaged; default `$PERSEUSD_CLIENT_STRICT` (1/true/yes), else False (fail open).

    Attributes:
        managed: whether the client has a session with the daemon now.
        calls_skipped: control calls that did nothing (fail-open: daemon away or refusing).
        events_sent, events_dropped, events_lost: see `close()`.
        reconnects: sessions the monitor opened by itself (the daemon came back, or came up late).
    """

    def __init__(
        self,
        runtime_dir: str | os.PathLike[str] | None = None,
        job: str = "",
        *,
        timeout_s: float = 2.0,
        connect: bool = True,
        strict: bool | None = None,
    ) -> None:
        super().__init__(
            Path(reach.runtime_dir(runtime_dir)),
            job or f"pid-{os.getpid()}",
            timeout_s,
            reach.strict_from_env() if strict is None else strict,
        )
        if connect:
            try:
                self.connect()
            except BaseException:
                self.close()
                raise

    # ------------------------------------------------------------------ connection

    def connect(self) -> HelloOk | None:
        """Open the sockets and say hello. Fail-open: None (and one warning) when the daemon cannot be
        reached; the client keeps trying in the background. Strict: raises `PerseusClientError`."""
        with self._lock:
            self._wanted = True
            if self._ctx is None:
                self._open_sockets()
            assert self._control is not None
            if not self.strict and not self._control.poll(int(CONNECT_PROBE_S * 1000), zmq.POLLOUT):
                cause = reach.diagnose(str(self.runtime_dir), CONTROL_SOCKET_NAME)
                if not isinstance(cause, reach.NotAnswering):  # absent, closed, elsewhere: fail at once
                    self._went_away(PerseusClientError(cause.code, cause.message, reached=False))
                    return None
            return self._act("hello", self._open)

    def close(self) -> None:
        """Close the sockets (the daemon restores this process's GPUs when it exits anyway). Never raises
        because of the daemon.

        Events still queued get up to `CLOSE_SETTLE_S` (`perseus_client.event_sending`) to reach the daemon;
        those that did not are counted in `events_lost` (the daemon says how many it read), so
        `events_sent - events_lost` arrived.
        """
        self._closing.set()
        if self._monitor is not None:
            self._monitor.join(timeout=1.0)
        with self._lock:
            self._send_held()
            self._settle_events()
            if self._control is not None:
                self._control.close(linger=0)
            if self._events is not None:
                self._events.close(linger=0)
            self._use_datagrams(None)
            if self._ctx is not None:
                self._ctx.term()
            self._ctx = self._control = self._events = None
            self.managed = False

    def gpu_uuid(self, device: int | None = None) -> str | None:
        """The UUID of the CUDA device this process computes on (`device`: its CUDA index, default torch's
        current device, else `LOCAL_RANK`, else 0), right under any `CUDA_VISIBLE_DEVICES` remapping.

        torch's own view where this process has CUDA through torch (no daemon needed); otherwise NVML's
        view of `CUDA_VISIBLE_DEVICES` through the daemon's GPU list (`perseus_client.devices`; a whole UUID
        there needs no list). In a container, the daemon's list is of the container's GPUs in its own order
        (`HelloOk.visible_gpus`): device 0 is the first GPU it was given. Without either: None (fail-open) or
        `PerseusClientError` (strict). Raises
        `DeviceLookupError` when the device is not visible or not a whole GPU.
        """
        uuid = devices.cuda_uuid(device)
        if uuid is not None:
            return uuid
        info = self.daemon_info
        visible = os.environ.get(devices.VISIBLE_ENV)
        index = devices.default_device() if device is None else device
        if info is None:
            whole = devices.visible_full_uuid(index, visible)  # named by UUID: no list needed
            if whole is not None:
                return whole
            if self.strict:
                raise unreachable(self, None, "no daemon session: the GPU list is the daemon's")
            return None
        gpus = info.gpus
        if info.visible_gpus is not None:  # in a container: its own GPUs, in its order (docs/containers.md)
            by_uuid = {gpu.uuid: gpu for gpu in info.gpus}
            gpus = tuple(by_uuid[uuid] for uuid in info.visible_gpus if uuid in by_uuid)
        return devices.visible_uuid(
            index,
            [gpu.uuid for gpu in gpus],
            visible,
            node_names=[gpu.name for gpu in gpus],
            order=os.environ.get(devices.ORDER_ENV),
        )
