"""`benchmarks/planning_step.py`'s comparison of two trees' picks and its case syntax (the timed runs are
the benchmark's, not the tests')."""

from __future__ import annotations

from benchmarks.planning_step import compare_picks, parse_case


def _pick(factor: float, time_s: float, energy_j: float, digest: str) -> dict[str, object]:
    return {"factor": factor, "time_s": time_s, "energy_j": energy_j, "clocks_digest": digest}


def test_picks_are_identical_no_worse_or_worse() -> None:
    theirs = [_pick(1.0, 0.70, 1500.0, "a"), _pick(1.05, 0.73, 1450.0, "b")]
    assert compare_picks(theirs, theirs) == {"identical": True, "no_worse": True}
    better = [_pick(1.0, 0.70, 1499.0, "c"), theirs[1]]
    assert compare_picks(better, theirs) == {"identical": False, "no_worse": True}
    slower = [_pick(1.0, 0.71, 1400.0, "d"), theirs[1]]
    assert compare_picks(slower, theirs) == {"identical": False, "no_worse": False}
    costlier = [theirs[0], _pick(1.05, 0.72, 1451.0, "e")]
    assert compare_picks(costlier, theirs)["no_worse"] is False


def test_a_case_names_its_profile_shape_unit_latency_and_blocking_power() -> None:
    case = parse_case("/data/run:1/h100.csv:4:16:0:0.012:122.9")
    assert (case.profile, case.stages, case.microbatches) == ("/data/run:1/h100.csv", 4, 16)
    assert (case.unit_time_s, case.latency_s, case.p_block_w) == (0.0, 0.012, 122.9)
    assert case.name == "h100.csv 4x16"
    assert parse_case(case.profile + ":" + ":".join(case.args()[1:])) == case
