"""The wire protocol's version, (major, minor), separate from the package version (stdlib only).

- The **major** is the frame's `"v"`. A side refuses a major it does not speak, with an error reply that
  every version can decode (see docs/protocol.md) and that says which side to upgrade.
- The **minor** grows with every additive change: a new message type, a new field with a default, a new
  error code. A frame says the minor it is written in as `"m"` (left out for minor 0, so a minor-0 frame is
  exactly a frame of protocol 6 as first released). The daemon answers in the smaller of the request's minor
  and its own, leaving out the fields the requester's minor does not have; the client ignores reply fields
  it does not know. So any client and daemon of the same major work together, each limited to the messages
  of the older one's minor.

Minor history of major 6: 0, protocol 6 as first released (docs/daemon.md lists what each earlier major
added); 1, `protocol_minor` in `hello_ok` and in the daemon's `status` health, the `"m"` frame field; the
`carbon` policy, status's `signal` and a job's `carbon`; the power pool's `admin_pool_set_budget` and
`admin_pool_status`; the node power cap's `admin_set_cap`, `admin_clear_cap`, `admin_cap_status` and
`admin_set_job_priority`; 2, status's `pool` (the node's power pool, to admin callers) and a job's
carbon `unit` (a carbon intensity or a price per kWh); 3, a job's `plan_note` (do no harm: the stages that
run one clock instead of their plan, and why) and its `planning` (how long its plan took from profiling
done to deployed, by phase); 4, `register`'s `stage_gpus` (tensor parallelism)
and `run` (a job's identity across nodes), a job's `stage_gpus` and `span` (a job whose pipelines span
nodes); 5, `hello_ok`'s `visible_gpus` (the GPUs a container holds), the daemon's `monitor_only`, a
lease's `slurm_job`, a GPU row's `power_features`, `slurm_jobs` and the Slurm prolog/epilog's
`admin_slurm_prolog` and `admin_slurm_epilog`;
6, the power pool's budget source, age and signal state (status's `pool`, `pool_status`);
7, a job's own error: `profile_error_pct`, `predicted_saving_pct`, `measured_saving_pct`, `saving_error_pts`
and `accuracy_action`; 8, a GPU row's `index` and `pci_bus_id`, the daemon health's `backend`; the
zero-bubble schedules (`register`'s `schedule` `interleaved_zb` and `zbv`) and the two halves of their split
backward (instructions `backward_input` and `backward_weight`, in events and plans); the power pool's
`admin_pool_release` (an absent node's reservation) and a pool node's `reserved_w` and `absent_since_s`;
9, the event stream's end marker `events_end` (a closing client's "I sent S events", read in stream order),
`event_count_ok`'s `ended_sent` and the daemon health's `events_lost` (what clients sent and it never read);
10, `hello_ok`'s `event_socket`: events as datagrams on a SOCK_SEQPACKET socket, sent without an I/O thread;
11, carried events: `hello`'s `carries`, the daemon's `carry` frames on the event connection (which events
of a GPU may wait for the next one sent) and datagrams of several event frames, one a line.

Adding a message or a field: see docs/protocol.md ("Changing the protocol"); in short, bump
`PROTOCOL_MINOR`, give a new message type `since=PROTOCOL_MINOR` in its class line and a new field of an
existing message a default and `since(N)`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

PROTOCOL_MAJOR = 6
"""The frame's `"v"`. Bump only on a change that older peers cannot read, never for an additive one."""
PROTOCOL_MINOR = 11
"""The newest minor of `PROTOCOL_MAJOR` this library writes and reads."""


def since(minor: int, default: Any = None) -> Any:
    """A dataclass field added in `minor` (with its default: frames of older minors leave it out).

    ``power_capped: bool | None = since(1)``: the encoder leaves it out of replies to older minors, the
    strict decoder of a daemon speaking an older minor refuses it as unknown.
    """
    return dataclasses.field(default=default, metadata={"since": minor})


def version_text(major: int, minor: int) -> str:
    return f"{major}.{minor}"


def unsupported_major(theirs: int, ours_minor: int, *, we_are: str, they_are: str) -> str:
    """The message refusing a frame of major `theirs`: which side speaks what, and which side to upgrade."""
    upgrade = we_are if theirs > PROTOCOL_MAJOR else they_are
    return (
        f"{they_are} speaks protocol {theirs}, {we_are} speaks {PROTOCOL_MAJOR}.0-"
        f"{version_text(PROTOCOL_MAJOR, ours_minor)}: upgrade {upgrade}"
    )
