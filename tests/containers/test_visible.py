"""The host GPU a CUDA device index names: the daemon's view of the container, then CUDA_VISIBLE_DEVICES."""

from __future__ import annotations

import pytest
from perseus_client.protocol import GpuCapabilities, HelloOk
from perseus_client.visible import device_order, device_uuid

NODE = ("GPU-aaaa", "GPU-bbbb", "GPU-cccc", "GPU-dddd")


def _hello(visible: tuple[str, ...] | None) -> HelloOk:
    gpus = tuple(GpuCapabilities(uuid, "sim", (1410,), 100.0, 400.0, 400.0, True) for uuid in NODE)
    return HelloOk("0.1.0", 6, gpus, 3, visible)


@pytest.mark.parametrize(
    ("visible", "environ", "expected"),
    [
        (None, {}, list(NODE)),
        (None, {"CUDA_VISIBLE_DEVICES": "2,0"}, ["GPU-cccc", "GPU-aaaa"]),
        (("GPU-cccc", "GPU-dddd"), {}, ["GPU-cccc", "GPU-dddd"]),
        (("GPU-cccc", "GPU-dddd"), {"CUDA_VISIBLE_DEVICES": "1"}, ["GPU-dddd"]),
        (("GPU-cccc", "GPU-dddd"), {"CUDA_VISIBLE_DEVICES": "GPU-d"}, ["GPU-dddd"]),
        (("GPU-cccc", "GPU-dddd"), {"CUDA_VISIBLE_DEVICES": "0,5,1"}, ["GPU-cccc"]),  # CUDA stops at 5
        (None, {"NVIDIA_VISIBLE_DEVICES": "3,1"}, ["GPU-dddd", "GPU-bbbb"]),
        (None, {"NVIDIA_VISIBLE_DEVICES": "GPU-bbbb", "CUDA_VISIBLE_DEVICES": "0"}, ["GPU-bbbb"]),
        (None, {"NVIDIA_VISIBLE_DEVICES": "all"}, list(NODE)),
        (None, {"NVIDIA_VISIBLE_DEVICES": "void"}, []),
        (("GPU-cccc",), {"NVIDIA_VISIBLE_DEVICES": "0"}, ["GPU-cccc"]),  # the daemon's view wins
    ],
)
def test_device_order(visible: tuple[str, ...] | None, environ: dict[str, str], expected: list[str]) -> None:
    assert device_order(_hello(visible), environ) == expected


def test_device_uuid_names_a_missing_device_clearly() -> None:
    hello = _hello(("GPU-cccc",))
    assert device_uuid(hello, 0, {}) == "GPU-cccc"
    with pytest.raises(LookupError, match="has 1 GPU"):
        device_uuid(hello, 1, {})
    with pytest.raises(LookupError, match="names 0"):
        device_order(hello, {"CUDA_VISIBLE_DEVICES": "GPU-zz"})
