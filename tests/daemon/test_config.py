"""The one frozen configuration: file, then environment, then flags; `--check-config`."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from perseusd.daemon.config import DaemonConfig
from perseusd.daemon.config_loading import load_config
from perseusd.errors import ConfigError
from perseusd.pool.move_writer import ETCD_MAX_TXN_OPS


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


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        ({"signal_source": "weather"}, "signal_source must be one of off, trace, electricitymaps"),
        ({"signal_source": "trace", "signal_trace": "grid.csv"}, "signal_trace must be an absolute path"),
        ({"signal_source": "electricitymaps"}, "signal_zone must be set"),
        ({"signal_token_file": "token"}, "signal_token_file must be an absolute path"),
        ({"signal_api_url": "ftp://x"}, "signal_api_url must be http"),
        ({"signal_max_age_s": "0"}, "signal_max_age_s must be positive"),
        ({"carbon_forecaster": "oracle"}, "carbon_forecaster must be one of auto, svr, persistence"),
        ({"carbon_eta": "1.5"}, "carbon_eta must be 0..1"),
        ({"carbon_interval_s": "-1"}, "carbon_interval_s must be positive"),
    ],
)
def test_bad_signal_settings_are_named(tmp_path: Path, settings: dict[str, str], problem: str) -> None:
    empty = tmp_path / "perseusd.toml"
    empty.write_text("")
    with pytest.raises(ConfigError, match=problem):
        load_config(empty, {}, settings)


def test_the_signal_is_off_by_default_and_the_carbon_policy_can_be_the_default(tmp_path: Path) -> None:
    empty = tmp_path / "perseusd.toml"
    empty.write_text("")
    config = load_config(empty, {}, {"default_policy": "carbon", "default_policy_target": "0.05"})
    assert config.signal_source == "off"
    assert config.default_policy == "carbon"
    assert (config.carbon_interval_s, config.carbon_eta) == (1800.0, 0.24)


def test_scikit_learn_stays_off_the_daemon_and_ctl_import_paths() -> None:
    code = "import sys, perseusd.daemon.main, perseusd.ctl.main; print('sklearn' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "False"


def test_a_power_pool_needs_etcd_and_a_key_safe_name() -> None:
    with pytest.raises(ConfigError, match="power_pool needs etcd_endpoints"):
        DaemonConfig(power_pool="row-3")
    with pytest.raises(ConfigError, match="power_pool must match"):
        DaemonConfig(power_pool="row/3", etcd_endpoints="127.0.0.1:2379")
    with pytest.raises(ConfigError, match="power_pool_safe_cap_w"):
        DaemonConfig(power_pool_safe_cap_w=-1)
    config = load_config(
        None, {"PERSEUSD_ETCD_ENDPOINTS": "127.0.0.1:2379", "PERSEUSD_POWER_POOL": "row-3"}, {}
    )
    assert config.power_pool == "row-3"
    assert config.power_pool_safe_cap_w == 0.0
    assert config.power_pool_absent_node == "hold"  # an absent node's grant stays reserved by default
    with pytest.raises(ConfigError, match='power_pool_absent_node must be "hold" or "release"'):
        DaemonConfig(power_pool_absent_node="drop")
    assert config.power_pool_etcd_max_txn_ops == ETCD_MAX_TXN_OPS == 128  # etcd's default --max-txn-ops
    with pytest.raises(ConfigError, match=r"power_pool_etcd_max_txn_ops must be in \[8, 4096\]"):
        DaemonConfig(power_pool_etcd_max_txn_ops=4)


def test_perseusd_help_describes_the_daemon_and_reset_its_own() -> None:
    def help_of(*args: str) -> str:
        out = subprocess.run(
            [sys.executable, "-m", "perseusd.daemon.main", *args, "--help"],
            capture_output=True, text=True, timeout=30, check=True,
        )  # fmt: skip
        return out.stdout

    main_help = help_of()
    assert "GPU energy daemon" in main_help
    assert "--state-dir STATE_DIR" in main_help
    assert "state file and job cache" in main_help  # every flag says what it is
    reset_help = help_of("reset")
    assert reset_help.startswith("usage: perseusd reset")
    assert "Restore every GPU the state file records" in reset_help
