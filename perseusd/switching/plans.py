"""The plan book: the plans of leased GPUs (`perseusd.switching.gpu_plan`), by UUID, and every other write of
their locked clocks.

The plan book is the one writer of a leased GPU's locked clock: the daemon gives only it the GPUs' clock
calls. A plan's switches, a job's profiling sweep (`submit_clock`) and a client's `set_clock` all go through
it, so a plan always knows when another writer moved its GPU's clock (it then submits its next change
whatever it is). Restoring a GPU's originals after its lease ends is the restore keeper's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future

from perseus_client.protocol import CarriedComputation, PlanEntry, PlanStats

from perseusd.switching.early_changes import EarlyRaise
from perseusd.switching.gpu_plan import GpuPlan, SubmitClock
from perseusd.switching.plan_entries import ComputationKey, computation_key, validate_plan

SetClockNow = Callable[[str, int | None], int | None]
"""Lock a GPU's clock (None unlocks) and wait: the clock applied (MHz) or None."""


class PlanBook:
    """The plans of leased GPUs, by UUID, and every other write of their locked clocks (see module)."""

    def __init__(
        self,
        submit: SubmitClock,
        clock_ns: Callable[[], int] = time.monotonic_ns,
        early: EarlyRaise | None = None,
        set_now: SetClockNow | None = None,
    ) -> None:
        """`submit`: lock a GPU's clock without waiting; `set_now`: lock it (or unlock it) and wait (a
        client's `set_clock`); `clock_ns`: the plans' one clock, CLOCK_MONOTONIC (see `GpuPlan`)."""
        self._submit = submit
        self._set_now = set_now
        self._clock_ns = clock_ns
        self._early = early
        self._plans: dict[str, GpuPlan] = {}
        self.carry_changes: dict[str, tuple[CarriedComputation, ...]] = {}
        """GPUs whose carried events changed since `take_carry_changes` (a plan set or dropped): what they are
        now (empty: none)."""

    def now_ns(self) -> int:
        """Now on the plans' clock: when an event was received."""
        return self._clock_ns()

    def set(
        self,
        gpu: str,
        plan: Sequence[PlanEntry],
        supported_clocks_mhz: Sequence[int],
        times_s: Sequence[float] | None = None,
        slack_s: Sequence[float] | None = None,
    ) -> GpuPlan:
        """Validate and install a plan (replacing any), and submit its first computation's clock.

        `times_s`: each computation's expected time at its planned clock, which lets higher clocks be
        raised early; without it, every change waits for the previous computation's end event.
        `slack_s`: how late each computation may end without delaying the iteration, which lets lower
        clocks be set early from computations that have the slack.
        """
        clocks_mhz = validate_plan(plan, supported_clocks_mhz)
        if times_s is not None and len(times_s) != len(plan):
            raise ValueError(f"{len(times_s)} expected times for a plan of {len(plan)} computations")
        keys = [computation_key(e.instruction, e.microbatch, e.chunk) for e in plan]
        if slack_s is not None and len(slack_s) != len(plan):
            raise ValueError(f"{len(slack_s)} slacks for a plan of {len(plan)} computations")
        gpu_plan = GpuPlan(
            gpu,
            keys,
            clocks_mhz,
            self._submit,
            times_s=times_s,
            early=self._early,
            clock_ns=self._clock_ns,
            slack_s=slack_s,
        )
        self.drop(gpu)
        self._plans[gpu] = gpu_plan
        self.carry_changes[gpu] = gpu_plan.carried()
        gpu_plan.start(self._clock_ns())
        return gpu_plan

    def submit_clock(self, gpu: str, clock_mhz: int) -> Future[int]:
        """Lock `gpu`'s clock outside any plan without waiting (a job's profiling sweep): the Future gives the
        clock applied (MHz)."""
        self._moved_outside(gpu)
        return self._submit(gpu, clock_mhz)

    def set_clock(self, gpu: str, clock_mhz: int | None) -> int | None:
        """A client's clock for `gpu` (None unlocks), applied before this returns: the clock applied."""
        if self._set_now is None:
            raise RuntimeError("this plan book was built without a way to set a clock now")
        self._moved_outside(gpu)
        return self._set_now(gpu, clock_mhz)

    def _moved_outside(self, gpu: str) -> None:
        plan = self._plans.get(gpu)
        if plan is not None:
            plan.forget_requested()

    def drop(self, gpu: str) -> bool:
        plan = self._plans.pop(gpu, None)
        if plan is not None:
            plan.retire()
            self.carry_changes[gpu] = ()
        return plan is not None

    def take_carry_changes(self) -> dict[str, tuple[CarriedComputation, ...]]:
        """The GPUs whose carried events changed, and what they are now; forgets them."""
        changes = dict(self.carry_changes)
        for gpu in changes:
            self.carry_changes.pop(gpu, None)
        return changes

    def carried(self, gpu: str) -> tuple[CarriedComputation, ...]:
        """What a client may carry of `gpu`'s events now (empty: nothing, or no plan)."""
        plan = self._plans.get(gpu)
        return () if plan is None else plan.carried()

    def clear(self) -> None:
        for gpu in list(self._plans):
            self.drop(gpu)

    def get(self, gpu: str) -> GpuPlan | None:
        return self._plans.get(gpu)

    def stats(self, gpu: str) -> PlanStats | None:
        plan = self._plans.get(gpu)
        return None if plan is None else plan.stats()

    def on_begin(self, gpu: str, key: ComputationKey, received_ns: int, begun_ns: int | None = None) -> None:
        plan = self._plans.get(gpu)
        if plan is not None:
            plan.on_begin(key, received_ns, begun_ns)

    def on_end(self, gpu: str, key: ComputationKey, received_ns: int, ended_ns: int | None = None) -> None:
        plan = self._plans.get(gpu)
        if plan is not None:
            plan.on_end(key, received_ns, ended_ns)
