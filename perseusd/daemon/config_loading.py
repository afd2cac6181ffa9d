"""Where the daemon's configuration comes from: the TOML file, then the `PERSEUSD_*` environment, then the
flags, each value coerced to its setting's type (`load_config`, at start and on SIGHUP); and the settings a
restore salvages from a configuration that fails (`load_restore_config`)."""

from __future__ import annotations

import contextlib
import dataclasses
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from perseusd.daemon.config import DaemonConfig
from perseusd.errors import ConfigError

DEFAULT_CONFIG_PATH = Path("/etc/perseusd/perseusd.toml")
ENV_PREFIX = "PERSEUSD_"


def _coerce(name: str, raw: object, source: str) -> object:
    field_types = {f.name: f.type for f in dataclasses.fields(DaemonConfig)}
    kind = field_types[name]
    try:
        if kind == "int":
            if isinstance(raw, bool):
                raise ValueError("a boolean is not an integer")
            return int(str(raw))
        if kind == "float":
            return float(str(raw))
        if kind == "bool":
            return _boolean(raw)
        if kind == "Path":
            return Path(str(raw))
        if name == "log_level":
            return str(raw).upper()
        if name == "etcd_endpoints" and isinstance(raw, list):
            return ",".join(str(item) for item in raw)
        return str(raw)
    except ValueError as exc:
        raise ConfigError(f"{source}: {name}: {exc}") from None


def _boolean(raw: object) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{raw!r} is not a boolean (true/false)")


def _read_file(path: Path, required: bool) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except FileNotFoundError:
        if required:
            raise ConfigError(f"{path}: configuration file not found") from None
        return {}
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    return data


RESTORE_SETTINGS = (
    "backend",
    "sim_gpus",
    "sim_model",
    "sim_update_period_s",
    "sim_seed",
    "mixed_real",
    "runtime_dir",
    "state_dir",
    "socket_group",
    "admin_group",
    "gpu_call_timeout_s",
    "monitor_only",
)
"""What restoring GPUs needs: the settings `load_restore_config` salvages from a configuration that fails."""


def load_restore_config(
    config_path: Path | None = None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, object] | None = None,
) -> DaemonConfig:
    """The configuration a restore runs with when `load_config` fails: only `RESTORE_SETTINGS`, each taken
    from the file, the environment and the flags wherever it is valid (a bad setting elsewhere must not
    leave a GPU locked); the defaults when even those do not make a valid configuration."""
    path = config_path or DEFAULT_CONFIG_PATH
    sources: list[tuple[str, Mapping[str, object]]] = []
    with contextlib.suppress(ConfigError):
        sources.append((str(path), _read_file(path, required=False)))
    environ = environ or {}
    env = {key[len(ENV_PREFIX) :].lower(): environ[key] for key in environ if key.startswith(ENV_PREFIX)}
    sources += [("environment", env), ("flags", overrides or {})]
    values: dict[str, object] = {}
    for source, items in sources:
        for name in RESTORE_SETTINGS:
            if items.get(name) is not None:
                try:
                    values[name] = _coerce(name, items[name], source)
                except ConfigError:
                    continue
    try:
        return DaemonConfig(**values)  # type: ignore[arg-type]
    except (ConfigError, TypeError):
        return DaemonConfig()


def load_config(
    config_path: Path | None = None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, object] | None = None,
) -> DaemonConfig:
    """Build the configuration: file (default path optional, `config_path` required), environment, flags.

    `overrides` holds flag values; None values are ignored.
    """
    names = {f.name for f in dataclasses.fields(DaemonConfig)}
    values: dict[str, object] = {}
    path = config_path or DEFAULT_CONFIG_PATH
    for key, raw in _read_file(path, required=config_path is not None).items():
        if key not in names:
            raise ConfigError(f"{path}: unknown setting '{key}' (known: {', '.join(sorted(names))})")
        values[key] = _coerce(key, raw, str(path))
    for key, raw in (environ or {}).items():
        if key.startswith(ENV_PREFIX) and key[len(ENV_PREFIX) :].lower() in names:
            name = key[len(ENV_PREFIX) :].lower()
            values[name] = _coerce(name, raw, f"environment {key}")
    for key, raw in (overrides or {}).items():
        if raw is not None:
            values[key] = _coerce(key, raw, f"flag --{key.replace('_', '-')}")
    try:
        return DaemonConfig(**values)  # type: ignore[arg-type]
    except TypeError as exc:
        raise ConfigError(f"invalid configuration: {exc}") from None
