"""The analytic straggler mode at scale: its definition on hand-made frontiers, and the bundled A100 case."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perseusd.ctl.main import main
from perseusd.errors import PlanningError
from perseusd.planner.baselines import CandidatePoint
from perseusd.planner.bundled import BUNDLED_PROFILES, bundled_profile
from perseusd.planner.straggler_scale import (
    PipelineFrontier,
    job_energy,
    microbatches_for,
    scale_table,
    solve_pipeline,
)

STAGES, P_BLOCK_W = 2, 10.0
ALL_MAX = CandidatePoint(1.0, 100.0, ())
POINTS = tuple(CandidatePoint(t, e, ()) for t, e in ((1.0, 90.0), (1.1, 80.0), (1.3, 75.0), (1.6, 74.0)))
FRONTIER = PipelineFrontier(STAGES, 4, P_BLOCK_W, POINTS, ALL_MAX)


def test_hand_computed_job_of_three_pipelines() -> None:
    job = job_energy(FRONTIER, num_pipelines=3, factor=1.2, tensor_parallel=2)
    # T' = 1.2 s. Straggler: fastest point (1.0 s, 90 J) + 2 GPUs x 10 W x 0.2 s = 94 J.
    # Others: 1.1 s -> 80 + 2 x 10 x 0.1 = 82 J (1.3 s does not fit). All-max: 100 + 2 x 10 x 0.2 = 104 J.
    assert job.time_s == pytest.approx(1.2)
    assert job.others_plan_time_s == 1.1
    assert job.energy_j == pytest.approx(2 * (94.0 + 2 * 82.0))
    assert job.all_max_energy_j == pytest.approx(2 * 3 * 104.0)
    assert job.saving_pct == pytest.approx(100 * (1 - (94 + 2 * 82) / (3 * 104)))
    assert job.num_gpus == 3 * STAGES * 2
    assert job.slowdown_pct == pytest.approx(0.0)


def test_the_others_pay_for_waiting_when_choosing() -> None:
    # With a high blocking power the slower point that fills the wait beats the cheaper-looking faster one.
    frontier = PipelineFrontier(STAGES, 4, 100.0, POINTS, ALL_MAX)
    job = job_energy(frontier, num_pipelines=2, factor=1.3)
    assert job.others_plan_time_s == 1.3  # 75 J, against 80 + 2 x 100 x 0.2 = 120 J for 1.1 s


def test_factor_one_is_the_intrinsic_saving_for_any_number_of_pipelines() -> None:
    slow_fastest = PipelineFrontier(
        STAGES, 4, P_BLOCK_W, POINTS[1:], ALL_MAX
    )  # fastest 1.1 s > all-max 1.0 s
    for frontier in (FRONTIER, slow_fastest):
        for pipelines in (1, 2, 16, 128):
            job = job_energy(frontier, pipelines, 1.0)
            assert job.saving_pct == pytest.approx(frontier.intrinsic_saving_pct)
            assert job.time_s == max(frontier.fastest.time_s, ALL_MAX.time_s)


def test_more_pipelines_save_more_when_the_straggler_saves_least() -> None:
    savings = [job_energy(FRONTIER, p, 1.3).saving_pct for p in (1, 2, 4, 16, 32, 64, 128)]
    assert savings == sorted(savings)
    assert savings[0] < savings[-1]
    # In the limit every pipeline is a non-straggler: 75 J against all-max 100 + 2 x 10 x 0.3 = 106 J.
    assert savings[-1] < 100 * (1 - 75 / 106)


def test_tensor_parallelism_scales_energy_not_saving() -> None:
    one, eight = job_energy(FRONTIER, 16, 1.2, tensor_parallel=1), job_energy(FRONTIER, 16, 1.2)
    assert eight.energy_j == pytest.approx(8 * one.energy_j)
    assert eight.saving_pct == pytest.approx(one.saving_pct)
    assert eight.num_gpus == 8 * one.num_gpus


def test_table_order_and_input_checks() -> None:
    rows = scale_table([(16, FRONTIER), (32, FRONTIER)], (1.1, 1.2))
    assert [(r.num_pipelines, r.factor) for r in rows] == [(16, 1.1), (16, 1.2), (32, 1.1), (32, 1.2)]
    assert [microbatches_for(p) for p in (16, 32, 64, 128)] == [96, 48, 24, 12]
    with pytest.raises(PlanningError, match="evenly"):
        microbatches_for(100)
    with pytest.raises(PlanningError, match="factor >= 1"):
        job_energy(FRONTIER, 16, 0.9)


@pytest.fixture(scope="module")
def a100_m12() -> PipelineFrontier:
    """The bundled A100 SXM GPT-3 pipeline with 12 microbatches (128 pipelines of a 1,536 batch)."""
    return solve_pipeline(bundled_profile("a100_sxm"), 8, 12, BUNDLED_PROFILES["a100_sxm"].p_block_w)


def test_bundled_a100_at_128_pipelines(a100_m12: PipelineFrontier) -> None:
    assert a100_m12.intrinsic_saving_pct >= 15.2  # published intrinsic saving at M = 12
    assert a100_m12.fastest.time_s >= a100_m12.all_max.time_s  # so factor 1 is the intrinsic saving
    rows = {r.factor: r for r in scale_table([(128, a100_m12)], (1.0, 1.05, 1.1, 1.2, 1.5))}
    assert rows[1.0].saving_pct == pytest.approx(a100_m12.intrinsic_saving_pct)
    for factor in (1.05, 1.1, 1.2, 1.5):
        assert rows[factor].saving_pct > rows[1.0].saving_pct  # the slack is used
        assert rows[factor].slowdown_pct == pytest.approx(0.0, abs=1e-9)  # never slower than the straggler
    assert rows[1.2].saving_pct >= 25.0


def test_cli_json_and_plot(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    plot = tmp_path / "s.png"
    argv = ["stragglers", "--pipelines", "128", "--factors", "1.2", "--json", "--plot", str(plot)]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["profile"] == "bundled:a100_sxm"
    assert doc["p_block_w"] == 83.64
    [row] = doc["rows"]
    assert (row["pipelines"], row["gpus"], row["microbatches"], row["factor"]) == (128, 8192, 12, 1.2)
    assert row["saving_pct"] == pytest.approx(100 * (1 - row["energy_j"] / row["all_max_energy_j"]))
    assert plot.read_bytes().startswith(b"\x89PNG")


def test_cli_table_and_bad_batch(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stragglers", "--pipelines", "128", "--factors", "1.1", "1.2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split() == [
        "pipelines",
        "GPUs",
        "M",
        "no",
        "straggler",
        "straggler",
        "1.1",
        "straggler",
        "1.2",
    ]
    assert lines[2].split()[:3] == ["128", "8192", "12"]
    assert main(["stragglers", "--pipelines", "100"]) == 1
    assert "cannot be split evenly" in capsys.readouterr().err
