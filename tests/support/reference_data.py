"""Where the measured reference data that tests and benchmarks read lives: `reference-data/` at the root of
the repository (its README.md says what each file is; NOTICE.md where it comes from and its licence). The
daemon's own bundled boards and profiles, which it ships, are elsewhere: `perseusd/data/`."""

from __future__ import annotations

from pathlib import Path

REFERENCE_DATA = Path(__file__).resolve().parents[2] / "reference-data"
H100 = REFERENCE_DATA / "h100"
"""One NVIDIA H100 80GB HBM3 measured for this project (h100/README.md)."""
CARBON = REFERENCE_DATA / "carbon"
"""Carbon-intensity traces: the Chase trace and two Electricity Maps histories."""
PERSEUS_ARTIFACT = REFERENCE_DATA / "perseus-artifact"
"""The Perseus (SOSP '24) artifact's measured profiles and published frontiers."""
