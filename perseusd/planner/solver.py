"""The Perseus frontier solver: a DAG and a profile in, the iteration time-energy frontier out.

A pure library: `FrontierSolver.points()` is a generator of frontier points in emission order (slowest
first, one unit time faster each step); nothing is read or written and the inputs are never mutated.
The iteration itself runs in the C core (`perseusd.planner._pdcore`) when it was built, else in the
pure-Python reference (`perseusd.planner.pd_core`); both give identical results.
"""

from __future__ import annotations

import logging
import math
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from perseusd.errors import PlanningError
from perseusd.planner.compiled import load_core
from perseusd.planner.cost_model import CostModel, fit_cost_model
from perseusd.planner.dag import ComputationDag, Instruction
from perseusd.planner.options import OptionSet, build_option_set
from perseusd.planner.profile import Profile

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SolverParams:
    """Solver parameters. `unit_time_s` is in the profile's time unit (seconds for the bundled profiles)."""

    unit_time_s: float = 0.001
    p_block_w: float = 0.0
    core: str = "auto"
    """`auto` (C if built), `c` or `python`."""
    fit: str = "fast"
    """How the cost models are fitted: `fast` (the best least-squares fit, found directly) or `reference` (the
    reference's grid of scipy `curve_fit` starts; needs scipy). See `cost_model.py` and docs/solver.md."""
    reference_stop: bool = False
    """Stop at the first cut that changes the cost by less than 1e-6, exactly as the reference does. By
    default free speed-ups are taken instead, so a cost model that is flat at its slow end (plateaus in
    the profile) does not end the frontier early; every published frontier is the same either way."""


@dataclass(frozen=True)
class FrontierPoint:
    """One point of the frontier and its frequency plan."""

    index: int
    quant_time: int
    time_s: float
    model_energy_j: float
    refined_energy_j: float
    clocks_mhz: tuple[int, ...]
    """One clock per DAG node id."""
    refined_time_s: float = 0.0
    """The iteration time re-evaluated with measured times."""


class _Core(Protocol):
    t_min: int
    t_max: int

    def step(self) -> tuple[int, int, float, float, float] | None: ...

    def durations(self) -> Any: ...


@dataclass(frozen=True)
class _Tables:
    """Flat per-computation arrays shared by both cores (`array`s of int64 `q` and float64 `d`: the C core
    reads them through the buffer protocol; numpy is not needed, and not imported, on the solve path)."""

    pred_ptr: array[int]
    pred_idx: array[int]
    topo: array[int]
    min_q: array[int]
    max_q: array[int]
    cost_ptr: array[int]
    cost_val: array[float]
    rt_val: array[float]
    re_val: array[float]
    freq_val: tuple[int, ...]


def load_c_core() -> Any | None:
    """The compiled core module, or None when it was not built (or built from other sources)."""
    return load_core("_pdcore")


class FrontierSolver:
    """Prepares options and cost models once; `points()` runs the iteration."""

    def __init__(self, dag: ComputationDag, profile: Profile, params: SolverParams) -> None:
        self.dag, self.profile, self.params = dag, profile, params
        self.option_sets = self._option_sets()
        self.cost_models = self._fit_models()
        self._tables = self._flatten()
        probe = self._new_core()
        self.t_min_quant, self.t_max_quant = int(probe.t_min), int(probe.t_max)

    def _option_sets(self) -> dict[tuple[int, Instruction], OptionSet]:
        keys = sorted(
            {(self.dag.virtual_stage(n), c.instruction) for n, c in enumerate(self.dag.computations)}
        )
        p = self.params
        if not (p.p_block_w >= 0 and math.isfinite(p.p_block_w)):
            raise PlanningError(f"blocking power must be a finite non-negative number (got {p.p_block_w})")
        return {
            key: build_option_set(key[0], key[1], self.profile.options(*key), p.unit_time_s, p.p_block_w)
            for key in keys
        }

    def _fit_models(self) -> dict[tuple[int, Instruction], CostModel]:
        """Fit every option set once; identical option sets (often every stage but the last) share a fit."""
        fits: dict[tuple[tuple[int, float], ...], CostModel] = {}
        models = {}
        for key, option_set in self.option_sets.items():
            points = tuple((o.quant_time, o.effective_cost_j) for o in option_set.options)
            if points not in fits:
                fits[points] = fit_cost_model(option_set, self.params.unit_time_s, self.params.fit)
            models[key] = fits[points]
        return models

    def _flatten(self) -> _Tables:
        dag = self.dag
        pred_ptr: list[int] = [0]
        pred_idx: list[int] = []
        for preds in dag.predecessors:
            pred_idx.extend(preds)
            pred_ptr.append(len(pred_idx))
        min_q, max_q, cost_ptr = [], [], [0]
        cost_val: list[float] = []
        rt_val: list[float] = []
        re_val: list[float] = []
        freq_val: list[int] = []
        # Per (stage, instruction), the option of every quantised time: computed once, copied per node.
        slots: dict[tuple[int, Instruction], tuple[list[float], list[float], list[int]]] = {}
        for key, model in self.cost_models.items():
            option_for = self.option_sets[key].option_for
            chosen = [option_for(q) for q in range(model.min_quant, model.max_quant + 1)]
            times_s, energies_j = [o.time_s for o in chosen], [o.energy_j for o in chosen]
            slots[key] = (times_s, energies_j, [o.freq_mhz for o in chosen])
        for node, comp in enumerate(dag.computations):
            key = (dag.virtual_stage(node), comp.instruction)
            model = self.cost_models[key]
            min_q.append(model.min_quant)
            max_q.append(model.max_quant)
            cost_val.extend(model.costs_j)
            times_s, energies_j, freqs_mhz = slots[key]
            rt_val.extend(times_s)
            re_val.extend(energies_j)
            freq_val.extend(freqs_mhz)
            cost_ptr.append(len(cost_val))
        interned = {f: f for f in freq_val}
        return _Tables(
            array("q", pred_ptr),
            array("q", pred_idx),
            array("q", dag.topological_order),
            array("q", min_q),
            array("q", max_q),
            array("q", cost_ptr),
            array("d", cost_val),
            array("d", rt_val),
            array("d", re_val),
            tuple(interned[f] for f in freq_val),
        )

    def _new_core(self) -> _Core:
        t, c_core = self._tables, None
        if self.params.core in ("auto", "c"):
            c_core = load_c_core()
            if c_core is None and self.params.core == "c":
                raise PlanningError(
                    "the C solver core is not built (reinstall the package with a C compiler)"
                )
        args = (t.pred_ptr, t.pred_idx, t.topo, t.min_q, t.max_q, t.cost_ptr, t.cost_val, t.rt_val, t.re_val)
        extra = (self.dag.num_stages, float(self.params.p_block_w), self.params.reference_stop)
        if c_core is not None:
            core: _Core = c_core.PdCore(*args, *extra)
            return core
        from perseusd.planner.pd_core import PdCore

        return PdCore(
            t.pred_ptr.tolist(),
            t.pred_idx.tolist(),
            t.topo.tolist(),
            t.min_q.tolist(),
            t.max_q.tolist(),
            t.cost_ptr.tolist(),
            t.cost_val.tolist(),
            t.rt_val.tolist(),
            t.re_val.tolist(),
            *extra,
        )

    @property
    def expected_points(self) -> int:
        """The number of points a complete frontier has (one per unit time between T_min and T_max)."""
        return self.t_max_quant - self.t_min_quant

    def model_energy_j(self, model_cost_j: float, quant_time: int) -> float:
        """Plan energy from the model: effective cost plus every GPU's blocking power over the iteration."""
        return (
            model_cost_j + self.dag.num_stages * quant_time * self.params.unit_time_s * self.params.p_block_w
        )

    def points(self) -> Iterator[FrontierPoint]:
        """Generate the frontier, slowest point first. The all-slowest starting state is not emitted."""
        core, t = self._new_core(), self._tables
        # The slot of a computation's duration in the flat tables: its offset plus the duration.
        offset = [ptr - q for ptr, q in zip(t.cost_ptr[:-1], t.min_q, strict=True)]
        clock_of_slot = t.freq_val.__getitem__
        c_clocks = getattr(core, "clocks", None)
        if c_clocks is not None:
            core.set_clock_table(t.freq_val)  # type: ignore[attr-defined]
        unit_s, p_block_w, stages = self.params.unit_time_s, self.params.p_block_w, self.dag.num_stages
        index = 0
        while (result := core.step()) is not None:
            _, quant_time, cost_j, refined_time_s, refined_energy_j = result
            if c_clocks is not None:
                clocks_mhz: tuple[int, ...] = c_clocks()
            else:
                slots = map(int.__add__, offset, map(int, core.durations()))
                clocks_mhz = tuple(map(clock_of_slot, slots))
            # Positional, and the model energy as `model_energy_j` computes it (the same float operations).
            yield FrontierPoint(
                index,
                quant_time,
                quant_time * unit_s,
                cost_j + stages * quant_time * unit_s * p_block_w,
                refined_energy_j,
                clocks_mhz,
                refined_time_s,
            )
            index += 1

    def describe_models(self) -> dict[str, str]:
        """Which cost model each (stage, instruction) uses, e.g. to report a fallback."""
        return {f"{k[0]}:{k[1].value}": m.kind for k, m in self.cost_models.items()}


def solve_frontier(dag: ComputationDag, profile: Profile, params: SolverParams) -> Iterator[FrontierPoint]:
    """Generate the frontier of `dag` under `profile` (see `FrontierSolver`)."""
    return FrontierSolver(dag, profile, params).points()


__all__ = ["CostModel", "FrontierPoint", "FrontierSolver", "SolverParams", "solve_frontier"]
