"""The Phillips-Dessouky iteration (section 5 of the solver specification), pure-Python reference.

`perseusd.planner._pdcore` (C) implements the same `PdCore` interface and is used when it was built; this
module is the fallback and the executable specification the C code is tested against. Inputs are flat
arrays so that both implementations share one preparation step (`perseusd.planner.solver`).

Capacities live on the 1e-6 grid of the specification, so they are kept as integers (units of 1e-6 J) and
every max-flow computation is exact.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

EPS = 1e-6
INF_UNITS = int(10000.0 // EPS)
_BIG = 1 << 62

STEP_POINT = 0
"""`step` emitted a point."""


def to_units(value: float) -> int:
    """Floor a non-negative capacity to the 1e-6 grid, as an integer count of 1e-6."""
    return int(value // EPS)


class _Network:
    """A flow network with integer capacities (Dinic's algorithm)."""

    def __init__(self, num_nodes: int) -> None:
        self.adj: list[list[int]] = [[] for _ in range(num_nodes)]
        self.to: list[int] = []
        self.cap: list[int] = []

    def add(self, u: int, v: int, cap: int) -> int:
        self.adj[u].append(len(self.to))
        self.to.append(v)
        self.cap.append(cap)
        self.adj[v].append(len(self.to))
        self.to.append(u)
        self.cap.append(0)
        return len(self.to) - 2

    def _levels(self, s: int, t: int) -> list[int] | None:
        level = [-1] * len(self.adj)
        level[s] = 0
        queue = deque([s])
        while queue:
            u = queue.popleft()
            for e in self.adj[u]:
                if self.cap[e] > 0 and level[self.to[e]] < 0:
                    level[self.to[e]] = level[u] + 1
                    queue.append(self.to[e])
        return level if level[t] >= 0 else None

    def _augment(self, s: int, t: int, level: list[int], it: list[int]) -> int:
        """Push flow along one shortest augmenting path (iterative DFS with current-arc pointers)."""
        path: list[int] = []
        u = s
        while u != t:
            while it[u] < len(self.adj[u]):
                e = self.adj[u][it[u]]
                if self.cap[e] > 0 and level[self.to[e]] == level[u] + 1:
                    break
                it[u] += 1
            else:
                if not path:
                    return 0
                level[u] = -1
                u = self.to[path.pop() ^ 1]
                it[u] += 1
                continue
            path.append(e)
            u = self.to[e]
        pushed = min(self.cap[e] for e in path)
        for e in path:
            self.cap[e] -= pushed
            self.cap[e ^ 1] += pushed
        return pushed

    def max_flow(self, s: int, t: int) -> int:
        total = 0
        while (level := self._levels(s, t)) is not None:
            it = [0] * len(self.adj)
            while pushed := self._augment(s, t, level, it):
                total += pushed
        return total

    def reachable(self, s: int, threshold: int) -> list[bool]:
        seen = [False] * len(self.adj)
        seen[s] = True
        stack = [s]
        while stack:
            u = stack.pop()
            for e in self.adj[u]:
                v = self.to[e]
                if self.cap[e] > threshold and not seen[v]:
                    seen[v] = True
                    stack.append(v)
        return seen


class PdCore:
    """The solver state: one quantised duration per computation, starting all-slowest.

    Computations are 0..n-1; `pred_ptr`/`pred_idx` is the predecessor list in CSR form, `topo` a topological
    order. For computation i, `cost_val[cost_ptr[i] + k]` is the modelled cost at quantised time
    `min_q[i] + k` up to `max_q[i]`; `rt_val` and `re_val` (same indexing) are the measured time and energy
    of the option that runs at that duration, used for the refined energy.

    With `stop_on_zero_change` (the reference behaviour) the procedure ends at the first cut whose cost
    change is below 1e-6; without it, free speed-ups (a cost model flat at its slow end) are taken and the
    procedure goes on to T_min. Either way it ends when the iteration time stops falling.
    """

    def __init__(
        self,
        pred_ptr: Sequence[int],
        pred_idx: Sequence[int],
        topo: Sequence[int],
        min_q: Sequence[int],
        max_q: Sequence[int],
        cost_ptr: Sequence[int],
        cost_val: Sequence[float],
        rt_val: Sequence[float],
        re_val: Sequence[float],
        num_stages: int,
        p_block_w: float,
        stop_on_zero_change: bool = True,
    ) -> None:
        n = len(min_q)
        self._stop_on_zero = stop_on_zero_change
        self._n = n
        self._preds = [list(pred_idx[pred_ptr[i] : pred_ptr[i + 1]]) for i in range(n)]
        self._succs: list[list[int]] = [[] for _ in range(n)]
        for v in range(n):
            for u in self._preds[v]:
                self._succs[u].append(v)
        self._topo = list(topo)
        self._min_q, self._max_q = list(min_q), list(max_q)
        self._cost_ptr, self._cost = list(cost_ptr), list(cost_val)
        self._rt, self._re = list(rt_val), list(re_val)
        self._num_stages, self._p_block_w = num_stages, p_block_w
        self._d = list(self._min_q)
        self.t_min = self._cpm()[2]
        self._d = list(self._max_q)
        self._ef, self._lf, self._t = self._cpm()
        self.t_max = self._t
        self._done = False

    def durations(self) -> list[int]:
        """The current quantised duration of every computation."""
        return list(self._d)

    def _c(self, i: int, q: int) -> float:
        return self._cost[self._cost_ptr[i] + q - self._min_q[i]]

    def _cpm(self) -> tuple[list[int], list[int], int]:
        ef = [0] * self._n
        for v in self._topo:
            ef[v] = max((ef[u] for u in self._preds[v]), default=0) + self._d[v]
        total = max(ef[v] for v in range(self._n) if not self._succs[v])
        lf = [0] * self._n
        for v in reversed(self._topo):
            lf[v] = min((lf[w] - self._d[w] for w in self._succs[v]), default=total)
        return ef, lf, total

    def _bounds(self, i: int) -> tuple[int, int]:
        d, lo, hi = self._d[i], self._min_q[i], self._max_q[i]
        if lo == hi == d:
            return 0, INF_UNITS
        if d - 1 < lo:
            return to_units(abs(self._c(i, d) - self._c(i, d + 1))), INF_UNITS
        if d + 1 > hi:
            return 0, to_units(abs(self._c(i, d - 1) - self._c(i, d)))
        lb = abs(self._c(i, d) - self._c(i, d + 1))
        ub = abs(self._c(i, d - 1) - self._c(i, d)) + EPS
        return to_units(lb), to_units(ub)

    def _critical_arcs(self) -> list[tuple[int, int, int, int, int]]:
        """Critical arcs (u, v, lb, ub, computation or -1 for dummies) of the activity-on-arc network."""
        n, ef, lf, d = self._n, self._ef, self._lf, self._d
        src_l, src_r, snk_l, snk_r = 2 * n, 2 * n + 1, 2 * n + 2, 2 * n + 3
        arcs = [(src_l, src_r, 0, INF_UNITS, -1), (snk_l, snk_r, 0, INF_UNITS, -1)]
        for v in range(n):
            ls = lf[v] - d[v]
            if ef[v] == lf[v]:
                lb, ub = self._bounds(v)
                arcs.append((2 * v, 2 * v + 1, lb, ub, v))
            if not self._preds[v] and ls == 0:
                arcs.append((src_r, 2 * v, 0, INF_UNITS, -1))
            if not self._succs[v] and ef[v] == self._t:
                arcs.append((2 * v + 1, snk_l, 0, INF_UNITS, -1))
            arcs.extend((2 * u + 1, 2 * v, 0, INF_UNITS, -1) for u in self._preds[v] if ef[u] == ls)
        return arcs

    def _min_cut(self, arcs: list[tuple[int, int, int, int, int]]) -> list[bool] | None:
        n = self._n
        s, t, ss, tt = 2 * n, 2 * n + 3, 2 * n + 4, 2 * n + 5
        net = _Network(2 * n + 6)
        excess = [0] * (2 * n + 6)
        for u, v, lb, ub, _ in arcs:
            if ub < lb:
                return None
            net.add(u, v, ub - lb)
            excess[v] += lb
            excess[u] -= lb
        back = net.add(t, s, _BIG)
        demand = 0
        for node, ex in enumerate(excess):
            if ex > 0:
                net.add(ss, node, ex)
                demand += ex
            elif ex < 0:
                net.add(node, tt, -ex)
        if net.max_flow(ss, tt) != demand:
            return None
        net.cap[back] = net.cap[back ^ 1] = 0
        for node in (ss, tt):
            for e in net.adj[node]:
                net.cap[e] = net.cap[e ^ 1] = 0
        net.max_flow(s, t)
        return net.reachable(s, 0)

    def step(self) -> tuple[int, int, float, float, float] | None:
        """One iteration: returns (STEP_POINT, quant_time, model_cost_j, refined_time_s, refined_energy_j) of
        the new point, or None when the frontier is complete."""
        if self._done:
            return None
        arcs = self._critical_arcs()
        in_s = self._min_cut(arcs)
        change = None if in_s is None else self._apply_cut(arcs, in_s)
        before = self._t
        if change is None or (self._stop_on_zero and abs(change) < EPS):
            self._done = True
            return None
        self._ef, self._lf, self._t = self._cpm()
        if self._t >= before:
            self._done = True
            return None
        return (STEP_POINT, self._t, self._model_cost(), *self._refined())

    def _apply_cut(self, arcs: list[tuple[int, int, int, int, int]], in_s: list[bool]) -> float | None:
        speed_up = [a[4] for a in arcs if in_s[a[0]] and not in_s[a[1]]]
        slow_down = [a[4] for a in arcs if not in_s[a[0]] and in_s[a[1]]]
        if not speed_up:
            return None
        if any(i < 0 or self._d[i] - 1 < self._min_q[i] for i in speed_up):
            return None
        slow_down = [i for i in slow_down if i >= 0]
        if any(self._d[i] + 1 > self._max_q[i] for i in slow_down):
            return None
        change = 0.0
        for i in speed_up:
            change += abs(self._c(i, self._d[i] - 1) - self._c(i, self._d[i]))
            self._d[i] -= 1
        for i in slow_down:
            change -= abs(self._c(i, self._d[i]) - self._c(i, self._d[i] + 1))
            self._d[i] += 1
        return change

    def _model_cost(self) -> float:
        return sum(self._c(i, self._d[i]) for i in range(self._n))

    def _refined(self) -> tuple[float, float]:
        finish = [0.0] * self._n
        busy_s = energy_j = 0.0
        for v in self._topo:
            k = self._cost_ptr[v] + self._d[v] - self._min_q[v]
            finish[v] = max((finish[u] for u in self._preds[v]), default=0.0) + self._rt[k]
            busy_s += self._rt[k]
            energy_j += self._re[k]
        time_s = max(finish)
        return time_s, energy_j + self._p_block_w * (self._num_stages * time_s - busy_s)
