"""`perseusctl jobs`, `frontier`, `plan`, `profile` and the jobs part of `status`: rendering (golden) over
constructed replies and documents, argument parsing, and the checks done before anything is sent."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from perseus_client.protocol import (
    DaemonHealth,
    GpuStatus,
    JobInfo,
    LeaseInfo,
    PipelineInfo,
    PlanStats,
    ProfilingInfo,
    StatusReply,
)

from perseusd.ctl.daemon_link import load_frontier_text, load_plan_text
from perseusd.ctl.frontier_cmd import plot_deployed, render_frontier
from perseusd.ctl.jobs_cmd import jobs_json, render_jobs
from perseusd.ctl.main import build_parser
from perseusd.ctl.plan_cmd import UsageError, parse_target, render_plan
from perseusd.ctl.profile_cmd import write_atomically
from perseusd.ctl.status_cmd import render_table, status_json
from perseusd.ctl.terminal import CLEAR_SCREEN, watch
from perseusd.errors import PlanFormatError
from perseusd.planner.dag import build_dag
from perseusd.planner.plan import PlanMeta, frontier_document, plan_from_point
from tests.support.ctl import assert_unreachable, assert_usage_error
from tests.support.ctl import run_ctl as _ctl
from tests.support.job_info import BARE_JOB
from tests.support.synthetic import Point

pytestmark = pytest.mark.timeout(60)

POINTS = (
    Point(14, 0.14, 18.0, 18.5, (900,) * 8),
    Point(12, 0.12, 21.0, 21.5, (1410, 1200, 1200, 1410, 1410, 1200, 1200, 900)),
    Point(10, 0.10, 25.0, 24.0, (1410,) * 8),
)
"""The frontier of job gpt3 (`RUNNING`), which its frontier and plan documents below are made of; it runs
point `DEPLOYED`."""
DEPLOYED = 1

RUNNING = replace(
    BARE_JOB,
    job="gpt3",
    state="running",
    state_for_s=3725.0,
    num_stages=2,
    num_microbatches=2,
    pipelines=(
        PipelineInfo(0, 2, 120, 0.125, 0.1212, 1, 0.12, 80, 1.01, ""),
        PipelineInfo(1, 1, 0, None, None, None, None, None, None, ""),
    ),
    policy="slowdown",
    target=0.05,
    profiling=ProfilingInfo(iterations=40, clocks_done=64, clocks_total=64, energy_j=51234.4),
    frontier_points=len(POINTS),
    plan_index=DEPLOYED,
    plan_time_s=POINTS[DEPLOYED].time_s,
    plan_energy_j=POINTS[DEPLOYED].refined_energy_j,
    fastest_time_s=min(point.time_s for point in POINTS),
    clock_changes_per_iteration=3.0,
    wrong_clock_fraction=0.0125,
    all_max_time_s=0.1,
    all_max_energy_j=25.0,
    energy_saved_j=4175.0,
    energy_saved_source="measured",
    measured_energy_j=20.125,
    measured_all_max_energy_j=24.5,
)
PROFILING = replace(
    BARE_JOB,
    job="bert",
    uid=0,
    state="profiling",
    state_for_s=5.0,
    schedule="interleaved",
    num_stages=4,
    num_microbatches=8,
    chunks=2,
    profiling=ProfilingInfo(iterations=3, clocks_done=2, clocks_total=38, energy_j=812.0),
    error="solver failed: empty frontier",
)

JOBS_GOLDEN = """\
JOB   UID   STATE               SCHEDULE           POLICY        PROFILING                              POINTS  DEPLOYED (PREDICTED)           CHG/IT  WRONG
gpt3  1000  running 1h02m05s    1f1b 2x2           slowdown 5 %  40 it, 64/64 clocks, 51234 J measured  3       #1 0.1200 s 21.5 J (+20.00 %)  3.0     1.2 %
  measured 20.1 J per iteration vs 24.5 J at all-max, saved 4.2 kJ vs all-max (measured)
  PIPELINE  NODE   STAGES  ITERATIONS  ITER TIME  COMPUTE   PLAN         SLOWNESS
  0         local  2/2     120         0.1250 s   0.1212 s  #1 0.1200 s  x1.01
  1         local  1/2     0           -          -         -            -
bert  0     profiling 0h00m05s  interleaved 4x8x2  fastest       3 it, 2/38 clocks, 812 J measured      0       -                              -       -  ERROR: solver failed: empty frontier"""  # noqa: E501


def test_jobs_table_golden() -> None:
    assert render_jobs([RUNNING, PROFILING]) == JOBS_GOLDEN
    assert render_jobs([]) == "no jobs"


def test_jobs_json_keeps_every_field_and_nulls() -> None:
    body = json.loads(json.dumps(jobs_json([RUNNING, PROFILING])))
    assert len(body[0]) == len(JobInfo.__dataclass_fields__)
    assert body[0]["pipelines"][1] == {
        "pipeline": 1,
        "stages_registered": 1,
        "iterations": 0,
        "iteration_time_s": None,
        "compute_time_s": None,
        "plan_index": None,
        "plan_time_s": None,
        "plan_since_step": None,
        "slowness": None,
        "node": "",
    }
    assert (body[0]["straggler"], body[0]["energy_saved_j"], body[0]["cluster"]) == (None, 4175.0, "")
    assert body[1]["plan_index"] is None
    assert body[1]["profiling"]["clocks_total"] == 38


def _status(jobs: tuple[JobInfo, ...], plan: PlanStats | None) -> StatusReply:
    return StatusReply(
        daemon=DaemonHealth("0.1.0", 3, 42, 65.0, 1, 10, 0, {}, 0, 0, None, 0),
        gpus=(
            GpuStatus(
                "GPU-a", "A100", 1260, 1260, 250.0, 400.0, 1.5, LeaseInfo(7, 1000, "gpt3"), None, {}, plan
            ),
            GpuStatus("GPU-c", "A100", None, None, None, None, None, None, "GPU is lost", {}),
        ),
        jobs=jobs,
    )


STATUS_GOLDEN_TAIL = """\
GPU  UUID   PCI BUS ID  NAME  SM MHZ  LOCKED  POWER W  LIMIT W  ENERGY J  PLAN                                                           LEASE
-    GPU-a  -           A100  1260    1260    250.0    400      1.5       4 comps, 96 changes (7 early), 2 late, 0 errors, 0.31/1.20 ms  pid 7 uid 1000 gpt3
-    GPU-c  -           A100  ERROR: GPU is lost

JOB   UID   STATE             SCHEDULE  POLICY        PROFILING                              POINTS  DEPLOYED (PREDICTED)           CHG/IT  WRONG
gpt3  1000  running 1h02m05s  1f1b 2x2  slowdown 5 %  40 it, 64/64 clocks, 51234 J measured  3       #1 0.1200 s 21.5 J (+20.00 %)  3.0     1.2 %
  measured 20.1 J per iteration vs 24.5 J at all-max, saved 4.2 kJ vs all-max (measured)
  pipeline 0: 2/2 stages, 120 iterations, 0.1250 s per iteration
  pipeline 1: 1/2 stages, 0 iterations, - per iteration"""  # noqa: E501


def test_status_shows_plan_stats_and_jobs() -> None:
    stats = PlanStats(4, 96, 10, 2, 0, 0, 7, 0.3125, 1.2)
    table = render_table(_status((RUNNING,), stats))
    assert table.endswith(STATUS_GOLDEN_TAIL)
    assert status_json(_status((RUNNING,), stats))["jobs"][0]["job"] == "gpt3"


def test_status_without_plans_or_jobs_has_neither_column_nor_section() -> None:
    table = render_table(_status((), None))
    assert "PLAN" not in table
    assert "JOB" not in table
    assert table.splitlines()[-1] == "-    GPU-c  -           A100  ERROR: GPU is lost"


# ------------------------------------------------------------------ documents


DAG = build_dag("1f1b", 2, 2, 1)
META = PlanMeta("sha256:00", "synthetic", "1f1b", 2, 2, 1, 0.01, 60.0)
FRONTIER_TEXT = json.dumps(frontier_document(DAG, POINTS, META))
PLAN_TEXT = json.dumps(plan_from_point(DAG, POINTS[DEPLOYED], META))

FRONTIER_GOLDEN = """\
job gpt3: 3 frontier points, point 1 deployed (synthetic, 1f1b S=2 M=2, unit time 0.01 s)
INDEX  TIME S  MODEL J  PROFILE J  SLOWER    SAVED
0      0.1400  18.0     18.5       +40.00 %  22.9 %
1      0.1200  21.0     21.5       +20.00 %  10.4 %  <- deployed
2      0.1000  25.0     24.0       +0.00 %   0.0 %"""

PLAN_GOLDEN = """\
job gpt3: point 1 of 3, policy slowdown 5 %
planned   0.1200 s per iteration (+20.00 % vs fastest), predicted 21.0 J (cost model), 21.5 J (profile)
from      synthetic, 1f1b S=2 M=2, unit time 0.01 s, blocking power 60 W
stage 0: 4 computations, 1200..1410 MHz, 2 clock changes per iteration
  F0@1410 F1@1200
  B0@1200 B1@1410
stage 1: 4 computations, 900..1410 MHz, 3 clock changes per iteration
  F0@1410 B0@1200
  F1@1200 B1@900"""


def test_frontier_table_golden() -> None:
    frontier = load_frontier_text(FRONTIER_TEXT, "gpt3")
    assert render_frontier(frontier, "gpt3", deployed=DEPLOYED) == FRONTIER_GOLDEN
    assert "deployed" not in render_frontier(frontier, "gpt3", deployed=None).splitlines()[1]


def test_plan_golden_wraps_per_stage() -> None:
    plan = load_plan_text(PLAN_TEXT, "gpt3")
    assert render_plan(plan, "gpt3", RUNNING, width=17) == PLAN_GOLDEN
    one_line = render_plan(plan, "gpt3", None, width=200).splitlines()
    assert one_line[0] == "job gpt3"
    assert "  F0@1410 F1@1200 B0@1200 B1@1410" in one_line


def test_interleaved_plan_labels_chunks() -> None:
    dag = build_dag("interleaved", 2, 2, 2)
    meta = PlanMeta("sha256:00", "synthetic", "interleaved", 2, 2, 2, 0.01, 60.0)
    point = Point(10, 0.1, 1.0, 1.0, (1410,) * dag.num_computations)
    plan = load_plan_text(json.dumps(plan_from_point(dag, point, meta)), "j")
    text = render_plan(plan, "j", None, width=500)
    assert "F0c1@1410" in text
    assert "chunks=2" in text


def test_malformed_document_is_one_line_naming_the_job() -> None:
    doc = json.loads(FRONTIER_TEXT)
    doc["points"][1]["clock_changes"] = [[0, 5, 1410]]
    with pytest.raises(PlanFormatError) as excinfo:
        load_frontier_text(json.dumps(doc), "gpt3")
    message = str(excinfo.value)
    assert message.startswith("the frontier of job gpt3: points[1].clock_changes[0]")
    assert "/tmp" not in message
    assert "\n" not in message


def test_plot_marks_the_deployed_point(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "frontier.png"
    plot_deployed(load_frontier_text(FRONTIER_TEXT, "gpt3"), DEPLOYED, str(out), "gpt3")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------ arguments


@pytest.mark.parametrize(
    ("policy", "text", "expected"),
    [
        ("slowdown", "5%", 0.05),
        ("slowdown", " 2.5 % ", 0.025),
        ("slowdown", "0.05", 0.05),
        ("slowdown", "0", 0.0),
        ("time", "3.2", 3.2),
        ("time", "3.2s", 3.2),
        ("fastest", None, 0.0),
        ("min_energy", None, 0.0),
    ],
)
def test_parse_target(policy: str, text: str | None, expected: float) -> None:
    assert parse_target(policy, text) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("policy", "text", "needle"),
    [
        ("slowdown", None, "needs --target"),
        ("time", None, "needs --target"),
        ("slowdown", "five", "is not a slowdown"),
        ("slowdown", "-5%", "out of range"),
        ("time", "0", "out of range"),
        ("time", "nan", "out of range"),
        ("fastest", "5%", "not used by policy fastest"),
    ],
)
def test_parse_target_rejects(policy: str, text: str | None, needle: str) -> None:
    with pytest.raises(UsageError, match=needle):
        parse_target(policy, text)


def test_parser_knows_every_job_command() -> None:
    parser = build_parser()
    args = parser.parse_args(["plan", "gpt3", "--policy", "slowdown", "--target", "5%", "--json"])
    assert (args.job, args.policy, args.target, args.json) == ("gpt3", "slowdown", "5%", True)
    assert parser.parse_args(["jobs", "--watch"]).watch == 2.0
    assert parser.parse_args(["jobs", "--watch", "0.5"]).watch == 0.5
    assert parser.parse_args(["jobs"]).watch is None
    args = parser.parse_args(["profile", "import", "gpt3", "p.csv", "--p-block-w", "83.64"])
    assert (args.action, args.job, args.file, args.p_block_w) == ("import", "gpt3", "p.csv", 83.64)
    assert parser.parse_args(["profile", "export", "gpt3", "-o", "x.csv"]).output == "x.csv"
    assert parser.parse_args(["frontier", "gpt3", "--plot", "f.png"]).plot == "f.png"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("plan", "j", "--policy", "bogus"), "invalid choice"),
        (("plan", "j", "--target", "5%"), "--target needs --policy"),
        (("plan", "j", "--policy", "slowdown"), "needs --target"),
        (("profile", "import", "j", "p.csv", "--p-block-w", "-1"), "watts >= 0"),
        (("profile",), "ACTION"),
    ],
)
def test_usage_errors_exit_2_before_contacting_the_daemon(
    tmp_path: Path, args: tuple[str, ...], needle: str
) -> None:
    assert_usage_error(_ctl(tmp_path, *args), needle)


def test_broken_profile_is_rejected_locally_with_line_and_column(tmp_path: Path) -> None:
    bad = tmp_path / "prof.csv"
    bad.write_text(
        "stage,instruction,frequency,time,energy\n"
        "0,forward,1410,0.05,20.0\n"
        "0,backward,1410,nan,40.0\n"
        "0,sideways,1410,0.05,20.0\n"
    )
    out = _ctl(tmp_path / "no-daemon", "profile", "import", "gpt3", str(bad))
    assert out.returncode == 1, out.stderr
    lines = out.stderr.strip().splitlines()
    assert lines[0] == f"{bad}:3: column 'time': 'nan' is not a finite number (seconds)"
    assert lines[1].startswith(f"{bad}:4: column 'instruction': unknown instruction 'sideways'")
    assert lines[-1] == f"perseusctl: error: {bad}: 2 problems; nothing was sent to perseusd"
    assert "Traceback" not in out.stderr


def test_missing_profile_file_is_one_line(tmp_path: Path) -> None:
    out = _ctl(tmp_path, "profile", "import", "gpt3", str(tmp_path / "nope.csv"))
    assert out.returncode == 1
    assert (
        out.stderr.strip()
        == f"perseusctl: error: cannot read {tmp_path / 'nope.csv'}: No such file or directory"
    )


@pytest.mark.parametrize(
    "args", [("jobs",), ("frontier", "j"), ("plan", "j"), ("profile", "export", "j"), ("status",)]
)
def test_unreachable_daemon_exits_2(tmp_path: Path, args: tuple[str, ...]) -> None:
    assert_unreachable(_ctl(tmp_path, *args))


def test_write_atomically_replaces_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "p.csv"
    target.write_text("old")
    write_atomically(target, "stage,instruction\n")
    assert target.read_text() == "stage,instruction\n"
    assert [p.name for p in tmp_path.iterdir()] == ["p.csv"]


@pytest.mark.parametrize("tty", [True, False])
def test_watch_redraws_until_ctrl_c(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tty: bool
) -> None:
    screens = iter(["first", "second"])

    def render() -> str:
        screen = next(screens, None)
        if screen is None:
            raise KeyboardInterrupt
        return screen

    monkeypatch.setattr(sys.stdout, "isatty", lambda: tty)
    assert watch(render, 0.0, clear=True) == 0
    clear = CLEAR_SCREEN if tty else ""  # no control codes into a pipe
    assert capsys.readouterr().out == f"{clear}first\n{clear}second\n"
