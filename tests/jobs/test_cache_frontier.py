"""A cached frontier.json of the wrong shape ([], {}, deeply nested, huge, another job's) is ignored (logged)
and the job solves again from its cached profile; registration never fails with INTERNAL."""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import time
from dataclasses import replace
from pathlib import Path

import pytest
from perseus_client.protocol import ProfileImport, Register, Release

from perseusd.daemon.core import DaemonCore
from perseusd.jobs import cache as cache_module
from perseusd.jobs.cache import JobCache
from perseusd.jobs.settings import JobSettings
from perseusd.jobs.shape import JobShape
from perseusd.jobs.solving import SolveInput, solve, store_after
from perseusd.planner.dag import build_dag
from perseusd.planner.following import follow_frontier
from perseusd.planner.plan import PlanMeta, frontier_from_points, frontier_to_document
from perseusd.planner.profile_csv import profile_to_csv
from perseusd.planner.solver import SolverParams, solve_frontier
from perseusd.planner.switching import SwitchModel
from tests.support.callers import ME
from tests.support.daemon_core import claim, core_job, sim_core
from tests.support.synthetic import A100_CLOCKS_MHZ, synthetic_profile

pytestmark = pytest.mark.timeout(180)

STAGES, MICROBATCHES = 2, 4
SIGNATURE = "0123456789abcdef"

BAD_FRONTIERS = {
    "list": "[]",
    "empty-object": "{}",
    "deeply-nested": "[" * 100_000 + "]" * 100_000,
    "nested-in-points": json.dumps({"format": "perseus-frontier", "points": [[[[[]]]]]}),
    "not-json": "{",
    "nan": '{"format": NaN}',
}


def _shape(stages: int = STAGES) -> JobShape:
    return JobShape("1f1b", stages, MICROBATCHES, 1)


def _valid_frontier_text(tmp_path: Path) -> str:
    """A real frontier for the test shape, from a solve through the core."""
    with sim_core(tmp_path, gpus=STAGES, jobs=JobSettings()) as core:
        _run_job(core)
        (folder,) = (tmp_path / "jobs").iterdir()
        return _written_frontier(folder)


def _written_frontier(folder: Path) -> str:
    """The frontier the solver worker writes after the job runs (`solving.store_after`), once written."""
    deadline_s = time.monotonic() + 60
    while True:
        with contextlib.suppress(FileNotFoundError, ValueError):
            text = (folder / "frontier.json").read_text()
            if json.loads(text)["format"] == "perseus-frontier":
                return text
        assert time.monotonic() < deadline_s, "the frontier was never cached"
        time.sleep(0.02)


def _store(cache: JobCache, frontier_text: str | None) -> None:
    profile = synthetic_profile(STAGES, seed=3, clocks_mhz=A100_CLOCKS_MHZ)
    cache.store_profile(SIGNATURE, profile, 80.0, {"job": "train"})
    if frontier_text is not None:
        (cache.root / SIGNATURE / "frontier.json").write_text(frontier_text)


@pytest.mark.parametrize("kind", sorted(BAD_FRONTIERS))
def test_bad_frontier_is_ignored_and_the_profile_kept(
    kind: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = JobCache(tmp_path / "jobs")
    _store(cache, BAD_FRONTIERS[kind])
    with caplog.at_level(logging.WARNING, logger="perseusd.jobs.cache"):
        entry = cache.load(SIGNATURE, _shape())
    assert entry is not None
    assert entry.frontier is None
    assert entry.p_block_w == 80.0
    assert "ignoring frontier" in caplog.text


def test_huge_and_foreign_frontiers_are_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    valid = _valid_frontier_text(tmp_path / "solve")
    cache = JobCache(tmp_path / "jobs")
    _store(cache, valid)
    loaded = cache.load(SIGNATURE, _shape())
    assert loaded is not None
    assert loaded.frontier is not None  # the control: a good frontier is used, as it was written
    assert json.dumps(frontier_to_document(loaded.frontier)) + "\n" == valid
    with caplog.at_level(logging.WARNING, logger="perseusd.jobs.cache"):
        other = cache.load(SIGNATURE, _shape(stages=3))
        monkeypatch.setattr(cache_module, "MAX_FRONTIER_BYTES", len(valid) - 1)
        huge = cache.load(SIGNATURE, _shape())
    assert other is not None
    assert other.frontier is None
    assert huge is not None
    assert huge.frontier is None
    assert "not (3, 4, 1)" in caplog.text
    assert "more than" in caplog.text


def _run_job(core: DaemonCore) -> None:
    claim(core, ME, core.registry.uuids, "train")
    csv = profile_to_csv(synthetic_profile(STAGES, seed=3, clocks_mhz=A100_CLOCKS_MHZ))
    core.handle(ME, ProfileImport("train", csv, "synthetic.csv", 80.0))
    _register_all(core)
    _wait_running(core)
    core.handle(ME, Release(gpus=()))


def _register_all(core: DaemonCore) -> list[str]:
    states = []
    for stage, gpu in enumerate(core.registry.uuids):
        message = Register(gpu, "train", 0, stage, STAGES, MICROBATCHES, "1f1b", 1)  # type: ignore[arg-type]
        states.append(core.handle(ME, message).state)  # type: ignore[attr-defined]
    return states


def _wait_running(core: DaemonCore) -> None:
    deadline_s = time.monotonic() + 120
    while True:
        job = core_job(core)
        if job.state == "running":
            return
        assert job.state in ("registered", "solving"), job
        assert time.monotonic() < deadline_s, "job never ran"
        core.tick()
        time.sleep(0.02)


@pytest.mark.parametrize("kind", ["list", "deeply-nested"])
def test_registration_with_a_damaged_cached_frontier_solves_again(
    kind: str, core: DaemonCore, tmp_path: Path
) -> None:
    _run_job(core)
    (folder,) = (tmp_path / "jobs").iterdir()
    (folder / "frontier.json").write_text(BAD_FRONTIERS[kind])
    claim(core, ME, core.registry.uuids, "train")
    assert _register_all(core) == ["registered", "solving"]  # the cached profile, a fresh solve
    _wait_running(core)
    assert json.loads(_written_frontier(folder))["points"]


def test_the_waiting_power_by_clock_is_cached_with_the_profile_and_an_older_entry_has_none(
    tmp_path: Path,
) -> None:
    cache = JobCache(tmp_path / "jobs")
    profile = synthetic_profile(STAGES, seed=3, clocks_mhz=A100_CLOCKS_MHZ)
    cache.store_profile(SIGNATURE, profile, 80.0, {"job": "train"}, ((1005, 61.25), (1410, 80.0)))
    entry = cache.load(SIGNATURE, _shape())
    assert entry is not None
    assert entry.waiting_w == ((1005, 61.25), (1410, 80.0))
    assert entry.profile.measurements == profile.measurements
    # an entry cached before the waiting power was kept: its profile.csv has no such column
    (cache.root / SIGNATURE / "profile.csv").write_text(profile_to_csv(profile))
    older = cache.load(SIGNATURE, _shape())
    assert older is not None
    assert older.waiting_w == ()
    assert older.profile.measurements == profile.measurements


def test_a_followed_frontier_that_does_not_count_late_begins_is_solved_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An older daemon's followed frontier has no `late_begins`, so its points cannot be told deployable: the
    job solves again from the cached profile. The same frontier with them is used."""
    profile = synthetic_profile(STAGES, seed=3, clocks_mhz=A100_CLOCKS_MHZ)
    dag = build_dag("1f1b", STAGES, MICROBATCHES)
    points = list(solve_frontier(dag, profile, SolverParams(unit_time_s=0.0005, p_block_w=80.0)))
    meta = PlanMeta.for_dag(dag, profile, 0.0005, 80.0)
    solved = frontier_from_points(dag, points, meta, [p.refined_time_s for p in points])
    model = SwitchModel(latency_s=0.012, lead_s=0.014, min_run_s=0.028)
    document = frontier_to_document(follow_frontier(solved, dag, profile, 80.0, model))
    cache = JobCache(tmp_path / "jobs")
    _store(cache, json.dumps(document))
    counted = cache.load(SIGNATURE, _shape())
    assert counted is not None
    assert counted.frontier is not None
    for point in document["points"]:
        del point["late_begins"]
    _store(cache, json.dumps(document))
    with caplog.at_level(logging.WARNING, logger="perseusd.jobs.cache"):
        older = cache.load(SIGNATURE, _shape())
    assert older is not None
    assert older.frontier is None
    assert "do not count their late begins" in caplog.text


def test_the_worker_writes_the_frontier_after_returning_it(tmp_path: Path) -> None:
    """The daemon's main loop never builds or writes the document (70 MB for an 8 x 32 job's frontier):
    the worker does, on a thread, once the solve has returned; nowhere when the job's folder is gone."""
    profile = synthetic_profile(STAGES, seed=3, clocks_mhz=A100_CLOCKS_MHZ)
    cache = JobCache(tmp_path / "jobs")
    cache.store_profile(SIGNATURE, profile, 80.0, {"job": "train"})
    orders = _shape().named_orders() or ()
    task = SolveInput("train", _shape(), orders, profile_to_csv(profile), "synthetic.csv", 80.0, 0.0005)
    solved = solve(replace(task, frontier_cache=str(cache.frontier_path(SIGNATURE))))
    text = _written_frontier(cache.root / SIGNATURE)
    assert text == json.dumps(frontier_to_document(solved.frontier)) + "\n"
    entry = cache.load(SIGNATURE, _shape())
    assert entry is not None
    assert entry.frontier == solved.frontier
    store_after(solved.frontier, tmp_path / "gone" / "frontier.json").join(timeout=60)
    assert not (tmp_path / "gone").exists()


def test_a_frontier_of_another_profile_is_ignored_and_a_cut_write_removed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker still writing an older profile's frontier may finish after a new profile was stored."""
    older = synthetic_profile(STAGES, seed=4, clocks_mhz=A100_CLOCKS_MHZ)
    orders = _shape().named_orders() or ()
    task = SolveInput("train", _shape(), orders, profile_to_csv(older), "older.csv", 80.0, 0.0005)
    cache = JobCache(tmp_path / "jobs")
    _store(cache, None)
    left = cache.root / SIGNATURE / ".frontier.json.123.abcd.tmp"
    left.write_text("{")
    store_after(solve(task).frontier, cache.frontier_path(SIGNATURE)).join(timeout=60)
    with caplog.at_level(logging.WARNING, logger="perseusd.jobs.cache"):
        entry = cache.load(SIGNATURE, _shape())
    assert entry is not None
    assert entry.frontier is None
    assert "another profile" in caplog.text
    _store(cache, None)
    assert not left.exists()
    assert not cache.frontier_path(SIGNATURE).exists()


def _never_on_the_main_loop(*_args: object) -> None:
    raise AssertionError("a large cached frontier was read on the daemon's main loop")


@pytest.mark.parametrize("kind", ["valid", "list"])
def test_a_large_cached_frontier_is_read_by_the_worker_not_the_main_loop(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Over `INLINE_FRONTIER_BYTES` (a 4 x 16 job's frontier is 5.7 MB, 0.4 s to read), registration leaves
    the file to the solver worker: the job is `solving` while the worker starts (a restarted daemon's) and
    reads it, then runs the cached frontier without a solve; a file the worker cannot use is solved again,
    as one read at registration would be."""
    with sim_core(tmp_path / "before", gpus=STAGES, jobs=JobSettings()) as first:
        _run_job(first)
    (folder,) = (tmp_path / "before" / "jobs").iterdir()
    written = _written_frontier(folder)
    if kind != "valid":
        (folder / "frontier.json").write_text(BAD_FRONTIERS[kind])
    shutil.copytree(tmp_path / "before" / "jobs", tmp_path / "after" / "jobs")
    monkeypatch.setattr(cache_module, "INLINE_FRONTIER_BYTES", 0)
    monkeypatch.setattr(cache_module, "parse_frontier", _never_on_the_main_loop)  # the worker has its own
    with sim_core(tmp_path / "after", gpus=STAGES, jobs=JobSettings()) as core:  # a cold solver worker
        claim(core, ME, core.registry.uuids, "train")
        with caplog.at_level(logging.INFO, logger="perseusd.jobs.solve_dispatch"):
            assert _register_all(core) == ["registered", "solving"]
            _wait_running(core)
        assert core.jobs is not None
        job = core.jobs.jobs["train"]
        assert job.cached_frontier_file is None
        if kind == "valid":
            assert "running its cached frontier" in caplog.text
            assert "solving the frontier" not in caplog.text
            assert job.frontier_document() == json.loads(written)
            assert core_job(core).planning is None
        else:
            assert "ignoring its cached frontier (solving again)" in caplog.text
            assert "solving the frontier" in caplog.text
