"""The job manager inside a daemon core (no sockets): registration, imported profiles, solving in the
worker, deployment, policies, the learned ("observed") schedule, the cache and the end of a job."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from perseus_client import protocol as p

from perseusd.daemon.core import DaemonCore
from perseusd.daemon.requests.job import JobRequests
from perseusd.jobs.lock_latency import MIN_SWITCH_LATENCY_S
from perseusd.jobs.response import DEPARTS
from perseusd.jobs.settings import JobSettings
from perseusd.leasing.identity import Caller
from perseusd.planner.dag import Instruction
from perseusd.planner.profile_csv import profile_to_csv
from perseusd.planner.schedule_orders import one_f_one_b_order
from tests.support.callers import ME, OTHER
from tests.support.daemon_core import sim_core, start_synthetic_job, tick_until
from tests.support.synthetic import A100_CLOCKS_MHZ, synthetic_profile

pytestmark = pytest.mark.timeout(120)

STAGES, MICROBATCHES = 2, 4


def _profile_csv() -> str:
    return profile_to_csv(synthetic_profile(STAGES, seed=3, clocks_mhz=A100_CLOCKS_MHZ))


def _register(core: DaemonCore, stage: int, job: str = "train", schedule: str = "1f1b") -> p.RegisterOk:
    gpu = core.registry.uuids[stage]
    message = p.Register(gpu, job, 0, stage, STAGES, MICROBATCHES, schedule, 1)  # type: ignore[arg-type]
    reply = core.handle(ME, message)
    assert isinstance(reply, p.RegisterOk)
    return reply


def _claim_all(core: DaemonCore) -> None:
    core.handle(ME, p.Hello(job="train", client_version="test"))
    core.handle(ME, p.Claim(gpus=core.registry.uuids, job="train"))


def _info(core: DaemonCore, caller: Caller = ME) -> dict[str, p.JobInfo]:
    reply = core.handle(caller, p.JobsRequest())
    assert isinstance(reply, p.JobsReply)
    return {job.job: job for job in reply.jobs}


def _run_iteration(core: DaemonCore, step: int) -> None:
    """One iteration's events, stage by stage in 1F1B order (timestamps are not used once a plan runs)."""
    for stage, gpu in enumerate(core.registry.uuids):
        core.on_event(ME, p.StepBegin(gpu, step, time.monotonic_ns()))
        for instruction, microbatch, chunk in one_f_one_b_order(STAGES, MICROBATCHES, stage):
            args = (gpu, stage, instruction.value, microbatch, chunk)
            core.on_event(ME, p.ComputationBegin(*args, time.monotonic_ns()))  # type: ignore[arg-type]
            core.on_event(ME, p.ComputationEnd(*args, time.monotonic_ns()))  # type: ignore[arg-type]
        core.on_event(ME, p.StepEnd(gpu, step, time.monotonic_ns()))


def test_imported_profile_is_solved_deployed_and_cached(core: DaemonCore) -> None:
    _claim_all(core)
    imported = core.handle(ME, p.ProfileImport("train", _profile_csv(), "synthetic.csv", 80.0))
    assert isinstance(imported, p.ProfileImportOk)
    assert imported.state == "pending"
    assert _register(core, 0).state == "registered"  # the pipeline is not complete yet
    assert _register(core, 1).state == "solving"
    tick_until(core, lambda: _info(core)["train"].state == "running")

    info = _info(core)["train"]
    assert info.frontier_points > 1
    assert info.plan_index is not None
    assert info.policy == "no_slowdown"  # the default: the least energy no slower than all-max
    assert info.all_max_time_s is not None
    assert info.plan_time_s is not None
    assert info.plan_time_s <= info.all_max_time_s * (1 + 1e-9)
    planning = info.planning  # profiling done (the import) to the plan deployed, by phase
    assert planning is not None
    assert min(planning.fit_s, planning.frontier_s) > 0
    worker_s = planning.fit_s + planning.frontier_s + planning.follow_s + planning.descent_s
    assert planning.total_s == pytest.approx(worker_s + planning.transfer_s, abs=1e-5)
    plan = core.handle(ME, p.PlanRequest("train"))
    assert isinstance(plan, p.DocumentReply)
    stages = json.loads(plan.document)["stages"]
    assert [len(stage) for stage in stages] == [2 * MICROBATCHES] * STAGES
    profile = synthetic_profile(STAGES, seed=3, clocks_mhz=A100_CLOCKS_MHZ)
    for stage, gpu in enumerate(core.registry.uuids):
        gpu_plan = core.plans.get(gpu)
        assert gpu_plan is not None
        assert gpu_plan.computations == 2 * MICROBATCHES
        expected_s = [  # what lets the plan raise a clock before the running computation ends
            profile.lookup(stage, Instruction(e["instruction"]), e["freq_mhz"]).time_s for e in stages[stage]
        ]
        assert gpu_plan.times_s == pytest.approx(expected_s, rel=1e-6)

    for step in range(3):
        _run_iteration(core, step)
    info = _info(core)["train"]
    assert info.clock_changes_per_iteration is not None
    assert info.wrong_clock_fraction is not None

    exported = core.handle(ME, p.ProfileExport("train"))
    assert isinstance(exported, p.ProfileReply)
    assert exported.p_block_w == 80.0
    assert exported.csv.splitlines()[0] == "stage,instruction,frequency,time,energy"

    core.handle(ME, p.Release(gpus=()))
    assert _info(core)["train"].state == "ended"

    _claim_all(core)  # the same job again: from the cache, no profiling, no solving
    assert _register(core, 0).cached
    assert _register(core, 1).state == "running"
    assert _info(core)["train"].planning is None


def test_job_that_ends_after_running_its_plan_reports_no_error(core: DaemonCore) -> None:
    start_synthetic_job(core, 1, STAGES, MICROBATCHES)
    core.handle(ME, p.Release(gpus=()))  # training finished: the normal end
    ended = _info(core)["train"]
    assert ended.state == "ended"
    assert ended.error == ""


def test_a_job_that_ends_while_solving_cancels_its_solve(core: DaemonCore) -> None:
    """The solve of a job that ended is abandoned at once: it never keeps the one solver worker (a core and
    gigabytes) from other users' jobs."""
    assert core.jobs is not None
    _claim_all(core)
    core.handle(ME, p.ProfileImport("train", _profile_csv(), "synthetic.csv", 80.0))
    _register(core, 0)
    assert _register(core, 1).state == "solving"
    solving = core.jobs.jobs["train"].solve_future
    assert solving is not None
    assert not solving.done()
    core.handle(ME, p.Release(gpus=()))
    assert _info(core)["train"].state == "ended"
    assert solving.cancelled()
    assert core.jobs.jobs["train"].solve_future is None


def test_policies_choose_frontier_points(core: DaemonCore) -> None:
    start_synthetic_job(core, 1, STAGES, MICROBATCHES)
    fastest = _info(core)["train"]
    assert fastest.plan_time_s is not None
    assert fastest.plan_energy_j is not None

    core.handle(ME, p.SetPolicy("train", "min_energy", 0.0))
    frugal = _info(core)["train"]
    assert frugal.plan_energy_j is not None
    assert frugal.plan_time_s is not None
    assert frugal.plan_energy_j < fastest.plan_energy_j
    assert frugal.plan_time_s > fastest.plan_time_s

    core.handle(ME, p.SetPolicy("train", "slowdown", 0.05))
    within = _info(core)["train"]
    assert within.plan_time_s is not None
    assert within.plan_energy_j is not None
    assert within.plan_time_s <= fastest.plan_time_s * 1.05 + 1e-9
    assert frugal.plan_energy_j <= within.plan_energy_j <= fastest.plan_energy_j

    with pytest.raises(p.ProtocolError) as bad:
        core.handle(ME, p.SetPolicy("train", "time", -1.0))
    assert bad.value.code == p.ErrorCode.BAD_FIELD


def test_observed_schedule_is_learned_before_solving(core: DaemonCore) -> None:
    _claim_all(core)
    core.handle(ME, p.ProfileImport("train", _profile_csv(), "synthetic.csv", 80.0))
    _register(core, 0, schedule="observed")
    _register(core, 1, schedule="observed")
    for _ in range(10):
        core.tick()
    assert _info(core)["train"].state == "solving"  # no order yet: nothing to solve
    _run_iteration(core, 0)
    _run_iteration(core, 1)  # two identical iterations: learned
    tick_until(core, lambda: _info(core)["train"].state == "running")
    plan = core.handle(ME, p.PlanRequest("train"))
    assert isinstance(plan, p.DocumentReply)
    for stage, entries in enumerate(json.loads(plan.document)["stages"]):
        learned = [(e["instruction"], e["microbatch"], e["chunk"]) for e in entries]
        expected = [(i.value, mb, c) for i, mb, c in one_f_one_b_order(STAGES, MICROBATCHES, stage)]
        assert learned == expected


def test_registration_and_access_errors(core: DaemonCore) -> None:
    gpu = core.registry.uuids[0]
    core.handle(ME, p.Hello(job="train", client_version="test"))
    with pytest.raises(p.ProtocolError) as unleased:
        _register(core, 0)
    assert unleased.value.code == p.ErrorCode.NOT_LEASED
    _claim_all(core)
    _register(core, 0)
    other_shape = p.Register(core.registry.uuids[1], "train", 0, 1, STAGES, 8, "1f1b", 1)
    with pytest.raises(p.ProtocolError, match="is 1f1b 2x4"):
        core.handle(ME, other_shape)
    taken = p.Register(core.registry.uuids[1], "train", 0, 0, STAGES, MICROBATCHES, "1f1b", 1)
    with pytest.raises(p.ProtocolError, match=f"runs on {gpu}"):
        core.handle(ME, taken)
    with pytest.raises(p.ProtocolError, match="stage 5 outside"):
        core.handle(ME, p.Register(gpu, "train", 0, 5, STAGES, MICROBATCHES, "1f1b", 1))
    bad_csv = "stage,instruction,frequency,time,energy\n0,forward,1410,abc,1\n"
    with pytest.raises(p.ProtocolError, match=r"bad\.csv:2"):
        core.handle(ME, p.ProfileImport("train", bad_csv, "bad.csv", 80.0))
    assert "train" not in _info(core, OTHER)  # another user does not see the job
    with pytest.raises(p.ProtocolError, match="job 'train' belongs to another user"):
        core.handle(OTHER, p.PlanRequest("train"))


def test_the_frontier_states_what_the_gpus_will_do(tmp_path: Path) -> None:
    """The solve plays each point out with the GPUs' measured clock-set latency (docs/solver.md): here the
    `h100_sxm` board's 9-15 ms locks."""
    with sim_core(tmp_path, 2, model="h100_sxm", jobs=JobSettings()) as core:
        for gpu in core.registry.uuids:  # a set call, so that the latency is measured
            core.registry.set_locked_sm_clock_mhz(gpu, 1200)
        start_synthetic_job(core, 1, STAGES, MICROBATCHES)
        reply = core.handle(ME, p.FrontierRequest("train"))
        assert isinstance(reply, p.DocumentReply)
        frontier = json.loads(reply.document)
        latency_s = frontier["switching"]["latency_s"]  # the median set call when the solve was asked for
        assert MIN_SWITCH_LATENCY_S <= latency_s < 5.0
        assert frontier["switching"]["lead_s"] == pytest.approx(latency_s + 0.002)
        info = _info(core)["train"]
        deployed = frontier["points"][info.plan_index]
        assert {"effective_clock_changes", "switch_changed", "planned_energy_j", "late_begins"} <= set(
            deployed
        )
        assert info.plan_energy_j == deployed["refined_energy_j"]
        assert info.plan_time_s == deployed["refined_time_s"]


def test_clock_changes_that_act_at_once_leave_the_frontier_as_solved(core: DaemonCore) -> None:
    """A board without a lock latency (its set calls take ~0.1 ms): the points are not followed, so no
    lowering counts as begun late and every point may be deployed."""
    for gpu in core.registry.uuids:
        core.registry.set_locked_sm_clock_mhz(gpu, 1200)
    start_synthetic_job(core, 1, STAGES, MICROBATCHES)
    reply = core.handle(ME, p.FrontierRequest("train"))
    assert isinstance(reply, p.DocumentReply)
    frontier = json.loads(reply.document)
    assert "switching" not in frontier
    assert _info(core)["train"].frontier_points == len(frontier["points"])


def _one_stage_jobs(core: DaemonCore, names: tuple[str, ...]) -> None:
    """One-stage jobs of this user, each with an imported profile, one GPU each."""
    csv = profile_to_csv(synthetic_profile(1, seed=3, clocks_mhz=A100_CLOCKS_MHZ))
    _claim_all(core)
    for gpu, name in zip(core.registry.uuids, names, strict=False):
        core.handle(ME, p.ProfileImport(name, csv, "synthetic.csv", 80.0))
        reply = core.handle(ME, p.Register(gpu, name, 0, 0, 1, MICROBATCHES, "1f1b", 1))  # type: ignore[arg-type]
        assert isinstance(reply, p.RegisterOk)


def test_one_users_solves_take_turns(core: DaemonCore) -> None:
    """One user's jobs solve one at a time (`max_solves_per_user`): the others wait in `solving`, so
    another user's job is never queued behind all of them."""
    assert core.jobs is not None
    _one_stage_jobs(core, ("a", "b"))
    queued = [name for name in ("a", "b") if core.jobs.jobs[name].solve_future is not None]
    assert queued == ["a"]
    assert _info(core)["b"].state == "solving"
    tick_until(core, lambda: all(job.state == "running" for job in _info(core).values()))


def test_a_schedule_too_large_to_plan_is_refused(core: DaemonCore) -> None:
    assert core.jobs is not None
    limit = core.jobs.settings.max_job_computations
    _claim_all(core)
    gpu = core.registry.uuids[0]
    too_many = p.Register(gpu, "huge", 0, 0, 1, limit // 2 + 1, "1f1b", 1)  # type: ignore[arg-type]
    with pytest.raises(p.ProtocolError, match=f"plans at most {limit} \\(max_job_computations\\)"):
        core.handle(ME, too_many)
    assert "huge" not in _info(core)
    assert isinstance(core.handle(ME, p.Register(gpu, "fits", 0, 0, 1, limit // 2, "1f1b", 1)), p.RegisterOk)


def test_a_solve_past_its_timeout_fails_its_job(tmp_path: Path) -> None:
    with sim_core(tmp_path, gpus=1, jobs=JobSettings(solve_timeout_s=0.001)) as core:
        assert core.jobs is not None
        _one_stage_jobs(core, ("slow",))
        tick_until(core, lambda: _info(core)["slow"].state == "failed")
        assert "solving took longer than 0.001 s (solve_timeout_s)" in _info(core)["slow"].error
        assert core.jobs.jobs["slow"].solve_future is None


def test_a_profiling_job_shows_the_energy_its_gpus_used_so_far(core: DaemonCore) -> None:
    """`jobs` during profiling shows the counters' energy, not a hard-coded 0 J."""
    _claim_all(core)
    _register(core, 0)
    assert _register(core, 1).state == "profiling"
    _run_iteration(core, 0)

    def used_j() -> float:
        profiling = _info(core)["train"].profiling
        assert profiling is not None
        return profiling.energy_j

    tick_until(core, lambda: used_j() > 0, timeout_s=20)
    assert _info(core)["train"].state == "profiling"


def test_a_daemon_pinned_to_6_0_refuses_the_carbon_policy(core: DaemonCore) -> None:
    """`carbon` came with minor 1: a daemon speaking 6.0 refuses it like any newer field."""
    assert core.jobs is not None
    _claim_all(core)
    _register(core, 0)
    pinned = JobRequests(core.jobs, core.plans, core.leases, lambda _caller: False, protocol_minor=0)
    with pytest.raises(p.ProtocolError, match=r"carbon needs protocol 6\.1; this daemon speaks 6\.0-6\.0"):
        pinned.set_policy(ME, p.SetPolicy("train", "carbon", 0.0))
    assert pinned.set_policy(ME, p.SetPolicy("train", "fastest", 0.0)).policy == "fastest"


def test_changes_to_an_ended_job_or_a_missing_pipeline_are_refused(core: DaemonCore) -> None:
    """`straggler JOB --pipeline 3` on a one-pipeline job and `plan --policy` on an ended job said nothing
    and changed nothing: they are refused, so exit 0 means the change took effect."""
    _claim_all(core)
    _register(core, 0)
    _register(core, 1)
    with pytest.raises(p.ProtocolError, match=r"job train has no pipeline 3 \(its pipelines: 0\)"):
        core.handle(ME, p.AnnounceStraggler("train", 3, 1.2, False))
    core.handle(ME, p.Release(gpus=()))
    assert _info(core)["train"].state == "ended"
    for change in (p.SetPolicy("train", "fastest", 0.0), p.AnnounceStraggler("train", 0, 1.2, False)):
        with pytest.raises(p.ProtocolError, match="job train has ended: nothing of it can change any more"):
            core.handle(ME, change)


def test_a_plan_far_off_its_prediction_is_flagged_and_accrues_no_predicted_saving(core: DaemonCore) -> None:
    """A job running a profile that is not its own (its iterations take a fraction of the planned time) is
    flagged in `jobs` (and the log, the metrics), and no predicted saving accrues for it."""
    start_synthetic_job(core, 1, STAGES, MICROBATCHES)
    for step in range(6):  # events at once: microseconds against the plan's milliseconds
        _run_iteration(core, step)
        core.tick()
    info = _info(core)["train"]
    assert DEPARTS in info.plan_note
    assert "s planned (x0.0" in info.plan_note
    for step in range(6, 10):
        _run_iteration(core, step)
        core.tick()
    assert _info(core)["train"].energy_saved_j == info.energy_saved_j  # no longer accrues


def test_errors_speak_the_users_terms(core: DaemonCore) -> None:
    """An error names what the user typed (the flag), not only the wire field."""
    with pytest.raises(p.ProtocolError, match="blocked on communication \\(--p-block-w, p_block_w > 0\\)"):
        core.handle(ME, p.ProfileImport("later", _profile_csv(), "synthetic.csv", 0.0))
