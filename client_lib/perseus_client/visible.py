"""The host GPU (its UUID) that a CUDA device index names, inside a container or under a remapping launcher.

Inside a container, device 0 is the first GPU the container was given, not the node's GPU 0; a launcher
(Slurm, torchrun, Kubernetes) may narrow it further with `CUDA_VISIBLE_DEVICES`. The daemon tells each client,
in its hello reply, which GPUs the client's container holds in the container's own order
(`HelloOk.visible_gpus`, read by the daemon from the kernel); `device_uuid` applies `CUDA_VISIBLE_DEVICES` on
top of that. Where the daemon cannot see the container's devices (`visible_gpus` is None), the container
runtime's `NVIDIA_VISIBLE_DEVICES` (host indices or UUIDs) stands in for it. Stdlib only.

    hello = client.daemon_info
    gpu = device_uuid(hello, torch.cuda.current_device())
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from perseus_client.protocol import HelloOk

NO_DEVICES = ("void", "none", "")


def device_order(hello: HelloOk, environ: Mapping[str, str] | None = None) -> list[str]:
    """The UUIDs of this process's CUDA devices, device 0 first."""
    env = os.environ if environ is None else environ
    node = [gpu.uuid for gpu in hello.gpus]
    if hello.visible_gpus is not None:
        order = list(hello.visible_gpus)
    else:
        order = _runtime_devices(node, env.get("NVIDIA_VISIBLE_DEVICES"))
    cuda = env.get("CUDA_VISIBLE_DEVICES")
    if cuda is None:
        return order
    return _select(order, cuda, "CUDA_VISIBLE_DEVICES")


def device_uuid(hello: HelloOk, device: int = 0, environ: Mapping[str, str] | None = None) -> str:
    """The UUID of CUDA device `device` of this process (raises `LookupError` when it has no such device)."""
    order = device_order(hello, environ)
    if not 0 <= device < len(order):
        raise LookupError(f"CUDA device {device}: this process has {len(order)} GPU(s) ({', '.join(order)})")
    return order[device]


def _runtime_devices(node: list[str], value: str | None) -> list[str]:
    if value is None or value.strip() == "all":
        return node
    if value.strip() in NO_DEVICES:
        return []
    return _select(node, value, "NVIDIA_VISIBLE_DEVICES")


def _select(order: Sequence[str], value: str, name: str) -> list[str]:
    """The entries of a `*_VISIBLE_DEVICES` list: indices into `order`, or UUIDs (unique prefixes too)."""
    chosen: list[str] = []
    for raw in value.split(","):
        entry = raw.strip()
        if not entry:
            break  # CUDA stops at the first empty or invalid entry
        if entry.isdigit():
            index = int(entry)
            if index >= len(order):
                break
            chosen.append(order[index])
            continue
        matches = [uuid for uuid in order if uuid.startswith(entry)]
        if len(matches) != 1:
            raise LookupError(f"{name}={value}: {entry} names {len(matches)} of this process's GPUs")
        chosen.append(matches[0])
    return chosen
