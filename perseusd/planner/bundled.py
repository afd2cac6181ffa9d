"""Profiles bundled with the package, by short name (the name of the board they were measured on), with
their blocking power: GPT-3 175B bf16, 8 stages, on A100 SXM and A40 (the Perseus artifact), and a GPT-style
4-stage pipeline on H100 SXM (measured for this project). This is the one table of bundled profiles: the
planner, `perseusctl`, the emulator and the simulated GPUs' workload handles all read it.

Bundled files are read through the package's loader (what `pkgutil.get_data` does, without importing
`importlib.resources`, which costs more than reading a profile), falling back to `importlib.resources`, so
they work from a wheel or a zip as well as from a source tree. Only the fixed names below resolve; no other
text ever becomes a path here.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass

import perseusd
from perseusd.errors import PlanningError
from perseusd.planner.profile import Profile
from perseusd.planner.profile_csv import read_profile, read_profile_stream
from perseusd.planner.schedules import SCHEDULES


@dataclass(frozen=True)
class BundledProfile:
    """One bundled profile: its file under `perseusd/data/profiles/` and the GPU's measured blocking power."""

    name: str
    file_name: str
    p_block_w: float
    description: str
    origin: str
    """Where the file comes from, in the repository's reference-data/ (the files are unmodified)."""
    num_stages: int


BUNDLED_PROFILES: dict[str, BundledProfile] = {
    "a100_sxm": BundledProfile(
        "a100_sxm",
        "gpt3-175b+a100_sxm_bf16.csv",
        83.64,
        "GPT-3 175B bf16, 8 stages, NVIDIA A100 SXM 80GB",
        "perseus-artifact/profiles/gpt3-175b+a100_sxm_bf16.csv",
        8,
    ),
    "a40": BundledProfile(
        "a40",
        "gpt3-175b+a40_bf16.csv",
        70.38,
        "GPT-3 175B bf16, 8 stages, NVIDIA A40",
        "perseus-artifact/profiles/gpt3-175b+a40_bf16.csv",
        8,
    ),
    "h100_sxm": BundledProfile(
        "h100_sxm",
        "gpt-4stage+h100_sxm_bf16.csv",
        130.19,
        "GPT-style 4-stage pipeline (4 layers d4096 per stage) bf16, NVIDIA H100 80GB HBM3, 900-1980 MHz",
        "h100/gpt-4stage-profile.csv",
        4,
    ),
}
"""Bundled profiles by short name. Blocking powers are measured: the Perseus paper's for A100 SXM and A40,
idle power locked at 1980 MHz for H100 SXM (W)."""


def bundled_profile(name: str) -> Profile:
    """Read a bundled profile by short name (`a100_sxm`, `a40`, `h100_sxm`); its source is `bundled:<name>`.

    Raises:
        KeyError: `name` is not a bundled profile.
    """
    text = _read_data_file("profiles", BUNDLED_PROFILES[name].file_name).decode("utf-8-sig")
    return read_profile_stream(io.StringIO(text, newline=""), source=f"bundled:{name}")


def load_profile(spec: str, schedule: str = "1f1b") -> tuple[Profile, float | None]:
    """`--profile` of `perseusctl` and `perseus-emulate`: a bundled profile by name (with its blocking power),
    or a profile CSV file (blocking power None). For a schedule that splits its backwards (zero bubble), with
    the two halves of each backward the profile did not measure (`Profile.with_split_backward`).

    A bundled name always means the bundled profile; write `./a40` for a file of that name.

    Raises:
        PlanningError: the file cannot be read.
        ProfileError: its content is not a valid profile.
    """
    if spec in BUNDLED_PROFILES:
        profile, p_block_w = bundled_profile(spec), BUNDLED_PROFILES[spec].p_block_w
    else:
        try:
            profile, p_block_w = read_profile(spec), None
        except OSError as exc:
            raise PlanningError(
                f"cannot read profile {spec}: {exc.strerror or exc} "
                f"(give a CSV file or a bundled name: {', '.join(BUNDLED_PROFILES)})"
            ) from exc
    split = schedule in SCHEDULES and SCHEDULES[schedule].split_backward
    return (profile.with_split_backward() if split else profile), p_block_w


def _read_data_file(*parts: str) -> bytes:
    """The bytes of `perseusd/data/<parts>`, through the package's loader where it can read files."""
    spec, package_file = perseusd.__spec__, perseusd.__file__
    get_data = getattr(spec.loader, "get_data", None) if spec is not None else None
    if get_data is not None and package_file is not None:
        path = os.path.join(os.path.dirname(package_file), "data", *parts)
        try:
            data: bytes = get_data(path)
            return data
        except OSError:
            pass
    from importlib import resources

    return resources.files("perseusd").joinpath("data", *parts).read_bytes()
