"""Choosing a GPU backend: `auto`, `nvml` or `sim` (the `--backend` flag of perseusd)."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

from perseusd.gpu.backend import GpuBackend
from perseusd.gpu.errors import GpuInvalidArgumentError, GpuOperationError, NvmlLibraryError
from perseusd.gpu.sim_faults import FAULTS_ENV, SimFault, parse_faults

logger = logging.getLogger(__name__)

BACKEND_KINDS = ("auto", "nvml", "sim")


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
) -> GpuBackend:
    """Open the GPU backend `kind`.

    `auto` is NVML when it initialises, otherwise an `NvmlLibraryError` telling to use `--backend sim`. For
    `sim`, faults are read from `PERSEUSD_SIM_FAULTS` in `environ` (default `os.environ`), and `sim_dir` None
    means a private temporary directory.
    """
    if kind == "sim":
        from perseusd.gpu.sim import SimBackend

        return SimBackend(
            sim_dir,
            gpus=sim_gpus,
            model=sim_model,
            update_period_s=sim_update_period_s,
            noise=sim_noise,
            seed=seed,
            faults=sim_faults_from_env(environ),
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
