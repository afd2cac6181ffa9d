"""The GPU a process computes on, by UUID, under any `CUDA_VISIBLE_DEVICES` remapping.

Unit tests of the mapping (NVML's view of the visible devices, torch's view through a stand-in for
`torch.cuda.get_device_properties`), then real processes with remapped visible devices against a daemon on
four simulated GPUs: each names and claims the GPU its launcher gave it, never the node's GPU of the same
index. Runs on every Python the client supports (the client library, pytest and pyzmq only).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from perseus_client import PerseusClient
from perseus_client.devices import DeviceLookupError, cuda_uuid, visible_full_uuid, visible_uuid

from tests.support.perseusd_proc import DaemonDirs, DaemonProcess, daemon_processes

pytestmark = pytest.mark.timeout(120)

NODE = [f"GPU-{index}{index}aa0000-1111-2222-3333-44445555666{index}" for index in range(4)]
CLIENT_LIB = str(Path(__file__).resolve().parents[2] / "client_lib")


@pytest.mark.parametrize(
    ("visible", "device", "expected"),
    [
        (None, 2, NODE[2]),  # nothing remapped: CUDA device i is NVML GPU i
        ("3,1", 0, NODE[3]),
        ("3,1", 1, NODE[1]),
        (" 2 , 0 ", 1, NODE[0]),
        (f"{NODE[2]},{NODE[0]}", 0, NODE[2]),
        (f"{NODE[1][:12]}", 0, NODE[1]),  # a unique prefix, as CUDA accepts
        ("1,bogus,3", 0, NODE[1]),
    ],
)
def test_visible_devices_map_cuda_indices_to_node_gpus(
    visible: str | None, device: int, expected: str
) -> None:
    assert visible_uuid(device, NODE, visible) == expected


@pytest.mark.parametrize(
    ("visible", "device", "needle"),
    [
        ("1,bogus,3", 1, "not visible"),  # CUDA stops at the first invalid entry
        ("", 0, "not visible"),
        ("3", 1, "not visible"),
        ("7", 0, "node has 4"),
        ("GPU-", 0, "matches 4 GPUs"),
        ("GPU-ffff", 0, "matches no GPU"),
        ("MIG-1234", 0, "MIG"),
    ],
)
def test_a_device_that_is_not_a_visible_whole_gpu_is_refused(visible: str, device: int, needle: str) -> None:
    with pytest.raises(DeviceLookupError, match=needle):
        visible_uuid(device, NODE, visible)


def test_indices_on_a_node_of_mixed_models_need_pci_order() -> None:
    names = ["NVIDIA H100", "NVIDIA H100", "NVIDIA A100", "NVIDIA A100"]
    with pytest.raises(DeviceLookupError, match="CUDA_DEVICE_ORDER=PCI_BUS_ID"):
        visible_uuid(0, NODE, "2", node_names=names)
    assert visible_uuid(0, NODE, "2", node_names=names, order="PCI_BUS_ID") == NODE[2]
    assert visible_uuid(0, NODE, NODE[2], node_names=names) == NODE[2]  # a UUID is never ambiguous


def test_a_whole_uuid_entry_needs_no_node_list() -> None:
    assert visible_full_uuid(1, f"{NODE[3]},{NODE[0]}") == NODE[0]
    assert visible_full_uuid(0, "3,1") is None  # an index: only the node's list can tell
    assert visible_full_uuid(0, NODE[1][:12]) is None  # a prefix: likewise
    assert visible_full_uuid(0, None) is None


def test_without_a_daemon_a_uuid_in_the_visible_devices_still_names_the_gpu(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    whole = "GPU-5f8a3e1c-0d7b-4a8e-9c3f-2b1d0e6f7a89"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", whole)
    monkeypatch.setenv("LOCAL_RANK", "0")
    with PerseusClient(tmp_path / "none", job="k8s") as client:  # fail-open: no daemon
        assert client.gpu_uuid() == whole
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    with PerseusClient(tmp_path / "none", job="k8s") as client:
        assert client.gpu_uuid() is None  # an index needs the node's list: unknown until the daemon is back


@dataclass
class FakeProperties:
    uuid: object


def test_torch_view_names_the_device_with_nvml_prefix() -> None:
    raw = "5f8a3e1c-0d7b-4a8e-9c3f-2b1d0e6f7a89"
    seen: list[int] = []

    def properties(index: int) -> FakeProperties:
        seen.append(index)
        return FakeProperties(uuid=raw)

    assert cuda_uuid(1, properties) == f"GPU-{raw}"
    assert seen == [1]
    assert cuda_uuid(0, lambda _i: FakeProperties(uuid=f"GPU-{raw}")) == f"GPU-{raw}"


def test_without_torch_in_the_process_there_is_no_torch_view() -> None:
    code = (
        "import sys; from perseus_client.devices import cuda_uuid; print(cuda_uuid(), 'torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True, env=_env({})
    )
    assert out.stdout.split() == ["None", "False"]  # never imports torch itself


RANK = """
import sys, time
from perseus_client import PerseusClient
client = PerseusClient(sys.argv[1], job="remapped", timeout_s=5.0, strict=True)
gpu = client.gpu_uuid()
client.claim([gpu])
print(gpu, flush=True)
sys.stdin.read()
"""


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "LOCAL_RANK")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [CLIENT_LIB, env.get("PYTHONPATH", "")]))
    return {**env, **extra}


@pytest.fixture
def daemon() -> Iterator[DaemonProcess]:
    with daemon_processes() as make:
        yield make(DaemonDirs.create(), gpus=4).start()


@pytest.fixture
def ranks() -> Iterator[Callable[[dict[str, str], Path], tuple[int, str]]]:
    started: list[subprocess.Popen[str]] = []

    def start(env: dict[str, str], runtime_dir: Path) -> tuple[int, str]:
        proc = subprocess.Popen(
            [sys.executable, "-c", RANK, str(runtime_dir)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(env),
        )
        started.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if not line:
            proc.kill()
            raise AssertionError(proc.communicate(timeout=10)[1])
        return proc.pid, line

    yield start
    for proc in started:
        proc.communicate(input="", timeout=20)


def test_remapped_ranks_claim_the_gpus_their_launcher_gave_them(
    daemon: DaemonProcess, ranks: Callable[[dict[str, str], Path], tuple[int, str]]
) -> None:
    node = [row["uuid"] for row in daemon.status()["gpus"]]
    # A launcher gave this job GPUs 3 and 1 (one rank each, by LOCAL_RANK), another job GPU 2 by UUID.
    launched = [
        ({"CUDA_VISIBLE_DEVICES": "3,1", "LOCAL_RANK": "0"}, node[3]),
        ({"CUDA_VISIBLE_DEVICES": "3,1", "LOCAL_RANK": "1"}, node[1]),
        ({"CUDA_VISIBLE_DEVICES": node[2]}, node[2]),
    ]
    pids = {}
    for env, expected in launched:
        pid, named = ranks(env, daemon.dirs.runtime_dir)
        assert named == expected
        pids[expected] = pid
    leases = {row["uuid"]: row["lease"] for row in daemon.status()["gpus"]}
    for gpu, pid in pids.items():
        assert leases[gpu]["pid"] == pid  # the daemon agrees: the launcher's GPU, by UUID
    assert leases[node[0]] is None  # GPU 0, the index every rank would have named, is nobody's
