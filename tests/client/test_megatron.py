"""The Megatron-Core integration: Megatron's own schedules on real ranks (gloo, CPU) against a real daemon.

Four ranks run every schedule `get_forward_backward_func()` returns in megatron-core, one after the other: no
pipelining (four data-parallel replicas), 1F1B on four stages, interleaved with two model chunks per rank
(two replicas of a two-stage pipeline), and 1F1B on two stages of two tensor-parallel ranks each (both ranks
of a stage register the same pipeline and stage, with `stage_gpus` 2). The order the integration reports must
equal the order Megatron really executed (recorded by the model itself: data consumed by forwards, autograd
running backwards), training must be unchanged, and the named schedules it registers must be perseusd's
order for that stage.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("megatron.core")

from perseus_client.megatron import schedule_name_for
from perseus_client.run_id import launcher_run_id

from perseusd.planner.dag import build_dag
from tests.client.ranks import CasesRun, assert_each_rank_found_its_gpu, cases_run_fixture, split_steps

pytestmark = pytest.mark.timeout(240)
STEPS = 2  # the worker's training steps
WORLD = 4  # ranks; each case splits them into data-parallel replicas of its pipeline
CASES = {
    "no_pipelining": {"pp": 1, "vp": None, "microbatches": 3},
    "1f1b": {"pp": 4, "vp": None, "microbatches": 6},
    "interleaved": {"pp": 2, "vp": 2, "microbatches": 4},
    "tp2": {"pp": 2, "vp": None, "microbatches": 4, "tp": 2},
}
FUNCTIONS = {
    "no_pipelining": "forward_backward_no_pipelining",
    "1f1b": "forward_backward_pipelining_without_interleaving",
    "interleaved": "forward_backward_pipelining_with_interleaving",
    "tp2": "forward_backward_pipelining_without_interleaving",
}
Run = tuple[str, dict[str, Any], list[dict[str, Any]]]


cases_run = cases_run_fixture("megatron", WORLD, CASES)


@pytest.fixture(params=list(CASES))
def run(request: pytest.FixtureRequest, cases_run: CasesRun) -> Run:
    return request.param, CASES[request.param], cases_run.reports[request.param]


def test_megatron_runs_the_expected_schedule(run: Run) -> None:
    name, _, reports = run
    assert {report["instrumented"]["function"] for report in reports} == {FUNCTIONS[name]}


def test_each_rank_found_the_gpu_its_launcher_gave_it(run: Run, cases_run: CasesRun) -> None:
    _, _, reports = run
    assert_each_rank_found_its_gpu(reports, cases_run.daemon, WORLD)


def test_events_are_what_megatron_executed(run: Run) -> None:
    _, case, reports = run
    for report in reports:
        mine = report["instrumented"]
        steps = split_steps(mine["events"], mine["stage"], STEPS)
        assert [c for step in steps for c in step] == mine["executed"]
        per_step = len(mine["executed"]) // STEPS
        assert per_step == 2 * case["microbatches"] * (case["vp"] or 1)
        assert mine["events_dropped"] == 0
        assert mine["restored"]  # Megatron's module functions are its own again after each call


def test_training_unchanged(run: Run) -> None:
    _, case, reports = run
    for report in reports:
        assert report["instrumented"]["params"] == report["baseline"]["params"]
        assert report["instrumented"]["losses"] == report["baseline"]["losses"]
        assert report["instrumented"]["executed"] == report["baseline"]["executed"]
    last_stage = [r for r in reports if r["instrumented"]["stage"] == case["pp"] - 1]
    assert all(len(step) == case["microbatches"] for r in last_stage for step in r["baseline"]["losses"])


def test_registration_and_named_order(run: Run) -> None:
    _, case, reports = run
    pp, chunks, microbatches = case["pp"], case["vp"] or 1, case["microbatches"]
    tp = case.get("tp", 1)
    positions: dict[tuple[int, int], int] = {}
    for report in reports:
        mine = report["instrumented"]
        assert mine["register"] == ["ok", None]
        [[_, fields]] = mine["registered"]
        schedule = schedule_name_for(mine["function"], pp, microbatches)
        assert fields == {
            "stage": mine["stage"],
            "num_stages": pp,
            "num_microbatches": microbatches,
            "schedule": schedule,
            "pipeline": fields["pipeline"],
            "chunks": chunks,
            "stage_gpus": tp,
            "run": launcher_run_id(),
        }
        position = (fields["pipeline"], fields["stage"])
        positions[position] = positions.get(position, 0) + 1
        assert schedule != "observed"
        planned = build_dag(schedule, pp, microbatches, chunks)
        order = [
            [str(c.instruction), c.microbatch, c.chunk]
            for c in (planned.computations[node] for node in planned.stage_orders[mine["stage"]])
        ]
        assert mine["executed"] == order * STEPS
    replicas = WORLD // (pp * tp)
    # Data-parallel replicas are pipelines; a stage's tensor-parallel ranks register it together.
    assert positions == {(p, s): tp for p in range(replicas) for s in range(pp)}


def test_schedule_names() -> None:
    assert schedule_name_for("forward_backward_no_pipelining", 1, 3) == "1f1b"
    assert schedule_name_for("forward_backward_pipelining_without_interleaving", 4, 3) == "1f1b"
    assert schedule_name_for(FUNCTIONS["interleaved"], 2, 4) == "interleaved"
    assert schedule_name_for(FUNCTIONS["interleaved"], 2, 2) == "observed"  # all forwards first
    assert schedule_name_for(FUNCTIONS["interleaved"], 2, 3) == "observed"
