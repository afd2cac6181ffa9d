"""The deployment policy: which frontier point a job runs."""

from __future__ import annotations

import pytest

from perseusd.daemon.config import DaemonConfig
from perseusd.errors import InvalidValueError
from perseusd.planner.policy import DEFAULT_POLICY, POLICIES, PointSummary, Policy

# A frontier like the H100's: the fastest point beats all-max (power-capped top clocks) at an energy cost.
POINTS = [
    PointSummary(0, 1.40, 80.0),
    PointSummary(1, 1.10, 88.0),
    PointSummary(2, 1.02, 92.0),
    PointSummary(3, 1.00, 95.0),
    PointSummary(4, 0.98, 101.0),  # fastest
]
ALL_MAX_TIME_S = 1.00


def test_default_is_the_least_energy_no_slower_than_all_max() -> None:
    assert DEFAULT_POLICY == "no_slowdown" == Policy().name == DaemonConfig().default_policy
    chosen = Policy().choose(POINTS, ALL_MAX_TIME_S)
    assert chosen.index == 3
    assert chosen.time_s <= ALL_MAX_TIME_S
    assert chosen.energy_j < Policy("fastest").choose(POINTS, ALL_MAX_TIME_S).energy_j


def test_no_slowdown_counts_a_point_equal_to_all_max_up_to_rounding() -> None:
    assert Policy().choose(POINTS, 1.02 * (1 - 1e-12)).index == 2


def test_no_slowdown_without_all_max_or_fitting_point_is_the_fastest() -> None:
    assert Policy().choose(POINTS, None).index == 4
    assert Policy().choose(POINTS, 0.5).index == 4


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        (Policy("fastest"), 4),
        (Policy("slowdown", 0.05), 2),
        (Policy("time", 1.2), 1),
        (Policy("min_energy"), 0),
    ],
)
def test_named_policies_stay_available(policy: Policy, expected: int) -> None:
    assert policy.choose(POINTS, ALL_MAX_TIME_S).index == expected


def test_a_time_target_is_measured_seconds_so_the_measured_overhead_is_left_for() -> None:
    # A job whose iterations measure 0.1 s more than the plan predicts (time outside its computations):
    # a 1.2 s target leaves 1.1 s of predicted time.
    assert Policy("time", 1.2).choose(POINTS, ALL_MAX_TIME_S, overhead_s=0.1).index == 1
    assert Policy("time", 1.12).choose(POINTS, ALL_MAX_TIME_S, overhead_s=0.1).index == 2
    # The other policies compare predicted times with predicted times: the overhead cancels.
    assert Policy().choose(POINTS, ALL_MAX_TIME_S, overhead_s=0.1).index == 3
    assert Policy("slowdown", 0.05).choose(POINTS, ALL_MAX_TIME_S, overhead_s=0.1).index == 2


def test_unknown_policy_is_refused() -> None:
    with pytest.raises(InvalidValueError, match="no_slowdown"):
        Policy("cheapest")
    assert "no_slowdown" in POLICIES


def test_the_registry_holds_every_policy_the_protocol_names() -> None:
    from typing import get_args

    from perseus_client.message import Policy as PolicyName

    from perseusd.planner.policy import REGISTRY

    assert tuple(REGISTRY) == get_args(PolicyName)


@pytest.mark.parametrize(
    ("name", "target", "refused"),
    [("slowdown", -0.01, "slowdown fraction"), ("carbon", 11.0, "slowdown fraction"), ("time", 0.0, "> 0")],
)
def test_a_target_out_of_its_range_is_refused_by_its_registered_kind(
    name: str, target: float, refused: str
) -> None:
    with pytest.raises(InvalidValueError, match=refused):
        Policy(name, target)
