"""The documents a spanning job's nodes exchange as blobs, and how the leader merges the nodes' profiles.

- A node's *share*: the profile it measured of its stages (its rows), each stage's learned order (a job of
  the `observed` schedule), and the waiting power by held clock its GPUs measured (an idle GPU draws less at
  a lower clock: the solve judges each wait at the clock held in it, as on one node). Stage numbers are the
  job's (profile stages, chunks included).
- The *solution*: the frontier the leader solved (a `perseus-frontier` document), the merged profile and its
  blocking power; every node runs its stages' part of it.

Pure data: no I/O.
"""

from __future__ import annotations

import io
import json
import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from perseusd.errors import PerseusError
from perseusd.jobs.shape import StageOrder, step_of
from perseusd.planner.dag import Instruction
from perseusd.planner.plan import Frontier, frontier_to_document
from perseusd.planner.plan_read import parse_frontier
from perseusd.planner.profile import Measurement, Profile
from perseusd.planner.profile_csv import WaitingPoints, profile_to_csv, read_profile_stream
from perseusd.planner.waiting import pooled_by_clock

SHARE_FORMAT = "perseus-span-share"
SOLUTION_FORMAT = "perseus-span-solution"


class ShareError(PerseusError):
    """A blob is not a share or solution this version reads."""


NodeShare = tuple[Profile, Mapping[int, StageOrder], WaitingPoints]
"""A decoded share: the node's profile, its stages' learned orders, its waiting power by held clock."""


def encode_share(profile: Profile, orders: Mapping[int, StageOrder], waiting_w: WaitingPoints = ()) -> bytes:
    doc = {
        "format": SHARE_FORMAT,
        "version": 1,
        "source": profile.source,
        "rows": [
            [m.stage, m.instruction.value, m.freq_mhz, m.time_s, m.energy_j] for m in profile.measurements
        ],
        "orders": {str(stage): [[i.value, mb, c] for i, mb, c in order] for stage, order in orders.items()},
        "waiting_w": [[clock_mhz, watts] for clock_mhz, watts in waiting_w],
    }
    return json.dumps(doc, sort_keys=True).encode()


def decode_share(data: bytes) -> NodeShare:
    """A node's share; one without waiting powers (an older node's) has none."""
    doc = _document(data, SHARE_FORMAT)
    try:
        profile = Profile.from_measurements((_row(row) for row in doc["rows"]), str(doc["source"]))
        orders = {
            int(stage): tuple(step_of(str(i), int(mb), int(c)) for i, mb, c in order)
            for stage, order in doc["orders"].items()
        }
        waiting_w = tuple(_waiting_point(point) for point in doc.get("waiting_w", ()))
    except (PerseusError, KeyError, TypeError, ValueError) as exc:
        raise ShareError(f"a profile share does not decode: {exc}") from None
    return profile, orders, waiting_w


def _waiting_point(point: Any) -> tuple[int, float]:
    clock_mhz, watts = point
    if not isinstance(clock_mhz, int) or isinstance(clock_mhz, bool) or clock_mhz <= 0:
        raise ValueError(f"bad waiting power {point!r}")
    watts = float(watts)
    if not (math.isfinite(watts) and watts >= 0):
        raise ValueError(f"bad waiting power {point!r}")
    return clock_mhz, watts


def _row(row: Any) -> Measurement:
    """One share row (the stages of one node: numbered as the job's, so they need not start at 0)."""
    stage, instruction, clock_mhz, time_s, energy_j = row
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (stage, clock_mhz)) or stage < 0:
        raise ValueError(f"bad row {row!r}")
    time_s, energy_j = float(time_s), float(energy_j)
    if not (math.isfinite(time_s) and math.isfinite(energy_j) and time_s > 0 and energy_j > 0):
        raise ValueError(f"bad row {row!r}")
    return Measurement(stage, Instruction(instruction), clock_mhz, time_s, energy_j)


def merge_shares(
    shares: Sequence[NodeShare], p_blocks_w: Sequence[float], source: str
) -> tuple[Profile, float, dict[int, StageOrder], WaitingPoints]:
    """One profile from the nodes' shares (each row the mean over the nodes that measured it), the median
    blocking power, every stage's learned order (the first node's) and the waiting power by held clock
    (`merge_waiting`)."""
    rows: dict[tuple[int, Instruction, int], list[Measurement]] = {}
    orders: dict[int, StageOrder] = {}
    for profile, learned, _ in shares:
        for m in profile.measurements:
            rows.setdefault((m.stage, m.instruction, m.freq_mhz), []).append(m)
        for stage, order in learned.items():
            orders.setdefault(stage, order)
    merged = [
        Measurement(
            stage,
            instruction,
            clock_mhz,
            statistics.fmean(m.time_s for m in found),
            statistics.fmean(m.energy_j for m in found),
        )
        for (stage, instruction, clock_mhz), found in sorted(rows.items(), key=lambda kv: _row_key(kv[0]))
    ]
    p_block_w = float(statistics.median(p_blocks_w)) if p_blocks_w else 0.0
    waiting_w = merge_waiting([waiting for _, _, waiting in shares])
    return Profile.from_measurements(merged, source), p_block_w, orders, waiting_w


def merge_waiting(nodes: Sequence[WaitingPoints]) -> WaitingPoints:
    """The nodes' waiting powers by held clock as one: per clock the median over the nodes that measured it,
    made to rise with the clock (`monotone_fit`, each clock weighted by its nodes), as one node pools its
    GPUs' (`Job.measured_waiting_w`). Empty when no node measured any (every wait at the blocking power)."""
    by_clock: dict[int, list[float]] = {}
    for points in nodes:
        for clock_mhz, watts in points:
            by_clock.setdefault(clock_mhz, []).append(watts)
    return pooled_by_clock(by_clock)


def _row_key(key: tuple[int, Instruction, int]) -> tuple[int, str, int]:
    return key[0], key[1].value, -key[2]


def encode_solution(frontier: Frontier, profile: Profile, p_block_w: float) -> bytes:
    doc = {
        "format": SOLUTION_FORMAT,
        "version": 1,
        "frontier": frontier_to_document(frontier),
        "profile_source": profile.source,
        "profile_csv": profile_to_csv(profile),
        "p_block_w": p_block_w,
    }
    return json.dumps(doc, sort_keys=True, allow_nan=False).encode()


def decode_solution(data: bytes, source: str) -> tuple[Frontier, Profile, float]:
    doc = _document(data, SOLUTION_FORMAT)
    try:
        frontier = parse_frontier(json.dumps(doc["frontier"]), source)
        profile = read_profile_stream(io.StringIO(doc["profile_csv"]), str(doc["profile_source"]))
        p_block_w = float(doc["p_block_w"])
    except (PerseusError, KeyError, TypeError, ValueError) as exc:
        raise ShareError(f"the solution {source} does not decode: {exc}") from None
    return frontier, profile, p_block_w


def _document(data: bytes, expected: str) -> dict[str, Any]:
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ShareError(f"not a {expected} document: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != expected or doc.get("version") != 1:
        raise ShareError(f"not a {expected} version 1 document")
    return doc
