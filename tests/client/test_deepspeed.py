"""The DeepSpeed integration: `PipelineEngine.train_batch()` on real ranks (gloo, CPU accelerator) against a
real daemon. The order reported must equal the order DeepSpeed really executed (the model's own records) and
the order of its `TrainSchedule` objects, training must be unchanged, and `1f1b` must be perseusd's order."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("deepspeed")

from perseus_client.run_id import launcher_run_id

from perseusd.planner.dag import build_dag
from tests.client.ranks import CasesRun, assert_each_rank_found_its_gpu, cases_run_fixture, split_steps

pytestmark = pytest.mark.timeout(240)
STEPS = 2  # the worker's training steps
WORLD = 4
CASES = {
    "pp2-dp2": {"pp": 2, "microbatches": 4},
    "pp4": {"pp": 4, "microbatches": 3},
}
Run = tuple[dict[str, Any], list[dict[str, Any]]]


cases_run = cases_run_fixture("deepspeed", WORLD, CASES)


@pytest.fixture(params=list(CASES))
def run(request: pytest.FixtureRequest, cases_run: CasesRun) -> Run:
    return CASES[request.param], cases_run.reports[request.param]


def test_events_are_what_deepspeed_executed(run: Run) -> None:
    case, reports = run
    for report in reports:
        mine = report["instrumented"]
        steps = split_steps(mine["events"], mine["stage"], STEPS)
        assert [c for step in steps for c in step] == mine["executed"]
        assert len(mine["executed"]) == 2 * case["microbatches"] * STEPS
        assert [c[0] for c in steps[0]] == mine["schedule_object"]  # DeepSpeed's TrainSchedule
        assert mine["events_dropped"] == 0
        assert mine["restored"]


def test_each_rank_found_the_gpu_its_launcher_gave_it(run: Run, cases_run: CasesRun) -> None:
    _, reports = run
    assert_each_rank_found_its_gpu(reports, cases_run.daemon, WORLD)


def test_training_unchanged(run: Run) -> None:
    _, reports = run
    for report in reports:
        assert report["instrumented"]["params"] == report["baseline"]["params"]
        assert report["instrumented"]["losses"] == report["baseline"]["losses"]
        assert report["instrumented"]["executed"] == report["baseline"]["executed"]


def test_registration_and_named_order(run: Run) -> None:
    case, reports = run
    pp, microbatches = case["pp"], case["microbatches"]
    planned = build_dag("1f1b", pp, microbatches, 1)
    positions = set()
    for report in reports:
        mine = report["instrumented"]
        assert mine["register"] == ["ok", None]
        [[_, fields]] = mine["registered"]
        assert fields == {
            "stage": mine["stage"],
            "num_stages": pp,
            "num_microbatches": microbatches,
            "schedule": "1f1b",
            "pipeline": fields["pipeline"],
            "chunks": 1,
            "stage_gpus": 1,  # no tensor parallelism in these grids
            "run": launcher_run_id(),
        }
        positions.add((fields["pipeline"], fields["stage"]))
        order = [
            [str(c.instruction), c.microbatch, c.chunk]
            for c in (planned.computations[node] for node in planned.stage_orders[mine["stage"]])
        ]
        assert mine["executed"] == order * STEPS
    assert positions == {(p, s) for p in range(WORLD // pp) for s in range(pp)}


def test_only_a_pipeline_engine_is_instrumented() -> None:
    from perseus_client.deepspeed_pipe import instrument_deepspeed

    from tests.client.torch_pipelining_worker import RecordingClient

    client = RecordingClient(connect=False)
    with pytest.raises(TypeError, match="PipelineEngine"):
        instrument_deepspeed(object(), client, "GPU-x")
    assert client.sent == []  # nothing registered
