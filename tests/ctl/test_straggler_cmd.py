"""`perseusctl straggler` and the straggler views of `jobs` and `status`: argument parsing, usage errors
(nothing sent), the confirmation line, and golden tables over constructed `JobInfo` replies."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from perseus_client.protocol import AnnounceStragglerOk, PipelineInfo, StragglerInfo

from perseusd.ctl.jobs_cmd import jobs_json, render_jobs, render_jobs_brief, summary_line
from perseusd.ctl.main import build_parser
from perseusd.ctl.straggler_cmd import render_reply
from tests.support.ctl import assert_unreachable, assert_usage_error
from tests.support.ctl import run_ctl as _ctl
from tests.support.job_info import BARE_JOB

pytestmark = pytest.mark.timeout(60)


def _pipeline(pipeline: int, compute_s: float | None, slowness: float | None, node: str = "") -> PipelineInfo:
    return PipelineInfo(
        pipeline=pipeline,
        stages_registered=4,
        iterations=300,
        iteration_time_s=2.9,
        compute_time_s=compute_s,
        plan_index=None if slowness is None else 12,
        plan_time_s=None if slowness is None else 2.8,
        plan_since_step=None if slowness is None else 240,
        slowness=slowness,
        node=node,
    )


STRAGGLING = dataclasses.replace(
    BARE_JOB,
    job="llama",
    state="running",
    state_for_s=600.0,
    num_stages=4,
    num_microbatches=8,
    pipelines=(_pipeline(0, 2.8, 1.0), _pipeline(1, 3.36, 1.2), _pipeline(2, None, None, node="node-b")),
    cached=True,
    frontier_points=40,
    plan_index=12,
    plan_time_s=2.8,
    plan_energy_j=9000.0,
    fastest_time_s=2.8,
    clock_changes_per_iteration=2.5,
    wrong_clock_fraction=0.0,
    straggler=StragglerInfo(pipeline=1, factor=1.2, source="announced", since_step=240),
    target_time_s=3.36,
    all_max_time_s=2.81,
    all_max_energy_j=10500.0,
    energy_saved_j=123456.0,
    cluster="fresh",
    energy_saved_source="predicted",
)

JOBS_GOLDEN = """\
JOB    UID   STATE             SCHEDULE  POLICY   PROFILING  POINTS  DEPLOYED (PREDICTED)             CHG/IT  WRONG
llama  1000  running 0h10m00s  1f1b 4x8  fastest  -          40      #12 2.8000 s 9000.0 J (+0.00 %)  2.5     0.0 %
  straggler: pipeline 1 x1.20 (announced, since step 240), target 3.3600 s per iteration, saved 123.5 kJ vs all-max (predicted), cluster fresh
  PIPELINE  NODE    STAGES  ITERATIONS  ITER TIME  COMPUTE   PLAN          SLOWNESS
  0         local   4/4     300         2.9000 s   2.8000 s  #12 2.8000 s  x1.00
  1         local   4/4     300         2.9000 s   3.3600 s  #12 2.8000 s  x1.20     <- straggler
  2         node-b  4/4     300         2.9000 s   -         -             -"""  # noqa: E501

BRIEF_TAIL = """\
  straggler: pipeline 1 x1.20 (announced, since step 240), target 3.3600 s per iteration, saved 123.5 kJ vs all-max (predicted), cluster fresh
  pipeline 0: 4/4 stages, 300 iterations, 2.9000 s per iteration
  pipeline 1: 4/4 stages, 300 iterations, 2.9000 s per iteration
  pipeline 2: 4/4 stages, 300 iterations, 2.9000 s per iteration (node node-b)"""  # noqa: E501


def test_jobs_table_marks_the_straggler_and_remote_pipelines() -> None:
    assert render_jobs([STRAGGLING]) == JOBS_GOLDEN


def test_status_section_has_the_summary_and_short_pipeline_lines() -> None:
    lines = render_jobs_brief([STRAGGLING]).splitlines()
    assert lines[:2] == JOBS_GOLDEN.splitlines()[:2]
    assert "\n".join(lines[2:]) == BRIEF_TAIL


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"straggler": None, "target_time_s": None, "energy_saved_j": 0.0, "cluster": ""}, None),
        (
            {"straggler": None, "target_time_s": None, "energy_saved_j": 0.0, "cluster": "stale"},
            "  cluster stale",
        ),
        (
            {"straggler": StragglerInfo(0, 1.05, "cluster", 7), "cluster": "", "energy_saved_j": 0.0},
            "  straggler: pipeline 0 x1.05 (cluster, since step 7), target 3.3600 s per iteration",
        ),
    ],
)
def test_summary_line_shows_only_what_is_known(changes: dict[str, object], expected: str | None) -> None:
    assert summary_line(dataclasses.replace(STRAGGLING, **changes)) == expected  # type: ignore[arg-type]


def test_jobs_json_has_the_straggler_and_per_pipeline_fields() -> None:
    body = json.loads(json.dumps(jobs_json([STRAGGLING])))[0]
    assert body["straggler"] == {"pipeline": 1, "factor": 1.2, "source": "announced", "since_step": 240}
    assert (body["target_time_s"], body["energy_saved_j"], body["cluster"]) == (3.36, 123456.0, "fresh")
    assert body["pipelines"][1]["slowness"] == 1.2
    assert body["pipelines"][2]["node"] == "node-b"
    assert body["pipelines"][2]["plan_index"] is None


@pytest.mark.parametrize(
    ("clear", "shared", "expected"),
    [
        (False, True, "job j1: pipeline 0 announced as a straggler (x1.20); shared with the cluster"),
        (False, False, "job j1: pipeline 0 announced as a straggler (x1.20); this node only"),
        (True, True, "job j1: pipeline 0 straggler cleared; shared with the cluster"),
    ],
)
def test_confirmation_line(clear: bool, shared: bool, expected: str) -> None:
    assert render_reply(AnnounceStragglerOk("j1", 0, 1.2, clear, shared)) == expected


def test_parser_reads_factor_and_clear() -> None:
    parser = build_parser()
    args = parser.parse_args(["straggler", "j1", "--pipeline", "3", "--factor", "1.25", "--json"])
    assert (args.job, args.pipeline, args.factor, args.clear, args.json) == ("j1", 3, 1.25, False, True)
    args = parser.parse_args(["straggler", "j1", "--pipeline", "0", "--clear"])
    assert (args.pipeline, args.factor, args.clear, args.json) == (0, None, True, False)
    assert parser.parse_args(["straggler", "j1", "--pipeline", "0", "--factor", "1"]).factor == 1.0


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--pipeline", "0"), "one of the arguments --factor --clear is required"),
        (("--pipeline", "0", "--factor", "1.2", "--clear"), "not allowed with argument"),
        (("--factor", "1.2"), "the following arguments are required: --pipeline"),
        (("--pipeline", "-1", "--factor", "1.2"), "must be 0 or more"),
        (("--pipeline", "one", "--factor", "1.2"), "'one' is not an integer"),
        (("--pipeline", "0", "--factor", "0.9"), "must be at least 1"),
        (("--pipeline", "0", "--factor", "inf"), "must be a finite number"),
        (("--pipeline", "0", "--factor", "nan"), "must be a finite number"),
    ],
)
def test_usage_errors_exit_2_before_contacting_the_daemon(
    tmp_path: Path, args: tuple[str, ...], needle: str
) -> None:
    assert_usage_error(_ctl(tmp_path, "straggler", "j1", *args), needle)


def test_unreachable_daemon_exits_2_with_one_line(tmp_path: Path) -> None:
    out = _ctl(tmp_path, "straggler", "j1", "--pipeline", "0", "--factor", "1.2")
    assert_unreachable(out)
    assert out.stdout == ""
