"""The node's power ramp bound in a daemon core (no sockets): the configuration key reaches the plan every
GPU runs, the bound holds on it, the iteration is no slower, and the job says what it cost."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from perseus_client.protocol import (
    DocumentReply,
    FrontierRequest,
    JobInfo,
    PlanRequest,
    Register,
)

from perseusd.daemon.components import job_settings
from perseusd.daemon.config import DaemonConfig
from perseusd.daemon.config_loading import load_config
from perseusd.daemon.core import DaemonCore
from perseusd.errors import ConfigError
from perseusd.planner.dag import ComputationDag, Instruction, from_stage_orders
from perseusd.planner.evaluate import all_max_clocks, longest_path_s, measurements_for
from perseusd.planner.plan_read import parse_frontier, parse_plan
from perseusd.planner.ramp_bound import plan_ramp_w_per_s
from tests.support.callers import ME
from tests.support.daemon_core import (
    MICROBATCHES,
    STAGES,
    core_job,
    sim_core,
    start_synthetic_job,
    synthetic_job_profile,
)

pytestmark = pytest.mark.timeout(120)

PROFILE = synthetic_job_profile(STAGES)
BOUND_W_PER_S = 15000.0
"""A node of 2 GPUs: 7.5 kW/s each, below the unbounded plan's largest GPU's steps, above all-max's (7.0)."""


def _run_job(core: DaemonCore) -> JobInfo:
    start_synthetic_job(core, 1, STAGES, MICROBATCHES)
    return core_job(core)


def _gpu_ramps(dag: ComputationDag, clocks: list[int]) -> list[float]:
    """Each GPU's (stage's) ramp alone (W/s)."""
    return [
        plan_ramp_w_per_s(dag, PROFILE, clocks, [int(s == t) for t in range(STAGES)]) for s in range(STAGES)
    ]


def _document(core: DaemonCore, request: PlanRequest | FrontierRequest) -> str:
    reply = core.handle(ME, request)
    assert isinstance(reply, DocumentReply)
    return reply.document


def test_the_config_key_bounds_the_plan_every_gpu_runs(tmp_path: Path) -> None:
    settings = job_settings(DaemonConfig(ramp_bound_w_per_s=BOUND_W_PER_S))
    with sim_core(tmp_path, gpus=STAGES, jobs=settings) as core:
        info = _run_job(core)
        plan = parse_plan(_document(core, PlanRequest("train")), "plan")
        frontier = parse_frontier(_document(core, FrontierRequest("train")), "frontier")
        for stage, gpu in enumerate(core.registry.uuids):  # each GPU runs the bounded plan's clocks
            gpu_plan = core.plans.get(gpu)
            assert gpu_plan is not None
            assert gpu_plan.times_s is not None
            expected_s = [
                PROFILE.lookup(stage, Instruction(step[0]), clock).time_s
                for step, clock in zip(plan.order[stage], plan.clocks_mhz[stage], strict=True)
            ]
            assert gpu_plan.times_s == pytest.approx(expected_s, rel=1e-6)
    assert info.plan_index is not None
    point = frontier.points[info.plan_index]
    dag = from_stage_orders(frontier.order, MICROBATCHES, 1, "1f1b")
    planned, bounded = list(point.node_clocks_mhz()), list(plan.node_clocks_mhz())
    gpu_w_per_s = BOUND_W_PER_S / STAGES
    assert max(_gpu_ramps(dag, all_max_clocks(dag, PROFILE))) < gpu_w_per_s
    assert max(_gpu_ramps(dag, planned)) > gpu_w_per_s  # the bound had work to do
    assert max(_gpu_ramps(dag, bounded)) <= gpu_w_per_s * (1 + 1e-9)
    assert plan_ramp_w_per_s(dag, PROFILE, bounded) <= BOUND_W_PER_S * (1 + 1e-9)
    assert all(b >= p for b, p in zip(bounded, planned, strict=True))
    assert longest_path_s(dag, [m.time_s for m in measurements_for(dag, PROFILE, bounded)]) <= longest_path_s(
        dag, [m.time_s for m in measurements_for(dag, PROFILE, planned)]
    )
    assert "ramp bound 15.0 kW/s (7.5 per GPU) held" in info.plan_note
    assert info.plan_energy_j is not None
    assert info.plan_energy_j > point.refined_energy_j
    assert json.loads(_document(core, PlanRequest("train")))["refined_energy_j"] == pytest.approx(
        info.plan_energy_j
    )


def test_without_the_key_the_plan_is_the_frontier_point(tmp_path: Path) -> None:
    with sim_core(tmp_path, gpus=STAGES, jobs=job_settings(DaemonConfig())) as core:
        info = _run_job(core)
        plan = parse_plan(_document(core, PlanRequest("train")), "plan")
        frontier = parse_frontier(_document(core, FrontierRequest("train")), "frontier")
    assert info.plan_index is not None
    assert plan.clocks_mhz == frontier.points[info.plan_index].clocks_mhz
    assert "ramp bound" not in info.plan_note


def test_a_job_on_part_of_the_node_gets_its_share_of_the_bound(tmp_path: Path) -> None:
    """The node's 4 GPUs share its bound: the job on 2 of them is held to half of it, a quarter each."""
    settings = job_settings(DaemonConfig(ramp_bound_w_per_s=2 * BOUND_W_PER_S))
    with sim_core(tmp_path, gpus=2 * STAGES, jobs=settings) as core:
        info = _run_job(core)
        plan = parse_plan(_document(core, PlanRequest("train")), "plan")
    dag = from_stage_orders(plan.order, MICROBATCHES, 1, "1f1b")
    assert "ramp bound 30.0 kW/s (7.5 per GPU) held" in info.plan_note
    assert max(_gpu_ramps(dag, list(plan.node_clocks_mhz()))) <= BOUND_W_PER_S / STAGES * (1 + 1e-9)


def test_the_key_is_read_from_file_and_environment_and_bad_values_are_named(tmp_path: Path) -> None:
    path = tmp_path / "perseusd.toml"
    path.write_text("ramp_bound_w_per_s = 60000\n")
    assert job_settings(load_config(path, {}, {})).ramp_bound_w_per_s == 60000.0
    from_env = load_config(path, {"PERSEUSD_RAMP_BOUND_W_PER_S": "25000.5"}, {})
    assert job_settings(from_env).ramp_bound_w_per_s == 25000.5
    assert job_settings(DaemonConfig()).ramp_bound_w_per_s == 0.0  # off by default
    for bad in ("-5", "nan", "inf", '"fast"'):
        path.write_text(f"ramp_bound_w_per_s = {bad}\n")
        with pytest.raises(ConfigError, match="ramp_bound_w_per_s"):
            load_config(path, {}, {})


def test_a_pipeline_joining_later_runs_the_bounded_plan(tmp_path: Path) -> None:
    """Two pipelines on the node's 4 GPUs, the second registering once the first runs: its GPUs get the same
    bounded plan, every GPU within its slice (bound / 4), so the node holds its bound with all four."""
    settings = job_settings(DaemonConfig(ramp_bound_w_per_s=2 * BOUND_W_PER_S))
    with sim_core(tmp_path, gpus=2 * STAGES, jobs=settings) as core:
        _run_job(core)  # pipeline 0 on the first two GPUs
        for stage, gpu in enumerate(core.registry.uuids[STAGES:]):
            core.handle(ME, Register(gpu, "train", 1, stage, STAGES, MICROBATCHES, "1f1b", 1))  # type: ignore[arg-type]
        core.tick()
        plan = parse_plan(_document(core, PlanRequest("train")), "plan")
        gpu_plans = {gpu: core.plans.get(gpu) for gpu in core.registry.uuids}
    for position, gpu in enumerate(gpu_plans):
        stage = position % STAGES
        expected_s = [
            PROFILE.lookup(stage, Instruction(step[0]), clock).time_s
            for step, clock in zip(plan.order[stage], plan.clocks_mhz[stage], strict=True)
        ]
        gpu_plan = gpu_plans[gpu]
        assert gpu_plan is not None
        assert gpu_plan.times_s == pytest.approx(expected_s, rel=1e-6)
    dag = from_stage_orders(plan.order, MICROBATCHES, 1, "1f1b")
    clocks = list(plan.node_clocks_mhz())
    assert max(_gpu_ramps(dag, clocks)) <= BOUND_W_PER_S / STAGES * (1 + 1e-9)
    assert plan_ramp_w_per_s(dag, PROFILE, clocks, [2] * STAGES) <= 2 * BOUND_W_PER_S * (1 + 1e-9)
