"""H100 profiles of workloads the project does not ship, derived from the measured one.

The closed-loop issue's bars are checked on H100 profiles of other models. Each variant here keeps the
measured H100 GPT profile's clock dependence row by row (its power-capped top clocks, its flat top times,
its energy minimum) and changes the pipeline's shape: how heavy each stage is, how heavy backwards are,
how many stages. Time and energy of a (stage, instruction) are scaled together, so a row's power is the
measured one. Not measurements: shapes a real model could have on the same GPU.

    python benchmarks/h100_variants.py OUTDIR      # writes OUTDIR/NAME.csv for every variant
"""

from __future__ import annotations

import csv
import functools
import io
import sys
from pathlib import Path

from perseusd.planner.bundled import bundled_profile

Shape = tuple[tuple[int, float, float], ...]
"""Each new stage: (measured stage it copies, forward scale, backward scale)."""

VARIANTS: dict[str, Shape] = {
    # a heavier first stage (embedding + more blocks) and a light LM head (small vocabulary)
    "lighthead": ((0, 1.25, 1.25), (1, 1.0, 1.0), (2, 1.0, 1.0), (3, 0.6, 0.6)),
    # a large vocabulary: the last stage dominates
    "heavyhead": ((0, 0.9, 0.9), (1, 1.0, 1.0), (2, 1.0, 1.0), (3, 1.3, 1.3)),
    # activation recomputation: backwards 30 % heavier everywhere, a lighter second stage
    "recompute": ((0, 1.0, 1.3), (1, 0.85, 1.1), (2, 1.0, 1.3), (3, 1.0, 1.3)),
    # eight stages: the measured first and last stages around six middle ones of uneven weight
    "deep8": (
        (0, 1.0, 1.0),
        (1, 1.0, 1.0),
        (2, 0.9, 0.9),
        (1, 1.1, 1.1),
        (2, 1.0, 1.0),
        (1, 0.95, 0.95),
        (2, 1.05, 1.05),
        (3, 1.0, 1.0),
    ),
}


def variant_stages(name: str) -> int:
    return len(VARIANTS[name])


def variant_csv(name: str) -> str:
    """The variant's profile as CSV text (the bundled profile's columns)."""
    shape = VARIANTS[name]
    measured = bundled_profile("h100_sxm")
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["stage", "instruction", "frequency", "time", "energy"])
    for stage, (source, forward_scale, backward_scale) in enumerate(shape):
        for m in sorted(measured.measurements, key=lambda m: (m.instruction.value, m.freq_mhz)):
            if m.stage != source:
                continue
            scale = forward_scale if m.instruction.value == "forward" else backward_scale
            writer.writerow(
                [
                    stage,
                    m.instruction.value,
                    m.freq_mhz,
                    f"{m.time_s * scale:.7f}",
                    f"{m.energy_j * scale:.6f}",
                ]
            )
    return out.getvalue()


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository root
    from benchmarks.workload_family import write_profiles

    return write_profiles(argv, {name: functools.partial(variant_csv, name) for name in VARIANTS}, __doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
