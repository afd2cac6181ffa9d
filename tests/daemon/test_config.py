"""The one frozen configuration: file, then environment, then flags; `--check-config`."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from perseusd.daemon.config import DaemonConfig, load_config
from perseusd.errors import ConfigError


def test_precedence_file_env_flags(tmp_path: Path) -> None:
    path = tmp_path / "perseusd.toml"
    path.write_text('backend = "sim"\nsim_gpus = 3\nlog_level = "debug"\nruntime_dir = "/run/x"\n')
    config = load_config(path, {"PERSEUSD_SIM_GPUS": "5", "PERSEUSD_SIM_MODEL": "a40"}, {"sim_gpus": 7})
    assert config.backend == "sim"
    assert config.sim_gpus == 7
    assert config.sim_model == "a40"
    assert config.log_level == "DEBUG"
    assert config.runtime_dir == Path("/run/x")
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.sim_gpus = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('backend = "cuda"', "backend"),
        ("colour = 1", "unknown setting"),
        ("sim_gpus = [", "not valid TOML"),
        ('runtime_dir = "relative"', "absolute"),
        ("metrics_http_port = 70000", "metrics_http_port"),
        ('metrics_textfile_dir = "relative/dir"', "metrics_textfile_dir"),
        ("metrics_textfile_interval_s = 0.1", "metrics_textfile_interval_s"),
    ],
)
def test_bad_files_fail_with_the_setting_named(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "perseusd.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=problem):
        load_config(path, {}, {})


def test_missing_explicit_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.toml", {}, {})


def test_check_config_prints_effective_toml(tmp_path: Path) -> None:
    path = tmp_path / "perseusd.toml"
    path.write_text("sim_gpus = 4\n")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "perseusd.daemon.main",
            "--config",
            str(path),
            "--backend",
            "sim",
            "--check-config",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    import tomllib

    values = tomllib.loads(out.stdout)
    assert values["sim_gpus"] == 4
    assert values["backend"] == "sim"
    assert set(values) == {f.name for f in dataclasses.fields(DaemonConfig)}


def test_metrics_are_off_by_default() -> None:
    assert not DaemonConfig().metrics_enabled
    assert DaemonConfig(metrics_http_port=9464).metrics_enabled
    assert DaemonConfig(metrics_textfile_dir="/var/lib/prometheus/node-exporter").metrics_enabled
