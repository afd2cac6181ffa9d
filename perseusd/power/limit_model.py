"""A job's iteration at one frontier point under per-GPU power limits: its time and its worst window power.

A power limit caps each computation as a GPU's power capping does (and the simulated boards model): a
computation whose power at its planned clock is above its GPU's limit runs at the highest lower clock whose
power fits, or at the lowest clock known when none does. The iteration is the DAG's longest path over those
durations; the job's power over the enforcement window is the worst window of its local pipelines' power
(`perseusd.power.aliasing`). A limit is a power-dependent clock ceiling: below a frontier's slowest point
(the least-energy one), it slows the computations that draw the most, which frontier points never do.

`LimitModel.evaluate` is memoised on the limits: the node cap asks the same questions every second while
nothing changes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from perseusd.planner.dag import ComputationDag
from perseusd.power.aliasing import periodic_worst_window_w, schedule

Option = tuple[float, float]
"""(time s, power W) of a computation at one clock."""
MEMO_LIMIT = 4096


@dataclass(frozen=True)
class LocalPipeline:
    """One pipeline of the job and the GPU each of its stages runs on here (None: another node's)."""

    gpus: tuple[str | None, ...]


class LimitModel:
    """One point of one job under limits (see the module)."""

    def __init__(
        self,
        dag: ComputationDag,
        options: Sequence[Sequence[Option]],
        pipelines: Sequence[LocalPipeline],
        p_block_w: float,
        window_s: float,
    ) -> None:
        """`options[node]`: the node's computation at its planned clock first, then at every lower clock
        known, highest first."""
        if len(options) != dag.num_computations or any(not o for o in options):
            raise ValueError("every computation needs at least its planned clock's cost")
        self._dag = dag
        self._options = [tuple(o) for o in options]
        self._pipelines = tuple(pipelines)
        self._p_block_w = p_block_w
        self._window_s = window_s
        self._memo: dict[tuple[tuple[str, float], ...], tuple[float, float]] = {}

    def evaluate(self, limits_w: Mapping[str, float]) -> tuple[float, float]:
        """(iteration time s, worst window power W of the job's local GPUs) under `limits_w`."""
        key = tuple(sorted(limits_w.items()))
        found = self._memo.get(key)
        if found is None:
            if len(self._memo) >= MEMO_LIMIT:
                self._memo.clear()
            found = self._memo[key] = self._evaluate(limits_w)
        return found

    def _evaluate(self, limits_w: Mapping[str, float]) -> tuple[float, float]:
        time_s, window_w = 0.0, 0.0
        for pipeline in self._pipelines:
            durations, powers = [], []
            for node, comp in enumerate(self._dag.computations):
                gpu = pipeline.gpus[comp.stage]
                limit_w = limits_w.get(gpu, float("inf")) if gpu is not None else float("inf")
                t, p = _capped(self._options[node], limit_w)
                durations.append(t)
                powers.append(p)
            period_s, segments = schedule(self._dag, durations, powers, self._p_block_w)
            time_s = max(time_s, period_s)
            local = [s for stage, gpu in enumerate(pipeline.gpus) if gpu is not None for s in segments[stage]]
            locals_ = sum(1 for gpu in pipeline.gpus if gpu is not None)
            window_w += periodic_worst_window_w(local, period_s, self._p_block_w * locals_, self._window_s)
        return time_s, window_w


def _capped(options: Sequence[Option], limit_w: float) -> Option:
    for option in options:
        if option[1] <= limit_w:
            return option
    return options[-1]
