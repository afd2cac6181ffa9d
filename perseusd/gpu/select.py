"""Choosing a GPU backend: `auto`, `nvml`, `sim` or `mixed` (the `--backend` flag of perseusd)."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from perseusd.gpu.backend import GpuBackend
from perseusd.gpu.errors import GpuInvalidArgumentError, GpuOperationError, NvmlLibraryError
from perseusd.gpu.sim_faults import FAULTS_ENV, SimFault, parse_faults

logger = logging.getLogger(__name__)

BACKEND_KINDS = ("auto", "nvml", "sim", "mixed")
MIXED_REAL_KINDS = ("nvml", "sim")
"""What plays the real GPU of a `mixed` backend: NVML's GPUs, or one simulated board standing in for them."""


def backend_kind(kind: str) -> str:
    """The backend `kind` opens: `auto` is NVML's or nothing (it never falls back to simulated GPUs)."""
    return "nvml" if kind == "auto" else kind


def open_backend(
    kind: str,
    *,
    sim_gpus: int = 1,
    sim_model: str = "a100_sxm",
    sim_dir: Path | None = None,
    sim_update_period_s: float = 0.1,
    sim_noise: float = 0.01,
    seed: int = 0,
    environ: Mapping[str, str] | None = None,
    mixed_real: str = "nvml",
) -> GpuBackend:
    """Open the GPU backend `kind`.

    `auto` is NVML when it initialises, otherwise an `NvmlLibraryError` telling to use `--backend sim`. For
    `sim`, faults are read from `PERSEUSD_SIM_FAULTS` in `environ` (default `os.environ`), and `sim_dir` None
    means a private temporary directory. `mixed` is NVML's GPUs (or, with `mixed_real="sim"`, one simulated
    board standing in for them) followed by `sim_gpus` simulated boards (`perseusd.gpu.mixed`).
    """
    if kind == "sim":
        faults = sim_faults_from_env(environ)
        return _open_sim(sim_dir, sim_gpus, sim_model, sim_update_period_s, sim_noise, seed, faults)
    if kind == "mixed":
        return _open_mixed(
            mixed_real, sim_dir, sim_gpus, sim_model, sim_update_period_s, sim_noise, seed, environ
        )
    if kind == "nvml":
        return _open_nvml()
    if kind == "auto":
        try:
            return _open_nvml()
        except GpuOperationError as error:
            raise NvmlLibraryError(
                f"no usable NVIDIA GPU ({error.detail}); use --backend sim to run on simulated GPUs",
                op="open_backend",
            ) from error
    raise GpuInvalidArgumentError(
        f"unknown backend {kind!r} (choose one of {', '.join(BACKEND_KINDS)})", op="open_backend"
    )


def _open_sim(
    sim_dir: Path | None,
    gpus: int,
    model: str,
    update_period_s: float,
    noise: float,
    seed: int,
    faults: Sequence[SimFault],
    first_index: int = 0,
) -> GpuBackend:
    from perseusd.gpu.sim import SimBackend

    return SimBackend(
        sim_dir,
        gpus=gpus,
        model=model,
        update_period_s=update_period_s,
        noise=noise,
        seed=seed,
        faults=faults,
        first_index=first_index,
    )


def _open_mixed(
    real_kind: str,
    sim_dir: Path | None,
    gpus: int,
    model: str,
    update_period_s: float,
    noise: float,
    seed: int,
    environ: Mapping[str, str] | None,
) -> GpuBackend:
    from perseusd.gpu.mixed import MixedBackend

    if real_kind not in MIXED_REAL_KINDS:
        raise GpuInvalidArgumentError(
            f"unknown real part {real_kind!r} of a mixed backend "
            f"(choose one of {', '.join(MIXED_REAL_KINDS)})",
            op="open_backend",
        )
    if sim_dir is None:
        raise GpuInvalidArgumentError("a mixed backend needs a sim directory", op="open_backend")
    faults = sim_faults_from_env(environ)
    if real_kind == "nvml":
        real = _open_nvml()
    else:
        real = _open_sim(sim_dir, 1, model, update_period_s, noise, seed, faults)
    try:
        if not real.devices():
            raise NvmlLibraryError(
                "NVML sees no GPU for the mixed backend; use --backend sim", op="open_backend"
            )
        first = 1 + max(device.info.index for device in real.devices())
        simulated = _open_sim(sim_dir, gpus, model, update_period_s, noise, seed, faults, first)
        return MixedBackend(real, simulated)
    except BaseException:
        real.close()
        raise


def _open_nvml() -> GpuBackend:
    from perseusd.gpu.nvml import NvmlBackend

    return NvmlBackend()


def sim_faults_from_env(environ: Mapping[str, str] | None = None) -> list[SimFault]:
    """The faults of `PERSEUSD_SIM_FAULTS` in `environ` (default `os.environ`); [] when unset."""
    env = os.environ if environ is None else environ
    faults_json = env.get(FAULTS_ENV, "")
    faults = parse_faults(faults_json) if faults_json.strip() else []
    if faults:
        logger.warning("simulated GPU faults injected from %s: %s", FAULTS_ENV, faults)
    return faults
