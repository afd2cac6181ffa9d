"""Profiles bundled with the package (GPT-3 175B, bf16, 8 stages), by short name, with their blocking power.

Bundled files are read through `importlib.resources`, so they work from a wheel or a zip as well as from a
source tree. Only the fixed names below resolve; no other text ever becomes a path here.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from importlib import resources

from perseusd.planner.profile import Profile
from perseusd.planner.profile_csv import read_profile_stream


@dataclass(frozen=True)
class BundledProfile:
    """One bundled profile: its file under `perseusd/data/profiles/` and the GPU's measured blocking power."""

    name: str
    file_name: str
    p_block_w: float
    description: str


BUNDLED_PROFILES: dict[str, BundledProfile] = {
    "a100_sxm": BundledProfile(
        "a100_sxm", "gpt3-175b+a100_sxm_bf16.csv", 83.64, "GPT-3 175B bf16, 8 stages, NVIDIA A100 SXM 80GB"
    ),
    "a40": BundledProfile("a40", "gpt3-175b+a40_bf16.csv", 70.38, "GPT-3 175B bf16, 8 stages, NVIDIA A40"),
}
"""Bundled profiles by short name. Blocking powers are the measured values of the Perseus paper (W)."""


def bundled_profile(name: str) -> Profile:
    """Read a bundled profile by short name (`a100_sxm`, `a40`); its source is `bundled:<name>`.

    Raises:
        KeyError: `name` is not a bundled profile.
    """
    entry = BUNDLED_PROFILES[name]
    resource = resources.files("perseusd").joinpath("data", "profiles", entry.file_name)
    text = resource.read_text(encoding="utf-8-sig")
    return read_profile_stream(io.StringIO(text, newline=""), source=f"bundled:{name}")
