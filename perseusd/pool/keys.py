"""A power pool's keys in etcd and their JSON values (pure data, no I/O).

Under `{prefix}/power/{pool}/`:

- `budget/request`: the budget an admin set (JSON `{"budget_w", "by", "at_s"}`; no lease; deleted = no cap).
- `budget/active`: the budget the grants are held to; written only by the allocator, in the same transaction
  as the grant moves that make it true (so the sum of grants never exceeds it at any revision).
- `nodes/{node}`: a node's report (demand, floor, priority mix, safe cap, applied grant, measured power),
  attached to the node's lease: it vanishes when the node dies.
- `grants/{node}`: the node's grant (`{"grant_w"}`, and `held_w`, `absent_since_s` while they apply; see
  `GrantRecord`), written by the allocator with no lease: a node whose report vanished (dead, frozen, cut off)
  keeps its grant as a reservation until it returns or an admin releases it (docs/power-pool.md, "Absent
  nodes").
- `allocator`: the allocator's node name, attached to its lease (created only if absent: an election).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field

from perseusd.pool.alloc import NodeNeed

POOL_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def check_pool(pool: str) -> str:
    """`pool` if it is a valid pool name (it becomes a key component), else ValueError."""
    if not POOL_PATTERN.fullmatch(pool):
        raise ValueError(f"pool name {pool!r} must match {POOL_PATTERN.pattern}")
    return pool


@dataclass(frozen=True)
class PoolKeys:
    """The keys of one pool."""

    prefix: str
    pool: str

    @property
    def root(self) -> str:
        return f"{self.prefix}/power/{check_pool(self.pool)}/"

    @property
    def request(self) -> str:
        return self.root + "budget/request"

    @property
    def active(self) -> str:
        return self.root + "budget/active"

    @property
    def allocator(self) -> str:
        return self.root + "allocator"

    @property
    def nodes(self) -> str:
        return self.root + "nodes/"

    @property
    def grants(self) -> str:
        return self.root + "grants/"

    def node(self, node: str) -> str:
        return self.nodes + node

    def grant(self, node: str) -> str:
        return self.grants + node


FRESH, HOLDING, LAPSED = "fresh", "stale: last grants held", "stale: safe caps"


@dataclass(frozen=True)
class Budget:
    """A budget and who set it (`at_s`: when, Unix time). A budget from an external signal (a facility
    controller's file) carries `max_age_s`: older than that it is stale, and the grants are held for `hold_s`
    more before every node falls back to its safe cap (0: an admin's budget, never stale)."""

    budget_w: float
    by: str = ""
    at_s: float = 0.0
    max_age_s: float = 0.0
    hold_s: float = 0.0

    def encode(self) -> str:
        data: dict[str, object] = {"budget_w": self.budget_w, "by": self.by, "at_s": self.at_s}
        if self.max_age_s > 0:
            data |= {"max_age_s": self.max_age_s, "hold_s": self.hold_s}
        return json.dumps(data)

    def freshness(self, now_s: float) -> str:
        """`FRESH`, `HOLDING` (stale, within `hold_s`) or `LAPSED` (stale for longer), at Unix `now_s`."""
        if self.max_age_s <= 0 or now_s - self.at_s <= self.max_age_s:
            return FRESH
        return HOLDING if now_s - self.at_s <= self.max_age_s + self.hold_s else LAPSED


@dataclass(frozen=True)
class NodeReport:
    """What a node publishes about itself (W)."""

    demand_w: float
    floor_w: float
    priority_w: dict[int, float] = field(default_factory=dict)
    safe_cap_w: float = 0.0
    applied_w: float | None = None
    """The grant the node applies now (None: none, uncapped or at its safe cap before its first grant)."""
    power_w: float | None = None
    """Measured node power (None when unknown)."""
    applied_revision: int | None = None
    """The etcd revision of the grant whose watts `applied_w` are (None: no grant applied). The allocator
    takes a lowered grant as applied only once this reaches the lowered grant's revision, so a node may
    report a raised grant late (`applied_w` then lags, never above what the node applies)."""

    def encode(self) -> str:
        data: dict[str, object] = {
            "demand_w": self.demand_w,
            "floor_w": self.floor_w,
            "priority_w": {str(t): w for t, w in sorted(self.priority_w.items())},
            "safe_cap_w": self.safe_cap_w,
            "applied_w": self.applied_w,
            "power_w": self.power_w,
        }
        if self.applied_revision is not None:
            data["applied_revision"] = self.applied_revision
        return json.dumps(data, sort_keys=True)

    def need(self, node: str) -> NodeNeed:
        return NodeNeed(node, self.demand_w, self.floor_w, self.priority_w)


def decode_budget(raw: bytes) -> Budget:
    """A budget value (ValueError if malformed)."""
    data = _object(raw)
    budget_w = _number(data, "budget_w")
    return Budget(
        budget_w,
        str(data.get("by", ""))[:200],
        finite_or_none(data.get("at_s")) or 0.0,
        finite_or_none(data.get("max_age_s")) or 0.0,
        finite_or_none(data.get("hold_s")) or 0.0,
    )


def decode_report(raw: bytes) -> NodeReport:
    """A node report (ValueError if malformed)."""
    data = _object(raw)
    tiers = data.get("priority_w", {})
    if not isinstance(tiers, dict):
        raise ValueError("priority_w must be an object")
    priority_w = {int(t): float(w) for t, w in tiers.items()}
    report = NodeReport(
        _number(data, "demand_w"),
        _number(data, "floor_w"),
        priority_w,
        _number(data, "safe_cap_w"),
        finite_or_none(data.get("applied_w")),
        finite_or_none(data.get("power_w")),
        _revision_or_none(data.get("applied_revision")),
    )
    report.need("check")  # the same checks as the allocator's
    return report


@dataclass(frozen=True)
class GrantRecord:
    """A grant as etcd holds it (W)."""

    grant_w: float
    held_w: float | None = None
    """A higher grant the node may still apply: written with a lower grant, dropped once the node reports it
    applied the lower one (a node that vanishes before it does is held to this)."""
    absent_since_s: float | None = None
    """When the allocator found the node's report gone (Unix time; None while the node reports)."""

    @property
    def reserved_w(self) -> float:
        """What the node's GPUs may draw under this grant (the budget keeps it for an absent node)."""
        return max(self.grant_w, self.held_w or 0.0)

    def encode(self) -> str:
        data: dict[str, float] = {"grant_w": self.grant_w}
        if self.held_w is not None and self.held_w > self.grant_w:
            data["held_w"] = self.held_w
        if self.absent_since_s is not None:
            data["absent_since_s"] = self.absent_since_s
        return json.dumps(data)


def encode_grant(grant_w: float) -> str:
    return GrantRecord(grant_w).encode()


def decode_grant_record(raw: bytes) -> GrantRecord:
    """A grant value (ValueError if malformed)."""
    data = _object(raw)
    return GrantRecord(
        _number(data, "grant_w"),
        finite_or_none(data.get("held_w")),
        finite_or_none(data.get("absent_since_s")),
    )


def decode_grant(raw: bytes) -> float:
    """A grant value's watts (ValueError if malformed)."""
    return decode_grant_record(raw).grant_w


def _object(raw: bytes) -> dict[str, object]:
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    return data


def _number(data: dict[str, object], name: str) -> float:
    value = data.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0")
    return float(value)


def _revision_or_none(value: object) -> int | None:
    """An etcd revision (an integer >= 1), or None for anything else."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def finite_or_none(value: object) -> float | None:
    """A finite number >= 0, or None for anything else (null included)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None
