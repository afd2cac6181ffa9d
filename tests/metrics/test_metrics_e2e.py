"""Prometheus metrics of a real perseusd on simulated GPUs, scraped over HTTP and read from the textfile.

One daemon (module fixture) with both exposures on runs a 2-stage job to `running` and a lease-holding
client; the tests scrape it with a real HTTP client, parse with prometheus_client's parser, and check the
names with `promtool check metrics` where promtool is installed (Debian package `prometheus`).
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import stat
import subprocess
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import zmq
from perseus_client.client import PerseusClient
from perseus_client.protocol import EVENT_SOCKET_NAME, PROTOCOL_MAJOR, PROTOCOL_MINOR
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from tests.support.perseusd_proc import DaemonDirs, DaemonProcess, daemon_processes
from tests.support.polling import wait_until
from tests.support.ports import free_ports
from tests.support.training import ITERATIONS, MICROBATCHES, STAGES, WAIT_S, train_job, two_stage_profile

pytestmark = pytest.mark.timeout(180)

JOB = "metrics-e2e"
DASHBOARD = Path(__file__).resolve().parents[2] / "packaging" / "perseusd-grafana.json"


@dataclass
class Scraped:
    url: str
    textfile: Path
    runtime_dir: Path
    gpus: list[str]
    daemon: DaemonProcess


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text: str = response.read().decode()
        return text


def samples(text: str) -> dict[str, list[Sample]]:
    by_name: dict[str, list[Sample]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            by_name.setdefault(sample.name, []).append(sample)
    return by_name


def one(by_name: dict[str, list[Sample]], name: str, **labels: str) -> float:
    found = [s.value for s in by_name.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, f"{name}{labels}: {found} in {sorted(by_name)}"
    return found[0]


def _wait(predicate: Callable[[], bool], what: str) -> None:
    wait_until(predicate, WAIT_S, what)


@pytest.fixture(scope="module")
def scraped() -> Iterator[Scraped]:
    with daemon_processes() as make:
        dirs = DaemonDirs.create()
        textfile_dir = dirs.base / "textfile"
        textfile_dir.mkdir()
        (port,) = free_ports(1)
        config = dirs.base / "perseusd.toml"
        config.write_text(
            f'metrics_http_port = {port}\nmetrics_textfile_dir = "{textfile_dir}"\n'
            "metrics_textfile_interval_s = 1.0\nmetrics_job_names = true\n"
        )
        daemon = make(dirs, gpus=STAGES, extra_args=("--config", str(config))).start()
        url = f"http://127.0.0.1:{port}/metrics"
        with PerseusClient(dirs.runtime_dir, job=JOB, timeout_s=10.0) as client:
            gpus = train_job(client, two_stage_profile(), MICROBATCHES, ITERATIONS)
            yield Scraped(url, textfile_dir / "perseusd.prom", dirs.runtime_dir, gpus, daemon)


def test_gpu_metrics_follow_the_gpus(scraped: Scraped) -> None:
    by_name = samples(scrape(scraped.url))
    status = {gpu["uuid"]: gpu for gpu in scraped.daemon.status()["gpus"]}
    for index, uuid in enumerate(scraped.gpus):
        labels = {"uuid": uuid, "index": str(index)}
        assert one(by_name, "perseus_gpu_up", **labels) == 1.0
        assert one(by_name, "perseus_gpu_leased", **labels) == 1.0
        assert one(by_name, "perseus_gpu_lease_holder_uid", **labels) == 0.0  # we are root
        assert one(by_name, "perseus_gpu_energy_joules_total", **labels) > 0
        assert one(by_name, "perseus_gpu_power_watts", **labels) > 0
        assert one(by_name, "perseus_gpu_power_limit_watts", **labels) == pytest.approx(
            status[uuid]["power_limit_w"]
        )
        # Nothing runs at a clock the A100 board caps, and no limit was lowered: the flags are present and 0.
        assert one(by_name, "perseus_gpu_power_capped", **labels) == 0.0
        assert one(by_name, "perseus_gpu_clock_throttled", **labels) == 0.0
        assert one(by_name, "perseus_gpu_power_limit_lowered", **labels) == 0.0
        locked = status[uuid]["locked_clock_mhz"]
        assert one(by_name, "perseus_gpu_clock_locked", **labels) == (0.0 if locked is None else 1.0)
        clock_hz = one(by_name, "perseus_gpu_sm_clock_hertz", **labels)
        assert 100e6 < clock_hz < 3000e6  # hertz, not MHz


def test_daemon_health_counts_events_and_malformed_frames(scraped: Scraped) -> None:
    before = samples(scrape(scraped.url))
    received = one(before, "perseus_events_received_total")
    assert received >= ITERATIONS * STAGES * 2  # steps begin and end at least
    malformed = one(before, "perseus_messages_malformed_total")
    ctx = zmq.Context()
    try:
        push = ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 1000)
        push.connect(f"ipc://{scraped.runtime_dir / EVENT_SOCKET_NAME}")
        push.send(b"{not json")
        push.close()
    finally:
        ctx.term()

    def counted() -> bool:
        return one(samples(scrape(scraped.url)), "perseus_messages_malformed_total") >= malformed + 1

    _wait(counted, "the malformed frame to be counted")
    after = samples(scrape(scraped.url))
    assert one(after, "perseus_events_dropped_total") >= 1
    assert one(after, "perseus_messages_rejected_total", code="BAD_FRAME") >= 1
    assert one(after, "perseus_events_received_total") == received + 1


def test_daemon_info_says_protocol_minor_and_backend(scraped: Scraped) -> None:
    by_name = samples(scrape(scraped.url))
    protocol = f"{PROTOCOL_MAJOR}.{PROTOCOL_MINOR}"  # as `status` shows it, not the major alone
    assert one(by_name, "perseus_daemon_info", protocol=protocol, backend="sim", monitor_only="false") == 1.0


def test_gpu_call_latency_histogram(scraped: Scraped) -> None:
    by_name = samples(scrape(scraped.url))
    gpu = scraped.gpus[0]
    count = one(by_name, "perseus_gpu_call_duration_seconds_count", uuid=gpu, op="power_w")
    inf = one(by_name, "perseus_gpu_call_duration_seconds_bucket", uuid=gpu, op="power_w", le="+Inf")
    assert count >= 1
    assert inf == count
    buckets = [
        (float(s.labels["le"]), s.value)
        for s in by_name["perseus_gpu_call_duration_seconds_bucket"]
        if s.labels["uuid"] == gpu and s.labels["op"] == "power_w"
    ]
    values = [value for _, value in sorted(buckets)]
    assert values == sorted(values)  # cumulative


def test_job_metrics(scraped: Scraped) -> None:
    by_name = samples(scrape(scraped.url))
    job = {"job_name": JOB, "uid": "0"}
    assert one(by_name, "perseus_job_state", state="running", **job) == 1.0
    assert one(by_name, "perseus_job_state", state="profiling", **job) == 0.0
    assert one(by_name, "perseus_job_plan_iteration_time_seconds", **job) > 0
    assert one(by_name, "perseus_job_plan_iteration_energy_joules", **job) > 0
    assert one(by_name, "perseus_pipeline_iterations_total", pipeline="0", **job) >= ITERATIONS
    assert one(by_name, "perseus_job_clock_changes_total", **job) >= 0
    assert one(by_name, "perseus_metrics_series_omitted") == 0
    phases = {s.labels["phase"]: s.value for s in by_name["perseus_job_planning_seconds"]}
    assert set(phases) == {"fit", "frontier", "follow", "descent", "transfer", "total"}
    assert min(phases.values()) >= 0
    assert min(phases["fit"], phases["frontier"]) > 0
    assert phases["total"] == pytest.approx(sum(phases.values()) - phases["total"], abs=1e-5)


def test_promtool_accepts_the_metrics(scraped: Scraped) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip(
            "promtool is not installed (Debian package prometheus; scripts/setup.sh --dev installs it)"
        )
    text = scrape(scraped.url)
    check = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60, check=False
    )
    # dcgm-exporter's label names (UUID, modelName, Hostname) are camelCase: the one complaint allowed, on the
    # families that carry them so that one dashboard joins perseusd's and dcgm's (docs/metrics.md).
    camel = " label names should be written in 'snake_case' not 'camelCase'"
    problems = [
        line
        for line in (check.stdout + check.stderr).splitlines()
        if not (line.endswith(camel) and line.split()[0].startswith(("DCGM_FI_DEV_", "perseus_gpu_")))
    ]
    assert check.returncode in (0, 3), check.stdout + check.stderr
    assert not problems, check.stdout + check.stderr


def test_textfile_is_replaced_atomically_and_readable(scraped: Scraped) -> None:
    path = scraped.textfile
    _wait(path.exists, "the textfile")
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    first_inode = path.stat().st_ino
    _wait(lambda: path.stat().st_ino != first_inode, "the textfile to be rewritten")
    by_name = samples(path.read_text())
    assert one(by_name, "perseus_gpu_up", uuid=scraped.gpus[1]) == 1.0
    # No temporary file left behind (one may exist for a moment while a write is under way).
    _wait(lambda: [p.name for p in path.parent.iterdir()] == ["perseusd.prom"], "only perseusd.prom")


def test_textfile_removed_when_the_daemon_stops(tmp_path: Path) -> None:
    with daemon_processes() as make:
        dirs = DaemonDirs.create()
        config = dirs.base / "perseusd.toml"
        config.write_text(f'metrics_textfile_dir = "{tmp_path}"\n')
        daemon = make(dirs, gpus=1, extra_args=("--config", str(config))).start()
        assert (tmp_path / "perseusd.prom").exists()
        daemon.stop()
        assert daemon.proc is not None
        assert daemon.proc.returncode == 0
        assert not (tmp_path / "perseusd.prom").exists()


def test_a_bad_textfile_directory_fails_the_start(tmp_path: Path) -> None:
    with daemon_processes() as make:
        dirs = DaemonDirs.create()
        config = dirs.base / "perseusd.toml"
        config.write_text(f'metrics_textfile_dir = "{tmp_path / "missing"}"\n')
        daemon = make(dirs, gpus=1, extra_args=("--config", str(config))).start(wait=False)
        assert daemon.wait() == 1
        assert "metrics:" in daemon.log()


def test_grafana_dashboard_uses_only_exposed_metrics(scraped: Scraped) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    assert len(exprs) >= 10
    used = {name for expr in exprs for name in re.findall(r"\bperseus_[a-z_]+", expr)}
    text = scrape(scraped.url)
    exposed = set(samples(text))  # and families without samples now (no straggler, say):
    for family in text_string_to_metric_families(text):
        exposed |= {family.name, f"{family.name}_total", f"{family.name}_bucket"}
    missing = {name for name in used if name not in exposed}
    assert not missing, f"the dashboard uses metrics perseusd does not expose: {sorted(missing)}"


def test_savings_carry_their_basis_and_the_dashboard_sums_measured_only(scraped: Scraped) -> None:
    """A saving is labelled measured or predicted; the job runs an imported profile (no all-max measured by
    its counters), so its saving is predicted, and the dashboard's sums leave it out."""
    by_name = samples(scrape(scraped.url))
    assert one(by_name, "perseus_job_energy_saved_joules", job_name=JOB, basis="predicted") >= 0
    assert all(
        s.labels["basis"] in ("measured", "predicted") for s in by_name["perseus_job_energy_saved_joules"]
    )
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    sums = [expr for expr in exprs if "sum(" in expr and "energy_saved" in expr]
    assert sums
    assert all('basis="measured"' in expr for expr in sums), sums


def test_dcgm_exporter_names_and_joinable_labels(scraped: Scraped) -> None:
    """dcgm-exporter's energy counter (mJ, no _total) and gauges, and perseusd's own per-GPU families, all
    labelled gpu / UUID / Hostname so that one dashboard joins them."""
    text = scrape(scraped.url)
    families = {family.name: family for family in text_string_to_metric_families(text)}
    energy = families["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]  # mJ, dcgm's counter, typed gauge (no _total)
    assert {s.name for s in energy.samples} == {"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"}
    by_name = samples(text)
    host = socket.gethostname().split(".")[0]
    for index, uuid in enumerate(scraped.gpus):
        dcgm = {"gpu": str(index), "UUID": uuid, "Hostname": host, "device": f"nvidia{index}"}
        ours = {"uuid": uuid, "index": str(index)}
        joules = one(by_name, "perseus_gpu_energy_joules_total", **ours)
        assert one(by_name, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", **dcgm) == pytest.approx(joules * 1000)
        assert one(by_name, "DCGM_FI_DEV_POWER_USAGE", **dcgm) == one(
            by_name, "perseus_gpu_power_watts", **ours
        )
        assert one(by_name, "DCGM_FI_DEV_SM_CLOCK", **dcgm) * 1e6 == one(
            by_name, "perseus_gpu_sm_clock_hertz", **ours
        )
        assert one(by_name, "DCGM_FI_DEV_POWER_MGMT_LIMIT", **dcgm) > 0
        join = {"gpu": str(index), "UUID": uuid, "Hostname": host}
        assert one(by_name, "perseus_gpu_info", uuid=uuid, **join) == 1
        assert one(by_name, "perseus_gpu_job_info", job_name=JOB, slurm_job="", **join) == 1
        begun = one(by_name, "perseus_gpu_plan_computations_begun_total", **join)
        assert begun >= ITERATIONS * 2 * MICROBATCHES
        assert 0 <= one(by_name, "perseus_gpu_plan_wrong_clock_computations_total", **join) <= begun
        assert one(by_name, "perseus_gpu_clock_lock_latency_seconds", **join) >= 0
