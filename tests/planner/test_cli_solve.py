"""`perseusctl solve`, in-process and once as a subprocess, on a synthetic and on the bundled A100 profile."""

from __future__ import annotations

import io
import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from perseusd.ctl.main import main
from perseusd.ctl.planning_inputs import BUNDLED_NAMES
from perseusd.ctl.progress import ProgressBar
from perseusd.planner.bundled import BUNDLED_PROFILES
from perseusd.planner.plan_read import load_frontier
from perseusd.planner.profile_csv import write_profile
from tests.planner.periphery_profiles import CLOCKS_MHZ, shaped_profile

SUMMARY_KEYS = {
    "points",
    "t_min_s",
    "t_max_s",
    "solve_s",
    "energy_at_t_min_j",
    "all_max_time_s",
    "all_max_energy_j",
}


@pytest.fixture
def profile_csv(tmp_path: Path) -> Path:
    path = tmp_path / "shaped.csv"
    write_profile(shaped_profile([1.0, 1.3, 0.9, 1.2]), path)
    return path


def solve_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, object]:
    assert main(["solve", *args, "--json"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""  # no progress bar: stderr is not a terminal
    info = json.loads(captured.out)
    assert isinstance(info, dict)
    return info


def read_csv(path: Path) -> list[tuple[float, float]]:
    lines = path.read_text().splitlines()
    assert lines[0] == "time,energy"
    return [(float(t), float(e)) for t, e in (line.split(",") for line in lines[1:])]


def test_solve_synthetic(tmp_path: Path, profile_csv: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    info = solve_json(
        capsys, "--profile", str(profile_csv), "--stages", "4", "--microbatches", "6", "--out", str(out)
    )
    assert info.keys() >= SUMMARY_KEYS
    rows = read_csv(out / "frontier.csv")
    assert len(rows) == info["points"] > 5
    assert info["t_min_s"] <= info["t_max_s"]
    assert rows[0][0] == info["t_max_s"]
    assert rows[-1][0] == info["t_min_s"]
    assert all(a[0] > b[0] for a, b in itertools.pairwise(rows))
    assert rows[-1][1] == info["energy_at_t_min_j"]
    assert info["p_block_w"] == 0.0  # a user profile has no default blocking power
    frontier = load_frontier(out / "frontier.json")
    assert len(frontier.points) == len(rows)
    assert [(p.time_s, p.model_energy_j) for p in frontier.points] == rows
    assert frontier.meta.num_stages == 4
    assert frontier.meta.profile_source == str(profile_csv)
    assert {c for p in frontier.points for c in p.node_clocks_mhz()} <= set(CLOCKS_MHZ)
    assert info["all_max_time_s"] >= info["t_min_s"] - 0.001 * 4 * 6 * 2  # quantised times floor


def test_solve_without_out_only_looks(
    tmp_path: Path, profile_csv: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    info = solve_json(capsys, "--profile", str(profile_csv), "--stages", "4", "--microbatches", "6")
    assert info["points"] > 5
    assert (info["frontier_csv"], info["frontier_json"]) == (None, None)
    assert [p.name for p in tmp_path.iterdir()] == [profile_csv.name]  # nothing written beside the profile


def test_solve_text_output_plot_and_options(
    tmp_path: Path, profile_csv: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, png = tmp_path / "out", tmp_path / "frontier.png"
    args = [
        "--profile",
        str(profile_csv),
        "--stages",
        "2",
        "--microbatches",
        "4",
        "--schedule",
        "interleaved",
    ]
    args += [
        "--chunks",
        "2",
        "--unit-time",
        "0.002",
        "--p2p-power",
        "40",
        "--out",
        str(out),
        "--plot",
        str(png),
    ]
    assert main(["solve", *args]) == 0
    text = capsys.readouterr().out
    assert "frontier points in" in text
    assert "all-max" in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    meta = load_frontier(out / "frontier.json").meta
    assert (meta.schedule, meta.num_chunks, meta.unit_time_s, meta.p_block_w) == (
        "interleaved",
        2,
        0.002,
        40.0,
    )


def test_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("stage,instruction,frequency,time\n")
    for profile, fragment in [
        (str(tmp_path / "absent.csv"), "cannot read profile"),
        (str(bad), "missing column"),
    ]:
        code = main(
            ["solve", "--profile", profile, "--stages", "2", "--microbatches", "2", "--out", str(tmp_path)]
        )
        err = capsys.readouterr().err
        assert code == 1
        assert err.startswith("perseusctl: error:")
        assert fragment in err
        assert err.count("\n") == 1


def test_too_few_profile_stages(profile_csv: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["solve", "--profile", str(profile_csv), "--stages", "5", "--microbatches", "5", "--out", "x"]
    )
    assert code == 1
    assert "has 4 stages" in capsys.readouterr().err


def test_bad_unit_time_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(
            [
                "solve",
                "--profile",
                "a40",
                "--stages",
                "2",
                "--microbatches",
                "2",
                "--out",
                "x",
                "--unit-time",
                "0",
            ]
        )
    assert info.value.code == 2
    assert "must be a positive number" in capsys.readouterr().err


def test_bundled_names_are_in_sync() -> None:
    assert set(BUNDLED_NAMES) == set(BUNDLED_PROFILES)


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_draws_only_on_a_terminal() -> None:
    terminal = FakeTerminal()
    bar = ProgressBar("solving", 10, stream=terminal, min_interval_s=0.0)
    bar.update(5)
    bar.close(10)
    assert "[###############...............] 5/10" in terminal.getvalue()
    assert terminal.getvalue().endswith("10/10\n")
    pipe = io.StringIO()
    silent = ProgressBar("solving", 10, stream=pipe, min_interval_s=0.0)
    silent.update(5)
    silent.close(10)
    assert pipe.getvalue() == ""


def test_solve_as_a_subprocess(tmp_path: Path, profile_csv: Path) -> None:
    out = tmp_path / "out"
    args = [
        "--profile",
        str(profile_csv),
        "--stages",
        "3",
        "--microbatches",
        "4",
        "--out",
        str(out),
        "--json",
    ]
    code = "import sys; from perseusd.ctl.main import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run(
        [sys.executable, "-c", code, "solve", *args], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    assert len(read_csv(out / "frontier.csv")) == info["points"]


def test_parser_imports_no_planner_or_plotting() -> None:
    code = (
        "import sys; from perseusd.ctl.main import build_parser; build_parser(); "
        "print(sorted(m for m in ('matplotlib', 'scipy', 'perseusd.planner.solver') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]"


def test_solve_bundled_a100_reproduces_the_published_frontier(
    tmp_path: Path, reference_data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    info = solve_json(
        capsys, "--profile", "a100_sxm", "--stages", "8", "--microbatches", "12", "--out", str(out)
    )
    assert info["p_block_w"] == 83.64  # the bundled profile's default blocking power
    rows = read_csv(out / "frontier.csv")
    frontiers = reference_data / "perseus-artifact" / "frontiers"
    published = read_csv(frontiers / "a100_sxm_gpt3-175b_bf16_mb12.csv")
    assert len(rows) == len(published) == info["points"]
    for (time_s, energy_j), (ref_time_s, ref_energy_j) in zip(rows, published, strict=True):
        assert time_s == pytest.approx(ref_time_s, abs=1e-9)
        assert energy_j == pytest.approx(ref_energy_j, rel=1e-6)
    assert info["energy_at_t_min_j"] < info["all_max_energy_j"]
    assert abs(info["t_min_s"] - info["all_max_time_s"]) < 0.05
