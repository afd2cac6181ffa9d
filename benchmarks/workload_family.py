"""A family of H100 workloads composed from per-kind curves, for the closed-loop suite (`--suite family`).

Each stage's forward and backward are sums of computations of a few *kinds*, each with its own time and
power at every clock (`KINDS`). A stage's time at a clock is the sum of its parts' times there, its energy
the sum of their time x power. So stages differ in how their time and power follow the clock, not only in
how heavy they are (the `h100_variants` scale one profile's rows and keep its power at every clock).

Where the curves come from (`KIND_SOURCES` says it per kind):

- `block_h100` (measured): one transformer block (d_model 4096, 32 heads, FFN 16384, bf16, one 2048-token
  sequence), the mean of stages 1 and 2 of the GPT profile measured on a real H100 (the bundled
  `gpt-4stage+h100_sxm_bf16.csv`, 4 blocks each) divided by 4. Compute-bound matrix multiplies: power-capped
  at ~690 W over the top clocks, time flat from 1980 down to ~1665 MHz.
- `block_h200` (measured): the same block measured on a real H200 (`docs/gpu-validate/h200-2026-11-25.json`,
  the mean of its in-daemon and standalone locked-clock sweeps, 10 clocks 1035-1980 MHz), linear between its
  clocks; below 1035 MHz synthesised (time x 1035 / f, power falling in proportion to the clock).
  Its curve differs from the H100's (its flat top is wider, its energy falls less steeply).
- `lm_head` (measured, smoothed): the output layer and cross-entropy of a 50,257-token vocabulary: the H100
  profile's stage 3 less one `block_h100` x 4. A difference of two measurements is noisy (its power swings
  by +-100 W between neighbouring clocks), so it is fitted by least squares: time a + b / f, power a
  quadratic in f clamped to [idle power at f + 20 W, 700 W]. Other vocabularies scale it by V / 50,257 (the
  output matrix multiply and the logits grow linearly with V).
- synthesised kinds (not measured; their physical bounds): `attention` (long-context attention beyond the
  measured 2048 tokens: compute-bound but not power-capped, time t0 (0.05 + 0.95 x 1980 / f), power idle(f)
  + 120 + 350 (f / 1980)^2.5 W, so 599 W at 1980 MHz and 247 W at 900, always below the 700 W limit);
  `memory` (memory-bound work: normalisation, elementwise, the MoE router's permutations, the embedding's
  gather and its dense gradient; time t0 (0.9 + 0.1 x 1980 / f), within 10 % of flat from 1980 to 990 MHz
  because HBM runs at its own fixed clock; power idle(f) + 120 + 180 (f / 1980)^2 W: 430 W at 1980, 236 W
  at 900); `alltoall` (an MoE layer's dispatch and combine waits: time independent of the SM clock, power
  idle(f) + 60 W for NVLink and the copy engines). idle(f) is the board's measured idle power at the clock
  (79 W at 900, 130 W at 1980 MHz). The embedding is `memory` work: forward 0.02 ms, backward 0.6 ms per
  50,257 tokens of vocabulary (what the measured stage 0 adds to its blocks, whose energy the noise hides).

Kinds measured by the real-GPU check's layer sweep (`gpu_validate.py --layer-sweep`, reports committed as
`docs/gpu-validate/layer-sweep-*.json`, several sweeps of one GPU averaged) join as `GPU/kind`
(`measured_layer_kinds`). Two H200 sweeps are committed (2026-11-26, 8 clocks 1035-1980 MHz each); they
differ by a median 1-3 % (time, energy) on the matrix-multiply kinds and by 10-25 % on the launch-bound ones
(`memory`, `embedding` forwards of 20-80 us), which the family therefore leaves out. They contradict two
synthesised assumptions: attention over 8,192 tokens is power-capped (~700 W down to 1575 MHz), not
uncapped; and the MLP's backward ran 24-32 % slower locked at 1980 than at 1845 MHz at the 700 W limit.

A workload (`Workload`) is a pipeline of 4-8 stages, each a number of transformer layers (dense: one block;
MoE: a block whose FFN is experts, plus the all-to-all waits and the router's memory-bound work), the first
stage adding the embedding, the last the output layer; long-context workloads add attention to every layer;
with activation recomputation each layer's forward runs again in its backward. `FAMILY` lists 27 of them:
24
(4, 6 and 8 stages, 8-32 microbatches, dense and MoE, balanced and unbalanced, with and without
recomputation, vocabularies 32k-256k, H100 and H200 block curves), and 3 more (`h200-layers*`) composed
from the H200 layer sweeps alone (`_measured_family`). Every profile is at the measured H100
sweep's 25 clocks (900-1980 MHz every 45), as the board runs it (linear between them).

`draw_workload(SEED)` (the suite's case `family:drawn-SEED`) draws a workload outside `FAMILY` from the
same kinds and ranges: a check on workloads nobody tuned on.

    python benchmarks/workload_family.py OUTDIR     # writes OUTDIR/NAME.csv for every workload
"""

from __future__ import annotations

import functools
import io
import json
import random
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perseusd.gpu.sim_boards import load_board
from perseusd.planner.bundled import bundled_profile

ROOT = Path(__file__).resolve().parents[1]
H200_RECORD = ROOT / "docs" / "gpu-validate" / "h200-2026-11-25.json"
LAYER_SWEEPS = ROOT / "docs" / "gpu-validate"
CLOCKS_MHZ: tuple[int, ...] = tuple(range(900, 1981, 45))
"""The measured H100 sweep's clocks."""
TOP_MHZ = 1980
POWER_LIMIT_W = 700.0
MEASURED_MAX_W = 740.0
GPT_VOCAB = 50_257
INSTRUCTIONS = ("forward", "backward")
MEASURED_MLPS = 4.0
"""A measured workload's microbatch is one 8,192-token sequence: the sweep's attention kind (8,192 tokens,
with its QKV projection) and 4 of its MLP kind (2,048 tokens each) make one layer."""

Curve = dict[int, tuple[float, float]]
"""clock MHz -> (time s, power W) of one unit of a kind."""

KIND_SOURCES: dict[str, str] = {
    "block_h100": "measured: H100, GPT stages 1-2 / 4 (bundled gpt-4stage+h100_sxm_bf16.csv)",
    "block_h200": "measured: H200, docs/gpu-validate/h200-2026-11-25.json (1035-1980 MHz; below synthesised)",
    "lm_head": "measured, smoothed: H100 stage 3 less its 4 blocks (50,257-token vocabulary)",
    "attention": "synthesised: compute-bound, uncapped; 247-599 W",
    "memory": "synthesised: HBM-bound, time within 10 % of flat; 236-430 W",
    "alltoall": "synthesised: clock-independent wait; idle + 60 W",
}


def _idle_w(clock_mhz: int) -> float:
    return load_board("h100_sxm").idle_power_w(clock_mhz)


def _lerp(points: dict[int, float], clock_mhz: int) -> float:
    known = sorted(points)
    if clock_mhz in points:
        return points[clock_mhz]
    lower = max(c for c in known if c < clock_mhz)
    upper = min(c for c in known if c > clock_mhz)
    weight = (clock_mhz - lower) / (upper - lower)
    return points[lower] + weight * (points[upper] - points[lower])


@cache
def _h100_rows() -> dict[tuple[int, str, int], tuple[float, float]]:
    profile = bundled_profile("h100_sxm")
    return {(m.stage, m.instruction.value, m.freq_mhz): (m.time_s, m.energy_j) for m in profile.measurements}


def _block_h100(instruction: str) -> Curve:
    rows = _h100_rows()
    curve: Curve = {}
    for clock in CLOCKS_MHZ:
        time_s = sum(rows[(s, instruction, clock)][0] for s in (1, 2)) / 8
        energy_j = sum(rows[(s, instruction, clock)][1] for s in (1, 2)) / 8
        curve[clock] = (time_s, energy_j / time_s)
    return curve


def _block_h200(instruction: str) -> Curve:
    record = json.loads(H200_RECORD.read_text())
    sweeps = (record["sweep"], record["standalone_sweep"])
    rows = []
    for row in sweeps[0]:
        clock = int(row["clock_mhz"])
        other = next(r for r in sweeps[1] if int(r["clock_mhz"]) == clock)
        rows.append(
            {key: (row[key] + other[key]) / 8 for key in row if key != "clock_mhz"} | {"clock_mhz": clock}
        )
    return curve_from_rows(rows, instruction)


def curve_from_rows(rows: list[dict[str, float]], instruction: str) -> Curve:
    """A kind's curve from locked-clock sweep rows (`clock_mhz`, `forward_s`, `forward_j`, `backward_s`,
    `backward_j`), linear between their clocks; below the lowest, synthesised (compute-bound: time x low /
    f, power falling in proportion to the clock); above the highest, the highest's."""
    times = {int(r["clock_mhz"]): float(r[f"{instruction}_s"]) for r in rows}
    energies = {int(r["clock_mhz"]): float(r[f"{instruction}_j"]) for r in rows}
    low, high = min(times), max(times)
    curve: Curve = {}
    for clock in CLOCKS_MHZ:
        if clock >= high:
            curve[clock] = (times[high], energies[high] / times[high])
        elif clock >= low:
            time_s = _lerp(times, clock)
            curve[clock] = (time_s, _lerp(energies, clock) / time_s)
        else:  # synthesised: compute-bound below the sweep, power falling with the clock
            low_power_w = energies[low] / times[low]
            curve[clock] = (times[low] * low / clock, low_power_w * clock / low)
    return curve


def _least_squares(xs: list[list[float]], ys: list[float]) -> list[float]:
    """Normal equations for a few columns (Gaussian elimination; tiny, well-conditioned systems)."""
    n = len(xs[0])
    a = [[sum(r[i] * r[j] for r in xs) for j in range(n)] for i in range(n)]
    b = [sum(r[i] * y for r, y in zip(xs, ys, strict=True)) for i in range(n)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        a[col], a[pivot], b[col], b[pivot] = a[pivot], a[col], b[pivot], b[col]
        for row in range(n):
            if row != col:
                f = a[row][col] / a[col][col]
                a[row] = [x - f * y for x, y in zip(a[row], a[col], strict=True)]
                b[row] -= f * b[col]
    return [b[i] / a[i][i] for i in range(n)]


def _lm_head(instruction: str) -> Curve:
    rows = _h100_rows()
    block = _block_h100(instruction)
    times = [rows[(3, instruction, c)][0] - 4 * block[c][0] for c in CLOCKS_MHZ]
    energies = [rows[(3, instruction, c)][1] - 4 * block[c][0] * block[c][1] for c in CLOCKS_MHZ]
    u = [TOP_MHZ / c for c in CLOCKS_MHZ]
    a, b = _least_squares([[1.0, x] for x in u], times)
    v = [c / TOP_MHZ for c in CLOCKS_MHZ]
    powers = [e / t for e, t in zip(energies, times, strict=True)]
    p0, p1, p2 = _least_squares([[1.0, x, x * x] for x in v], powers)
    curve: Curve = {}
    for clock, x, y in zip(CLOCKS_MHZ, u, v, strict=True):
        power_w = min(POWER_LIMIT_W, max(_idle_w(clock) + 20.0, p0 + p1 * y + p2 * y * y))
        curve[clock] = (a + b * x, power_w)
    return curve


def _synthetic(
    time_shape: Callable[[float], float], extra_w: Callable[[float], float], backward_factor: float
) -> Callable[[str], Curve]:
    """A kind of 1 ms forward at the top clock: time 1 ms x time_shape(1980 / f), power idle(f) +
    extra_w(f / 1980); the backward `backward_factor` times the forward's time at the same power."""

    def curve(instruction: str) -> Curve:
        scale = 1.0 if instruction == "forward" else backward_factor
        return {
            c: (1e-3 * scale * time_shape(TOP_MHZ / c), _idle_w(c) + extra_w(c / TOP_MHZ)) for c in CLOCKS_MHZ
        }

    return curve


KINDS: dict[str, Callable[[str], Curve]] = {
    "block_h100": _block_h100,
    "block_h200": _block_h200,
    "lm_head": _lm_head,
    "attention": _synthetic(lambda u: 0.05 + 0.95 * u, lambda v: 120.0 + 350.0 * v**2.5, 2.5),
    "memory": _synthetic(lambda u: 0.9 + 0.1 * u, lambda v: 120.0 + 180.0 * v**2, 2.0),
    "alltoall": _synthetic(lambda _u: 1.0, lambda _v: 60.0, 1.0),
}


def measured_layer_kinds(directory: Path = LAYER_SWEEPS) -> dict[str, Callable[[str], Curve]]:
    """The kinds of every layer sweep in `directory` (`gpu_validate.py --layer-sweep`'s reports, files
    `layer-sweep-*.json`), named `GPU/kind`, each one unit = one execution of the swept module. Several
    sweeps of one GPU are averaged at the clocks they share (`mean_rows`)."""
    runs: dict[str, list[list[dict[str, float]]]] = {}
    for path in sorted(directory.glob("layer-sweep-*.json")):
        report = json.loads(path.read_text())
        for kind, rows in report["kinds"].items():
            runs.setdefault(f"{report['gpu']}/{kind}", []).append(rows)
    return {name: functools.partial(_rows_curve, mean_rows(found)) for name, found in runs.items()}


def _rows_curve(rows: list[dict[str, float]], instruction: str) -> Curve:
    return curve_from_rows(rows, instruction)


def mean_rows(runs: list[list[dict[str, float]]]) -> list[dict[str, float]]:
    """Sweep rows averaged over runs, at the clocks every run measured."""
    by_clock = [{int(row["clock_mhz"]): row for row in rows} for rows in runs]
    shared = sorted(set.intersection(*(set(rows) for rows in by_clock)), reverse=True)
    keys = [key for key in runs[0][0] if key != "clock_mhz"]
    return [
        {"clock_mhz": clock}
        | {key: sum(rows[clock][key] for rows in by_clock) / len(by_clock) for key in keys}
        for clock in shared
    ]


@cache
def kind_curve(kind: str, instruction: str) -> Curve:
    """One unit of `kind` (see the module docstring): clock -> (time s, power W)."""
    maker = KINDS.get(kind) or measured_layer_kinds().get(kind)
    if maker is None:
        raise KeyError(f"no kind {kind!r}: one of {', '.join(KINDS)} or a layer sweep's GPU/kind")
    return maker(instruction)


Parts = dict[str, float]
"""kind -> units (forward); a backward has the same units of each kind (each kind's own backward)."""


@dataclass(frozen=True)
class Workload:
    """A pipeline composed of kinds (module docstring)."""

    name: str
    layers: tuple[int, ...]
    """Transformer layers per stage."""
    microbatches: int
    moe: bool = False
    recompute: bool = False
    vocab: int = GPT_VOCAB
    block: str = "block_h100"
    long_context: float = 0.0
    """Attention beyond the measured 2048 tokens per layer, in `attention` units (1 ms forward at 1980)."""
    measured_gpu: str = ""
    """A layer sweep's GPU (`NVIDIA H200`): every part from its measured kinds alone (`measured_parts`)."""

    @property
    def stages(self) -> int:
        return len(self.layers)

    @property
    def balanced(self) -> bool:
        return len(set(self.layers)) == 1

    def layer_parts(self) -> Parts:
        if self.measured_gpu:
            return {f"{self.measured_gpu}/matmul": MEASURED_MLPS, f"{self.measured_gpu}/attention": 1.0}
        parts: Parts = {self.block: 1.0}
        if self.moe:  # experts' grouped matmuls ~ the block's, plus dispatch/combine and routing
            parts = {self.block: 1.15, "alltoall": 0.9, "memory": 0.25}
        if self.long_context:
            parts["attention"] = self.long_context
        return parts

    def stage_parts(self, stage: int) -> tuple[Parts, Parts, Parts]:
        """(forward parts, backward parts, forward parts the backward recomputes) of a stage."""
        forward: Parts = {}
        for kind, units in self.layer_parts().items():
            forward[kind] = forward.get(kind, 0.0) + units * self.layers[stage]
        backward = dict(forward)
        extra_forward: Parts = {}
        if self.measured_gpu:
            return self._measured_ends(stage, forward, backward)
        if stage == 0:
            extra_forward["memory"] = 0.02  # the embedding's gather
            backward["memory"] = backward.get("memory", 0.0) + 0.3 * self.vocab / GPT_VOCAB  # dense grad
        if stage == self.stages - 1:
            extra_forward["lm_head"] = self.vocab / GPT_VOCAB
            backward["lm_head"] = backward.get("lm_head", 0.0) + self.vocab / GPT_VOCAB
        recomputed = dict(forward) if self.recompute else {}
        for kind, units in extra_forward.items():
            forward[kind] = forward.get(kind, 0.0) + units
        return forward, backward, recomputed

    def _measured_ends(self, stage: int, forward: Parts, backward: Parts) -> tuple[Parts, Parts, Parts]:
        """A measured workload's stage: its layers, the embedding on the first stage (its dense gradient
        over the vocabulary does not grow with the tokens: one unit) and the output layer on the last (one
        unit per 2,048 tokens: `MEASURED_MLPS`)."""
        ends: Parts = {}
        if stage == 0:
            ends[f"{self.measured_gpu}/embedding@{self.vocab}"] = 1.0
        if stage == self.stages - 1:
            ends[f"{self.measured_gpu}/lm_head@{self.vocab}"] = MEASURED_MLPS
        recomputed = dict(forward) if self.recompute else {}
        return forward | ends, backward | ends, recomputed


def _cost(parts: Parts, instruction: str, clock_mhz: int) -> tuple[float, float]:
    time_s = energy_j = 0.0
    for kind, units in parts.items():
        t, p = kind_curve(kind, instruction)[clock_mhz]
        time_s += units * t
        energy_j += units * t * p
    return time_s, energy_j


def stage_cost(workload: Workload, stage: int, instruction: str, clock_mhz: int) -> tuple[float, float]:
    """(time s, energy J) of one forward or backward of `stage` at a clock."""
    forward, backward, recomputed = workload.stage_parts(stage)
    if instruction == "forward":
        return _cost(forward, "forward", clock_mhz)
    t_b, e_b = _cost(backward, "backward", clock_mhz)
    t_f, e_f = _cost(recomputed, "forward", clock_mhz)
    return t_b + t_f, e_b + e_f


def profile_csv(workload: Workload) -> str:
    """The workload's profile as CSV text (the bundled profiles' columns), at `CLOCKS_MHZ`."""
    out = io.StringIO()
    out.write("stage,instruction,frequency,time,energy\n")
    for stage in range(workload.stages):
        for instruction in INSTRUCTIONS:
            for clock in CLOCKS_MHZ:
                time_s, energy_j = stage_cost(workload, stage, instruction, clock)
                out.write(f"{stage},{instruction},{clock},{time_s:.7f},{energy_j:.6f}\n")
    return out.getvalue()


def _family() -> dict[str, Workload]:
    """24 workloads: 8 pipeline shapes x 3 compositions (dense balanced; dense unbalanced with
    recomputation on the H200 curve; MoE, alternately balanced/unbalanced and with/without recomputation,
    long context)."""
    shapes = ((4, 8), (4, 16), (4, 32), (6, 12), (6, 24), (8, 8), (8, 16), (8, 32))
    vocabs = (32_000, 50_257, 128_256, 256_000)
    family: dict[str, Workload] = {}
    for i, (stages, microbatches) in enumerate(shapes):
        layers = ({4: 4, 6: 3, 8: 3}[stages],) * stages
        vocab = vocabs[i % len(vocabs)]
        name = f"dense{stages}x{microbatches}"
        family[name] = Workload(name, layers, microbatches, vocab=vocab)
        uneven = tuple(
            max(1, n + (1 if s % 3 == 1 else -1 if s == stages - 1 else 0)) for s, n in enumerate(layers)
        )
        name = f"dense-uneven-rc{stages}x{microbatches}"
        family[name] = Workload(
            name, uneven, microbatches, recompute=True, vocab=vocabs[(i + 2) % 4], block="block_h200"
        )
        moe_layers = layers if i % 2 == 0 else uneven
        kind = "moe" if i % 2 == 0 else "moe-uneven"
        recompute = i % 4 in (1, 2)
        name = f"{kind}{'-rc' if recompute else ''}{stages}x{microbatches}"
        family[name] = Workload(
            name,
            moe_layers,
            microbatches,
            moe=True,
            recompute=recompute,
            vocab=vocabs[(i + 1) % 4],
            long_context=0.0 if i % 3 else 0.4,
        )
    return family


def _measured_family() -> dict[str, Workload]:
    """Workloads composed from the H200 layer sweeps alone (docs/gpu-validate/layer-sweep-h200-*.json):
    long-context dense models at 8,192 tokens per microbatch, at the vocabularies the sweep measured."""
    gpu = "NVIDIA H200"
    shapes = (
        ("h200-layers4x16", (2, 2, 2, 2), 16, 128_256, False),
        ("h200-layers-rc6x12", (2, 2, 3, 2, 2, 1), 12, 128_256, True),
        ("h200-layers8x8", (1,) * 8, 8, 32_000, False),
    )
    return {
        name: Workload(
            name, layers, microbatches, recompute=rc, vocab=vocab, block=f"{gpu}/matmul", measured_gpu=gpu
        )
        for name, layers, microbatches, vocab, rc in shapes
    }


FAMILY: dict[str, Workload] = _family() | _measured_family()

DRAWN = re.compile(r"drawn-(\d{1,9})")
"""`drawn-SEED`: a workload drawn at random (`draw_workload`), not in `FAMILY`."""
DRAWN_VOCABS = (32_000, 128_256)
"""The vocabularies the H200 layer sweeps measured (a drawn workload of measured kinds uses one)."""


def draw_workload(seed: int) -> Workload:
    """A workload nobody tuned on: its shape and composition drawn from `seed` within the family's ranges
    (4-8 stages, 8-32 microbatches, 1-5 layers per stage, dense or MoE, balanced or not, recomputation or
    not, vocabularies 32k-256k, long context or not, the H100 or H200 block, or the H200 layer sweeps alone).
    The same seed always draws the same workload, so a run can be repeated; a new seed is a new workload."""
    rng = random.Random(seed)
    stages = rng.randint(4, 8)
    microbatches = rng.randint(8, 32)
    base = rng.randint(1, 4)
    if rng.random() < 0.3:
        layers = (base,) * stages
    else:
        layers = tuple(max(1, base + rng.choice((-1, 0, 0, 1))) for _ in range(stages))
    recompute = rng.random() < 0.5
    name = f"drawn-{seed}"
    if rng.random() < 0.25:
        gpu = "NVIDIA H200"
        vocab = rng.choice(DRAWN_VOCABS)
        block = f"{gpu}/matmul"
        return Workload(
            name, layers, microbatches, recompute=recompute, vocab=vocab, block=block, measured_gpu=gpu
        )
    return Workload(
        name,
        layers,
        microbatches,
        moe=rng.random() < 0.4,
        recompute=recompute,
        vocab=rng.randint(32_000, 256_000),
        block=rng.choice(("block_h100", "block_h200")),
        long_context=rng.choice((0.0, 0.0, round(rng.uniform(0.1, 0.6), 2))),
    )


def workload_named(name: str) -> Workload:
    """A family workload by name, or `drawn-SEED` (`draw_workload`); KeyError naming the choices."""
    drawn = DRAWN.fullmatch(name)
    if drawn is not None:
        return draw_workload(int(drawn.group(1)))
    if name not in FAMILY:
        raise KeyError(f"unknown workload {name!r}: drawn-SEED or one of {', '.join(FAMILY)}")
    return FAMILY[name]


def bounds_violations(workload: Workload) -> list[str]:
    """What in a workload's profile lies outside physics as measured: power below the idle power at its
    clock or above the most the real H100 drew under its 700 W limit (737 W: the sweep's block at 1710 MHz,
    a window's average), or a lower clock more than 3 % faster than a higher one (the measured wiggle). A
    workload of measured kinds alone keeps its sweeps' order as measured: the H200 ran its MLP backward
    24-32 % slower locked at 1980 MHz than at 1845, at its 700 W limit, in both sweeps."""
    problems = []
    for stage in range(workload.stages):
        for instruction in INSTRUCTIONS:
            previous_s = 0.0
            for clock in sorted(CLOCKS_MHZ, reverse=True):
                time_s, energy_j = stage_cost(workload, stage, instruction, clock)
                power_w = energy_j / time_s
                where = f"{workload.name} stage {stage} {instruction} {clock} MHz"
                if not _idle_w(clock) <= power_w <= MEASURED_MAX_W:
                    problems.append(f"{where}: {power_w:.0f} W")
                if time_s < previous_s * 0.97 and not workload.measured_gpu:
                    problems.append(f"{where}: {time_s * 1e3:.2f} ms, faster than a higher clock")
                previous_s = max(previous_s, time_s)
    return problems


def write_profiles(argv: list[str], profiles: dict[str, Callable[[], str]], usage: str | None) -> int:
    """The command `SCRIPT OUTDIR`: each profile's CSV text written to OUTDIR/NAME.csv (its path printed)."""
    if len(argv) != 1:
        print(usage, file=sys.stderr)
        return 2
    outdir = Path(argv[0])
    outdir.mkdir(parents=True, exist_ok=True)
    for name, csv_text in profiles.items():
        (outdir / f"{name}.csv").write_text(csv_text())
        print(outdir / f"{name}.csv")
    return 0


def main(argv: list[str]) -> int:
    profiles = {name: functools.partial(profile_csv, workload) for name, workload in FAMILY.items()}
    return write_profiles(argv, profiles, __doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
