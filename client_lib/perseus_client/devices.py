"""The UUID of the GPU a training process computes on, as perseusd names it, under any device remapping.

perseusd names GPUs by NVML UUID (`GPU-8c1f...`), never by index: an index means another GPU in every process
whose launcher remapped the devices (`CUDA_VISIBLE_DEVICES` set by Slurm's gres, Kubernetes' device plugin,
torchrun wrappers). Two ways to the UUID, neither needing privileges:

- torch's own view (`cuda_uuid`): `torch.cuda.get_device_properties(i).uuid` is the UUID of CUDA device `i`
  as this process sees it, whatever the remapping; exact, and needs no daemon.
- NVML's view through `CUDA_VISIBLE_DEVICES` (`visible_uuid`): CUDA device `i` is the `i`-th visible entry,
  an NVML index or a (prefix of a) UUID, resolved against the node's GPUs in NVML order (as the daemon lists
  them in `hello_ok`). Used when torch is not imported or has no CUDA (CPU jobs driving simulated GPUs).
  Integer entries are exact when CUDA enumerates in PCI order, which it does on a node of one GPU model and
  whenever `CUDA_DEVICE_ORDER=PCI_BUS_ID`; on a node of mixed models without it, use torch's view.

Stdlib only; torch is used when the process already imported it, never imported here.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

VISIBLE_ENV = "CUDA_VISIBLE_DEVICES"
ORDER_ENV = "CUDA_DEVICE_ORDER"
LOCAL_RANK_ENV = "LOCAL_RANK"


class DeviceLookupError(LookupError):
    """The CUDA device asked for has no GPU perseusd could name (not visible, MIG, ambiguous)."""


def cuda_uuid(device: int | None = None, properties: Callable[[int], Any] | None = None) -> str | None:
    """The UUID (`GPU-...`) of CUDA device `device` (default: torch's current device) in torch's view.

    None when torch is not imported in this process or has no CUDA device. `properties` replaces
    `torch.cuda.get_device_properties` (tests: simulated devices).
    """
    if properties is None:
        torch = sys.modules.get("torch")
        if torch is None or not torch.cuda.is_available():
            return None
        properties = torch.cuda.get_device_properties
        if device is None:
            device = int(torch.cuda.current_device())
    raw = str(properties(0 if device is None else device).uuid)
    if not raw:
        return None
    return raw if raw.startswith(("GPU-", "MIG-")) else f"GPU-{raw}"


def default_device() -> int:
    """The CUDA device this process runs on when it does not say: torch's current device where torch has
    CUDA, else `LOCAL_RANK` (what launchers map each rank's device from), else 0."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        return int(torch.cuda.current_device())
    try:
        return max(0, int(os.environ.get(LOCAL_RANK_ENV, "0")))
    except ValueError:
        return 0


def visible_uuid(
    device: int,
    node_gpus: Sequence[str],
    visible: str | None,
    *,
    node_names: Sequence[str] = (),
    order: str | None = None,
) -> str:
    """The UUID of CUDA device `device` when `visible` (`CUDA_VISIBLE_DEVICES`, None: unset) selects among
    the node's GPUs `node_gpus` (UUIDs in NVML index order; `node_names`: their models, for the check that
    integer entries name the GPUs CUDA enumerates; `order`: `CUDA_DEVICE_ORDER`).

    Raises `DeviceLookupError` naming the cause.
    """
    entries = _visible_entries(visible, len(node_gpus))
    if not 0 <= device < len(entries):
        shown = "unset" if visible is None else repr(visible)
        raise DeviceLookupError(
            f"CUDA device {device} is not visible to this process ({VISIBLE_ENV} {shown}, "
            f"{len(entries)} visible of the node's {len(node_gpus)})"
        )
    entry = entries[device]
    if entry.isdigit():
        index = int(entry)
        if index >= len(node_gpus):
            raise DeviceLookupError(f"{VISIBLE_ENV} names GPU {index}; the node has {len(node_gpus)}")
        if order != "PCI_BUS_ID" and len(set(node_names)) > 1:
            raise DeviceLookupError(
                f"{VISIBLE_ENV} lists indices on a node of mixed GPU models: CUDA may enumerate them in "
                f"another order than NVML; set {ORDER_ENV}=PCI_BUS_ID, or list UUIDs, or let torch tell "
                "(perseus_client.devices.cuda_uuid)"
            )
        return node_gpus[index]
    if entry.startswith("MIG-"):
        raise DeviceLookupError(f"CUDA device {device} is MIG instance {entry}: perseusd manages whole GPUs")
    matches = [uuid for uuid in node_gpus if uuid.startswith(entry)]
    if len(matches) != 1:
        what = "no GPU" if not matches else f"{len(matches)} GPUs"
        raise DeviceLookupError(f"{VISIBLE_ENV} entry {entry!r} matches {what} of this node")
    return matches[0]


def visible_full_uuid(device: int, visible: str | None) -> str | None:
    """The UUID of CUDA device `device` when `CUDA_VISIBLE_DEVICES` names it by its whole UUID (as
    Kubernetes' device plugin does), known without the node's GPU list; None otherwise."""
    entries = _visible_entries(visible, 0)
    if 0 <= device < len(entries) and _FULL_UUID.fullmatch(entries[device]):
        return entries[device]
    return None


_FULL_UUID = re.compile(r"GPU-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


def _visible_entries(visible: str | None, count: int) -> list[str]:
    """The visible entries as CUDA reads them: up to the first invalid one (CUDA ignores the rest)."""
    if visible is None:
        return [str(index) for index in range(count)]
    entries: list[str] = []
    for raw in visible.split(","):
        entry = raw.strip()
        if not entry or not (entry.isdigit() or entry.startswith(("GPU-", "MIG-"))):
            break
        entries.append(entry)
    return entries
