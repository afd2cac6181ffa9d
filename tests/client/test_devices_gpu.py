"""On a real GPU: the client names the CUDA device it computes on by the UUID NVML (and so perseusd) gives it,
whether `CUDA_VISIBLE_DEVICES` is unset or names the GPU by index, by its whole UUID or by a prefix of it.

Each case runs in a fresh process (CUDA reads the variable once, at its first call). Marked `gpu`: skipped
where torch has no CUDA or NVML does not answer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]

# What a child prints: torch's view (cuda_uuid) and NVML's view through the variable (visible_uuid).
CHILD = """
import json, os, sys
import torch
from perseus_client.devices import cuda_uuid, visible_uuid
node = json.loads(sys.argv[1])
visible = os.environ.get("CUDA_VISIBLE_DEVICES")
print(json.dumps({"torch": cuda_uuid(0) if torch.cuda.is_available() else None,
                  "nvml": visible_uuid(0, node, visible)}))
"""


def _nvml_uuids() -> list[str]:
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        pytest.skip(f"NVML does not answer: {error}")
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        raw = [pynvml.nvmlDeviceGetUUID(handle) for handle in handles]
    finally:
        pynvml.nvmlShutdown()
    return [uuid.decode() if isinstance(uuid, bytes) else str(uuid) for uuid in raw]


@pytest.fixture(scope="module")
def node_uuids() -> list[str]:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    return _nvml_uuids()


def _child_view(visible: str | None, node: list[str]) -> dict[str, str | None]:
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "client_lib"), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(node)],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    view: dict[str, str | None] = json.loads(done.stdout.strip().splitlines()[-1])
    return view


def test_on_a_gpu_cuda_device_0_is_named_by_the_nvml_uuid_under_any_visible_devices(
    node_uuids: list[str],
) -> None:
    last = len(node_uuids) - 1
    target = node_uuids[last]
    cases: list[tuple[str | None, str]] = [
        (None, node_uuids[0]),
        (str(last), target),
        (target, target),
        (target[:12], target),
    ]
    for visible, expected in cases:
        view = _child_view(visible, node_uuids)
        assert view == {"torch": expected, "nvml": expected}, f"CUDA_VISIBLE_DEVICES={visible!r}"
