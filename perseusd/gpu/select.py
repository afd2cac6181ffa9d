"""Choosing a GPU backend: `auto`, `nvml`, `sim` or `mixed` (the `--backend` flag of perseusd)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from perseusd.gpu.backend import GpuBackend
from perseusd.gpu.errors import GpuInvalidArgumentError, GpuOperationError, NvmlLibraryError
from perseusd.gpu.sim_faults import FAULTS_ENV, SimFault, parse_faults

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BackendOptions:
    """What opening a backend may use (each kind uses its part)."""

    sim_gpus: int = 1
    sim_model: str = "a100_sxm"
    sim_dir: Path | None = None
    sim_update_period_s: float = 0.1
    sim_noise: float = 0.01
    seed: int = 0
    environ: Mapping[str, str] | None = None
    mixed_real: str = "nvml"


@dataclass(frozen=True)
class BackendKind:
    """One `--backend` value: how it opens, and whether its energy counters are simulated ones."""

    name: str
    open: Callable[[BackendOptions], GpuBackend]
    simulated_counters: Callable[[BackendOptions], bool] = lambda _options: False


def _sim(options: BackendOptions) -> GpuBackend:
    faults = sim_faults_from_env(options.environ)
    return _open_sim(options, options.sim_gpus, faults)


def _auto(_options: BackendOptions) -> GpuBackend:
    try:
        return _open_nvml()
    except GpuOperationError as error:
        raise NvmlLibraryError(
            f"no usable NVIDIA GPU ({error.detail}); use --backend sim to run on simulated GPUs",
            op="open_backend",
        ) from error


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
    """Open the GPU backend `kind` (`BACKENDS`).

    `auto` is NVML when it initialises, otherwise an `NvmlLibraryError` telling to use `--backend sim`. For
    `sim`, faults are read from `PERSEUSD_SIM_FAULTS` in `environ` (default `os.environ`), and `sim_dir` None
    means a private temporary directory. `mixed` is NVML's GPUs (or, with `mixed_real="sim"`, one simulated
    board standing in for them) followed by `sim_gpus` simulated boards (`perseusd.gpu.mixed`).
    """
    backend = BACKENDS.get(kind)
    if backend is None:
        raise GpuInvalidArgumentError(
            f"unknown backend {kind!r} (choose one of {', '.join(BACKEND_KINDS)})", op="open_backend"
        )
    options = BackendOptions(
        sim_gpus, sim_model, sim_dir, sim_update_period_s, sim_noise, seed, environ, mixed_real
    )
    return backend.open(options)


def simulated_counters(kind: str, mixed_real: str = "nvml") -> bool:
    """Whether backend `kind`'s energy counters are simulated ones (updated at the simulated period)."""
    backend = BACKENDS.get(kind)
    return backend is not None and backend.simulated_counters(BackendOptions(mixed_real=mixed_real))


def _open_sim(
    options: BackendOptions, gpus: int, faults: Sequence[SimFault], first_index: int = 0
) -> GpuBackend:
    from perseusd.gpu.sim import SimBackend

    return SimBackend(
        options.sim_dir,
        gpus=gpus,
        model=options.sim_model,
        update_period_s=options.sim_update_period_s,
        noise=options.sim_noise,
        seed=options.seed,
        faults=faults,
        first_index=first_index,
    )


def _open_mixed(options: BackendOptions) -> GpuBackend:
    from perseusd.gpu.mixed import MixedBackend

    open_real = MIXED_REAL.get(options.mixed_real)
    if open_real is None:
        raise GpuInvalidArgumentError(
            f"unknown real part {options.mixed_real!r} of a mixed backend "
            f"(choose one of {', '.join(MIXED_REAL_KINDS)})",
            op="open_backend",
        )
    if options.sim_dir is None:
        raise GpuInvalidArgumentError("a mixed backend needs a sim directory", op="open_backend")
    faults = sim_faults_from_env(options.environ)
    real = open_real(options, faults)
    try:
        if not real.devices():
            raise NvmlLibraryError(
                "NVML sees no GPU for the mixed backend; use --backend sim", op="open_backend"
            )
        first = 1 + max(device.info.index for device in real.devices())
        return MixedBackend(real, _open_sim(options, options.sim_gpus, faults, first))
    except BaseException:
        real.close()
        raise


def _open_nvml() -> GpuBackend:
    from perseusd.gpu.nvml import NvmlBackend

    return NvmlBackend()


BACKENDS: Mapping[str, BackendKind] = {
    kind.name: kind
    for kind in (
        BackendKind("auto", _auto),
        BackendKind("nvml", lambda _options: _open_nvml()),
        BackendKind("sim", _sim, lambda _options: True),
        BackendKind("mixed", _open_mixed, lambda options: options.mixed_real == "sim"),
    )
}
"""Every GPU backend by its `--backend` name: the one place a backend is added."""
BACKEND_KINDS = tuple(BACKENDS)
MIXED_REAL: Mapping[str, Callable[[BackendOptions, Sequence[SimFault]], GpuBackend]] = {
    "nvml": lambda _options, _faults: _open_nvml(),
    "sim": lambda options, faults: _open_sim(options, 1, faults),
}
"""What plays the real GPU of a `mixed` backend: NVML's GPUs, or one simulated board standing in for them."""
MIXED_REAL_KINDS = tuple(MIXED_REAL)


def sim_faults_from_env(environ: Mapping[str, str] | None = None) -> list[SimFault]:
    """The faults of `PERSEUSD_SIM_FAULTS` in `environ` (default `os.environ`); [] when unset."""
    env = os.environ if environ is None else environ
    faults_json = env.get(FAULTS_ENV, "")
    faults = parse_faults(faults_json) if faults_json.strip() else []
    if faults:
        logger.warning("simulated GPU faults injected from %s: %s", FAULTS_ENV, faults)
    return faults
