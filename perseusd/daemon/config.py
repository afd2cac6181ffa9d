"""The daemon's one frozen configuration: every setting with its docstring, the checks a configuration must
pass to be built, and what is derived from it. `config_loading.py` builds it from the TOML file, then the
`PERSEUSD_*` environment, then the flags."""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from perseus_client.version import PROTOCOL_MINOR

from perseusd.cluster.config import ClusterConfig
from perseusd.errors import ConfigError
from perseusd.gpu.select import BACKEND_KINDS, MIXED_REAL_KINDS
from perseusd.leasing.gpu_access import ACCESS_MODES
from perseusd.planner.policy import POLICIES
from perseusd.pool.keys import POOL_PATTERN

BACKENDS = BACKEND_KINDS
SIM_MODELS = ("a100_sxm", "a40", "h100_sxm")
SIGNAL_SOURCES = ("off", "trace", "electricitymaps")
FORECASTERS = ("auto", "svr", "persistence")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
POOL_TARGETS = ("frontier", "uniform")


@dataclass(frozen=True)
class DaemonConfig:
    """Everything the daemon is built from. Units are in the names."""

    backend: str = "auto"
    sim_gpus: int = 1
    sim_model: str = "a100_sxm"
    sim_update_period_s: float = 0.1
    sim_seed: int = 0
    """Seeds the simulated GPUs' counter noise and lock latencies (benchmarks repeat a run over seeds)."""
    mixed_real: str = "nvml"
    """With `backend = "mixed"`: what plays the real GPU, NVML's GPUs or ("sim") a simulated stand-in."""
    runtime_dir: Path = Path("/run/perseusd")
    state_dir: Path = Path("/var/lib/perseusd")
    socket_group: str = "perseus"
    admin_group: str = "perseus-admin"
    log_level: str = "INFO"
    max_frame_bytes: int = 1 << 20
    protocol_minor: int = -1
    """The newest protocol minor the daemon speaks (-1: the newest it knows). An older one makes it answer
    as a daemon of that minor would (docs/protocol.md): for compatibility tests and staged roll-outs."""
    seqpacket_events: bool = True
    """Serve the SOCK_SEQPACKET event socket (protocol 6.10, docs/protocol.md): clients that speak it send
    events without an I/O thread, at a fraction of the daemon's CPU; false: ZeroMQ's event socket only."""
    carry_events: bool = True
    """Tell clients on the SOCK_SEQPACKET socket which events of a running plan may wait for the next one
    sent (protocol 6.11): about half the daemon's wake-ups per step; false: every event sent at once."""
    gpu_call_timeout_s: float = 5.0
    monitor_only: bool = False
    """Read energy and status only, never write a clock or a limit (docs/daemon.md, Monitor-only): refuses
    claims and admin writes, skips the restore of a previous daemon's state; runs without privileges."""
    gpu_access: str = "auto"
    """Which GPUs a caller may claim (docs/containers.md): "auto" those its container's device nodes and its
    cgroup's device rules allow, where the daemon can read them; "strict" also refuses a container whose
    devices it cannot read; "off" every GPU."""
    # Jobs: online profiling, solving and deployment.
    profile_warmup_iterations: int = 2
    profile_max_iterations: int = 300
    profile_clock_stride: int = 1
    profile_min_clock_mhz: int = 0
    profile_iteration_budget: int = 40
    """Space the profiled clocks so that they fit about this many iterations at the pace the highest clock
    took (0: profile every clock the stride allows)."""
    profile_deep_iteration_limit: int = 76
    """Profile a clock below the first under half the highest only while a GPU's iterations so far plus the
    most one clock takes (12) fit this many (0: no limit); those clocks only fill waits."""
    profile_fill_clocks: bool = True
    """Plan with options at the clocks the sweep did not visit, from each key's fitted curves where the fit
    reproduces its measured clocks (docs/profiling.md); false: measured clocks only."""
    energy_sample_period_s: float = 0.01
    clock_lead_ms: float = 2.0
    """A higher next clock is set the GPU's measured clock-set latency plus this margin before the running
    computation's expected end (0: no early raise, at its end event only)."""
    solver_unit_time_s: float = 0.0
    default_policy: str = "no_slowdown"
    default_policy_target: float = 0.0
    job_cache: bool = True
    # Work one user can cause (docs/daemon.md, "Limits per user").
    max_job_computations: int = 4096
    """The largest schedule a job may register: stages x microbatches x chunks x 2."""
    max_solves_per_user: int = 1
    """Solves of one user's jobs queued or running at a time; the user's other jobs wait in `solving`."""
    solve_timeout_s: float = 900.0
    """A solve running longer fails its job and frees the solver for the others."""
    ramp_bound_w_per_s: float = 0.0
    """The node's bound on its plans' power steps between computations at every 10 ms sample, in W/s: each
    of its N GPUs held to bound / N (docs/power-pool.md, "A bound on the plans' power ramps"); 0: none."""
    solver_memory_limit_mib: int = 4096
    """The solver worker's memory cap: a solve needing more fails its own job (0: no cap)."""
    # Stragglers: hysteresis of the detection from pipelines' compute times.
    straggler_threshold: float = 0.05
    straggler_clear_threshold: float = 0.02
    straggler_iterations: int = 3
    # Power caps (docs/power-caps.md): the window node power is held over, and how limits enforce it.
    power_cap_window_s: float = 1.0
    power_cap_enforcement: str = "window"
    power_cap_dir: str = ""
    """A node budget declared in files (a Kubernetes ConfigMap volume; "" = off): `<dir>/<node>` (the node:
    cluster_node_name, $NODE_NAME or the host name), else `<dir>/default`, in W (docs/kubernetes.md)."""
    power_cap_dir_interval_s: float = 5.0
    # The cluster plane (etcd), only when endpoints are given: comma-separated http(s)://HOST:PORT.
    etcd_endpoints: str = ""
    cluster_node_name: str = ""
    """This node's name in etcd ("" = the host name)."""
    cluster_lease_ttl_s: int = 10
    cluster_refresh_interval_s: float = 0.5
    cluster_timeout_s: float = 1.0
    cluster_prefix: str = "/perseus/v1"
    # A cluster power pool (docs/power-pool.md), only with etcd: this node's pool ("" = none) and the cap it
    # falls back to without a grant (W; 0 = its floor, the GPUs' minimum power limits).
    power_pool: str = ""
    power_pool_safe_cap_w: float = 0.0
    power_pool_target: str = "frontier"
    """How a grant is held: "frontier" (the node cap: frontier points, then limits) or "uniform" (one GPU
    power limit level summing to the grant, for nodes whose jobs are not under perseusd)."""
    power_pool_budget_file: str = ""
    """A file a facility controller writes the pool's budget to ("" = none; docs/power-pool.md)."""
    power_pool_budget_max_age_s: float = 120.0
    """A budget signal older than this is stale: the grants are held `power_pool_budget_hold_s` more, then
    every node holds its safe cap."""
    power_pool_budget_hold_s: float = 300.0
    power_pool_absent_node: str = "hold"
    """An absent node's grant: "hold" (reserved until it returns or an admin releases it) or "release" (to
    the others at once: absent nodes fenced out of band)."""
    power_pool_etcd_max_txn_ops: int = 128
    """The etcd cluster's `--max-txn-ops` (etcd's default, `perseusd.pool.move_writer.ETCD_MAX_TXN_OPS`): the
    allocator's transactions carry at most this many comparisons or writes."""
    # Prometheus metrics (docs/metrics.md), both off by default: an HTTP listener (port 0 = off) and/or the
    # node_exporter textfile collector (a directory; "" = off), rewritten atomically every interval.
    metrics_http_port: int = 0
    metrics_http_address: str = "127.0.0.1"
    metrics_textfile_dir: str = ""
    metrics_textfile_interval_s: float = 15.0
    metrics_dcgm_families: bool = True
    """Export dcgm-exporter's families (DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, ...) too; set false on nodes
    where dcgm-exporter runs (the families are then its)."""
    metrics_job_names: bool = False
    """Label job series with job names and owners' uids. Off: a pseudonym per job (`job-<hash>`, stable while
    the daemon runs) and uid -1, since the metrics are readable by every local user while the control socket
    shows a job only to its owner and admins."""
    metrics_hostname: str = ""
    """The `Hostname` label of the dcgm-joinable families ("": $NODE_NAME, else cluster_node_name, else the
    host name), as dcgm-exporter labels its series."""
    # The grid signal (docs/carbon.md), off by default: a replayed trace file or the Electricity Maps API.
    signal_source: str = "off"
    signal_trace: str = ""
    """The trace file to replay (CSV with timestamp,value or Electricity Maps history JSON)."""
    signal_trace_speed: float = 1.0
    """Trace seconds per wall second (> 1 replays a day faster, for demos and benchmarks)."""
    signal_zone: str = ""
    signal_token_file: Path = Path("/etc/perseusd/electricitymaps.token")
    signal_api_url: str = "https://api.electricitymap.org/v3"
    signal_unit: str = "gCO2eq/kWh"
    signal_poll_s: float = 300.0
    signal_max_age_s: float = 3600.0
    """A failing source's last value is kept this long after its last success, then jobs run their default."""
    carbon_forecaster: str = "auto"
    carbon_interval_s: float = 1800.0
    carbon_eta: float = 0.24
    carbon_reference_intensity: float = 0.0
    """Chase's reference intensity (0: the highest value of the signal's last day)."""

    def __post_init__(self) -> None:
        _require(self.backend in BACKENDS, f"backend must be one of {', '.join(BACKENDS)}")
        _require(
            self.mixed_real in MIXED_REAL_KINDS, f"mixed_real must be one of {', '.join(MIXED_REAL_KINDS)}"
        )
        _require(self.sim_model in SIM_MODELS, f"sim_model must be one of {', '.join(SIM_MODELS)}")
        _require(1 <= self.sim_gpus <= 64, "sim_gpus must be between 1 and 64")
        _require(self.sim_update_period_s > 0, "sim_update_period_s must be positive")
        _require(self.sim_seed >= 0, "sim_seed must be >= 0")
        _require(self.log_level in LOG_LEVELS, f"log_level must be one of {', '.join(LOG_LEVELS)}")
        _require(1024 <= self.max_frame_bytes <= 16 * 1024 * 1024, "max_frame_bytes must be 1 KiB..16 MiB")
        _require(
            -1 <= self.protocol_minor <= PROTOCOL_MINOR,
            f"protocol_minor must be -1 (newest) or 0..{PROTOCOL_MINOR}",
        )
        _require(self.gpu_call_timeout_s > 0, "gpu_call_timeout_s must be positive")
        _require(self.gpu_access in ACCESS_MODES, f"gpu_access must be one of {', '.join(ACCESS_MODES)}")
        _require(0 <= self.profile_warmup_iterations <= 100, "profile_warmup_iterations must be 0..100")
        _require(self.profile_max_iterations >= 1, "profile_max_iterations must be >= 1")
        _require(self.profile_clock_stride >= 1, "profile_clock_stride must be >= 1")
        _require(self.profile_min_clock_mhz >= 0, "profile_min_clock_mhz must be >= 0")
        _require(self.profile_iteration_budget >= 0, "profile_iteration_budget must be >= 0")
        _require(self.profile_deep_iteration_limit >= 0, "profile_deep_iteration_limit must be >= 0")
        _require(0.001 <= self.energy_sample_period_s <= 1.0, "energy_sample_period_s must be 0.001..1")
        _require(0 <= self.clock_lead_ms <= 100, "clock_lead_ms must be 0..100")
        _require(self.solver_unit_time_s >= 0, "solver_unit_time_s must be >= 0 (0: automatic)")
        _require(self.max_job_computations >= 2, "max_job_computations must be >= 2")
        _require(self.max_solves_per_user >= 1, "max_solves_per_user must be >= 1")
        _require(self.solve_timeout_s > 0, "solve_timeout_s must be positive")
        _require(
            0 <= self.ramp_bound_w_per_s < float("inf"),
            "ramp_bound_w_per_s must be a power ramp >= 0 W/s (0: no bound), such as 50000 for 50 kW/s",
        )
        _require(self.solver_memory_limit_mib >= 0, "solver_memory_limit_mib must be >= 0")
        _require(self.default_policy in POLICIES, f"default_policy must be one of {', '.join(POLICIES)}")
        _require(0 < self.straggler_threshold <= 1.0, "straggler_threshold must be in (0, 1]")
        _require(
            0 <= self.straggler_clear_threshold <= self.straggler_threshold,
            "straggler_clear_threshold must be 0..straggler_threshold",
        )
        _require(1 <= self.straggler_iterations <= 100, "straggler_iterations must be 1..100")
        _require(0.1 <= self.power_cap_window_s <= 60, "power_cap_window_s must be 0.1..60")
        _require(
            self.power_cap_enforcement in ("window", "strict"),
            "power_cap_enforcement must be window or strict",
        )
        _require(
            not self.power_cap_dir or Path(self.power_cap_dir).is_absolute(),
            "power_cap_dir must be an absolute path (or empty: off)",
        )
        _require(0.1 <= self.power_cap_dir_interval_s <= 3600, "power_cap_dir_interval_s must be 0.1..3600")
        _require(
            not (self.monitor_only and self.power_cap_dir),
            "monitor_only and power_cap_dir exclude each other (a node budget writes power limits)",
        )
        _require(self.runtime_dir.is_absolute(), "runtime_dir must be an absolute path")
        _require(self.state_dir.is_absolute(), "state_dir must be an absolute path")
        _require(0 <= self.metrics_http_port <= 65535, "metrics_http_port must be 0..65535 (0: off)")
        _require(bool(self.metrics_http_address.strip()), "metrics_http_address must not be empty")
        _require(
            not self.metrics_textfile_dir or Path(self.metrics_textfile_dir).is_absolute(),
            "metrics_textfile_dir must be an absolute path (or empty: off)",
        )
        _require(
            1.0 <= self.metrics_textfile_interval_s <= 3600, "metrics_textfile_interval_s must be 1..3600"
        )
        _check_signal(self)
        self.cluster()  # validates the cluster settings (ConfigError) when endpoints are given
        if self.power_pool:
            _require(
                POOL_PATTERN.fullmatch(self.power_pool) is not None,
                "power_pool must match " + POOL_PATTERN.pattern,
            )
            _require(
                bool(self.etcd_endpoints.strip()), "power_pool needs etcd_endpoints (the pool lives in etcd)"
            )
        _require(
            not (self.monitor_only and self.power_pool),
            "monitor_only and power_pool exclude each other (a pool member writes power limits)",
        )
        _require(
            self.power_pool_target in POOL_TARGETS,
            "power_pool_target must be one of " + ", ".join(POOL_TARGETS),
        )
        _require(
            self.power_pool_absent_node in ("hold", "release"),
            'power_pool_absent_node must be "hold" or "release"',
        )
        _require(0 <= self.power_pool_safe_cap_w < 1e7, "power_pool_safe_cap_w must be 0 (the floor)..1e7 W")
        _require(
            8 <= self.power_pool_etcd_max_txn_ops <= 4096, "power_pool_etcd_max_txn_ops must be in [8, 4096]"
        )
        _require(
            not self.power_pool_budget_file or bool(self.power_pool),
            "power_pool_budget_file needs power_pool",
        )
        _require(
            0 < self.power_pool_budget_max_age_s <= 86400, "power_pool_budget_max_age_s must be in (0, 86400]"
        )
        _require(
            0 <= self.power_pool_budget_hold_s <= 86400, "power_pool_budget_hold_s must be in [0, 86400]"
        )

    def cluster(self) -> ClusterConfig | None:
        """The cluster plane's settings, None when no etcd endpoint is configured (one node alone)."""
        endpoints = tuple(e.strip() for e in self.etcd_endpoints.split(",") if e.strip())
        if not endpoints:
            return None
        return ClusterConfig(
            endpoints=endpoints,
            node_name=self.cluster_node_name or socket.gethostname().split(".")[0],
            lease_ttl_s=self.cluster_lease_ttl_s,
            timeout_s=self.cluster_timeout_s,
            prefix=self.cluster_prefix,
            refresh_interval_s=self.cluster_refresh_interval_s,
        )

    @property
    def speaks_minor(self) -> int:
        """The protocol minor the daemon speaks (`protocol_minor`, -1 resolved to the newest)."""
        return PROTOCOL_MINOR if self.protocol_minor < 0 else self.protocol_minor

    @property
    def metrics_enabled(self) -> bool:
        return bool(self.metrics_http_port or self.metrics_textfile_dir)

    def node_name(self, environ: Mapping[str, str]) -> str:
        """This node's name for declared budgets: cluster_node_name, else $NODE_NAME, else the host name."""
        return self.cluster_node_name or environ.get("NODE_NAME", "") or socket.gethostname().split(".")[0]

    def metrics_host(self, environ: Mapping[str, str]) -> str:
        """The `Hostname` label of the metrics (see `metrics_hostname`)."""
        return (
            self.metrics_hostname
            or environ.get("NODE_NAME", "")
            or self.cluster_node_name
            or socket.gethostname().split(".")[0]
        )

    def metrics_settings(self) -> tuple[object, ...]:
        """Every `metrics_*` setting (a reload that changes one needs a restart)."""
        return tuple(getattr(self, f.name) for f in dataclasses.fields(self) if f.name.startswith("metrics_"))

    def to_toml(self) -> str:
        """The effective configuration as TOML (what `perseusd --check-config` prints)."""
        lines = ["# perseusd effective configuration"]
        for field in dataclasses.fields(self):
            lines.append(f"{field.name} = {_toml_value(getattr(self, field.name))}")
        return "\n".join(lines) + "\n"


def _check_signal(config: DaemonConfig) -> None:
    _require(
        config.signal_source in SIGNAL_SOURCES, f"signal_source must be one of {', '.join(SIGNAL_SOURCES)}"
    )
    _require(
        config.signal_source != "trace" or Path(config.signal_trace).is_absolute(),
        "signal_trace must be an absolute path when signal_source is trace",
    )
    _require(
        config.signal_source != "electricitymaps" or bool(config.signal_zone.strip()),
        "signal_zone must be set when signal_source is electricitymaps (for example US-MIDW-MISO)",
    )
    _require(config.signal_token_file.is_absolute(), "signal_token_file must be an absolute path")
    _require(config.signal_api_url.startswith(("https://", "http://")), "signal_api_url must be http(s)://")
    _require(0 < config.signal_trace_speed <= 1e6, "signal_trace_speed must be in (0, 1e6]")
    _require(0.01 <= config.signal_poll_s <= 86400, "signal_poll_s must be 0.01..86400")
    _require(config.signal_max_age_s > 0, "signal_max_age_s must be positive")
    _require(
        config.carbon_forecaster in FORECASTERS, f"carbon_forecaster must be one of {', '.join(FORECASTERS)}"
    )
    _require(config.carbon_interval_s > 0, "carbon_interval_s must be positive")
    _require(0.0 <= config.carbon_eta <= 1.0, "carbon_eta must be 0..1")
    _require(config.carbon_reference_intensity >= 0, "carbon_reference_intensity must be >= 0 (0: automatic)")


def _require(condition: bool, problem: str) -> None:
    if not condition:
        raise ConfigError(f"invalid configuration: {problem}")


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    text = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'
