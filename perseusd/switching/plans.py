"""Per-computation clock plans: on a computation's end, the next computation's clock is submitted at once.

No transport and no waiting: a clock change is submitted to the GPU's owner thread and a done-callback (run on
that thread) records the clock applied, the event -> applied latency and errors. Everything here is counted;
nothing is logged per event.

The plan book is the one writer of a leased GPU's locked clock: the daemon gives only it the GPUs' clock
calls. A plan's switches, a job's profiling sweep (`submit_clock`) and a client's `set_clock` all go through
it, so a plan always knows when another writer moved its GPU's clock (it then submits its next change
whatever it is). Restoring a GPU's originals after its lease ends is the restore keeper's.

When the plan knows how long each computation takes (the daemon's own plans do, from the job's profile) and
the next computation is planned at a higher clock, the higher clock is submitted `lead` before the running
computation is expected to end (`EarlyRaise`); the lead is the GPU's measured clock-set latency (the 90th
percentile of its recent set calls, ~10-14 ms on an H100, ~0 on simulated GPUs) plus a margin
(`clock_lead_ms`), so a raise has acted when the next computation begins. A raise that waits for the end
event would let the next computation, often on the critical path, begin at the lower clock. A raise waits
for the begin of its run's last computation when that one alone outlasts the GPU's median clock-set latency,
so it cannot act before that computation begins.
A lower next clock waits for the end event, except where the plan gives each computation's slack (how late
it may end without delaying the iteration, `perseusd.planner.slack`): a computation that ends its run and has
the slack to run its last `lead` at the lower clock lowers `lead` before its expected end, so the lowered run
begins at its clock instead of ~10 ms into it (an H100's lock latency). The expected end
is scaled by the plan's pace: the running mean of actual / profiled duration (a straggling or throttled GPU
runs slower than its profile).
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial

from perseus_client.protocol import CarriedComputation, Instruction, PlanEntry, PlanStats

from perseusd.errors import InvalidValueError
from perseusd.gpu.clocks import snap_clock_mhz
from perseusd.records import project
from perseusd.switching.carrying import carried_events
from perseusd.switching.deadline_timer import DeadlineTimer

ComputationKey = tuple[str, int, int]  # (instruction, microbatch, chunk)
SubmitClock = Callable[[str, int], "Future[int]"]
SetClockNow = Callable[[str, int | None], int | None]
"""Lock a GPU's clock (None unlocks) and wait: the clock applied (MHz) or None."""
LATENCY_SAMPLES = 10_000
APPLIED_HISTORY = 16
"""Clocks applied kept with when they acted (a begin is judged late against the clock in force when it began:
a carried begin arrives after clocks submitted since, by the timer, were applied)."""
ACT_FRACTION = 0.5
"""Where within a clock-set call the new clock is taken to act (0: when submitted, 1: when the call returned).
A GPU changes its clock part-way through the call (an H100's call takes 9-15 ms and its clock acts 0-12 ms
in: `perseusd/data/boards/h100_sxm.json`); judged at the return, a begin in between would count late."""
MAX_EVENT_AGE_NS = 1_000_000_000
"""A begin event's own timestamp is trusted when at most this old (and never when in the future)."""
PACE_WEIGHT = 0.1
"""Weight of each computation's actual / profiled duration in the plan's running pace."""
PACE_RANGE = (0.25, 4.0)
LEAD_LATENCY_QUANTILE = 0.9
"""The quantile of a GPU's recent clock-set durations an early change allows for (`EarlyRaise.lead_ns`): with
the median, any call slower than it (a simulated H100's take 9-15 ms) could return after the next
computation began; the plan's switch model keeps the median (`JobManager._switch_model`)."""
LOWER_SLACK_FACTOR = 2
"""An early lowering needs this many times the time it runs low in slack: the slack is computed from the
profile's times, and real computations run a little longer (event overhead, a busy host)."""
MIN_LOWER_LEAD_NS = 1_000_000
"""A lowering the slack allows less lead than this waits for the end event (it would act after it anyway)."""


@dataclass(frozen=True)
class EarlyRaise:
    """Submit a higher next clock before the running computation's expected end, on `timer`.

    Attributes:
        timer: the thread that runs the raises.
        margin_ns: added to the measured latency (`clock_lead_ms`).
        latency_ns: a GPU's measured clock-set latency (ns) by UUID (`LEAD_LATENCY_QUANTILE` of its recent
            calls); None (or absent) while unmeasured.
    """

    timer: DeadlineTimer
    margin_ns: int
    latency_ns: Callable[[str], int | None] | None = None
    typical_ns: Callable[[str], int | None] | None = None
    """A GPU's median clock-set latency (ns) by UUID: a run's last computation at least this long holds its
    raise (`GpuPlan._schedule_raise`); None (or absent): never held."""

    def lead_ns(self, gpu: str) -> int:
        """How long before the expected end a raise on `gpu` is submitted (ns)."""
        measured_ns = None if self.latency_ns is None else self.latency_ns(gpu)
        return self.margin_ns + (measured_ns or 0)

    def covers(self, gpu: str, time_ns: int) -> bool:
        """Whether a computation of `time_ns` on `gpu` outlasts its median clock-set latency (measured)."""
        typical_ns = None if self.typical_ns is None else self.typical_ns(gpu)
        return typical_ns is not None and time_ns >= typical_ns


def computation_key(instruction: str, microbatch: int, chunk: int) -> ComputationKey:
    return (instruction, microbatch, chunk)


def validate_plan(plan: Sequence[PlanEntry], supported_clocks_mhz: Sequence[int]) -> list[int]:
    """The plan's clocks snapped to supported clocks; raises `InvalidValueError` on a bad plan (its `field`
    names the entry, as `plan[3].freq_mhz`)."""
    if not plan:
        raise InvalidValueError("empty (use clear_plan)", "plan")
    low_mhz = min(supported_clocks_mhz, default=1)
    high_mhz = max(supported_clocks_mhz, default=1 << 20)
    seen: set[ComputationKey] = set()
    clocks_mhz: list[int] = []
    for i, entry in enumerate(plan):
        where = f"plan[{i}]"
        if entry.microbatch < 0 or entry.chunk < 0:
            raise InvalidValueError("microbatch and chunk must be >= 0", where)
        if not low_mhz <= entry.freq_mhz <= high_mhz:
            raise InvalidValueError(
                f"{entry.freq_mhz} outside {low_mhz}..{high_mhz} MHz", f"{where}.freq_mhz"
            )
        key = computation_key(entry.instruction, entry.microbatch, entry.chunk)
        if key in seen:
            raise InvalidValueError(f"computation {key} listed twice", where)
        seen.add(key)
        clocks_mhz.append(
            snap_clock_mhz(supported_clocks_mhz, entry.freq_mhz) if supported_clocks_mhz else entry.freq_mhz
        )
    return clocks_mhz


class GpuPlan:
    """One GPU's plan: clock per computation, schedule order, counters and latency samples.

    Time: one clock, `clock_ns`, CLOCK_MONOTONIC in ns (`time.monotonic_ns`, the clock of the client's
    `timestamp_ns`; injected by tests): senders' timestamps are checked against it, timer deadlines are on
    it (the `EarlyRaise` timer must run on the same clock), and an event's `received_ns` and the clock-set
    latency are read on it.

    Threads: the main loop (events, `set_clock`, status), the deadline timer thread (early raises and
    lowerings) and the GPU's owner thread (done-callbacks of submitted clocks) share a plan:
    - `_move_lock` (reentrant: a done-callback runs inline when the owner has stopped) guards what the main
      loop, the timer and the callbacks all change: `_moves`, `_requested_mhz`, `_begun`, `pace`,
      `retired`, and the counters `clock_changes`, `skipped`, `early_raises`, `early_lowerings`, `errors`;
    - `_lock` guards what the owner thread reports: `applied_mhz`, the clocks applied with when, and the
      latency samples;
    - `begins`, `late` and `unplanned` belong to the main loop alone.
    """

    def __init__(
        self,
        gpu: str,
        keys: Sequence[ComputationKey],
        clocks_mhz: Sequence[int],
        submit: SubmitClock,
        *,
        times_s: Sequence[float] | None = None,
        early: EarlyRaise | None = None,
        clock_ns: Callable[[], int] = time.monotonic_ns,
        slack_s: Sequence[float] | None = None,
    ) -> None:
        self.gpu = gpu
        self._order = tuple(keys)
        self._clocks_mhz = tuple(clocks_mhz)
        self._position = {key: i for i, key in enumerate(keys)}
        self._times_ns = None if times_s is None else tuple(int(t * 1e9) for t in times_s)
        self._early = early if self._times_ns is not None else None
        self._run_left_ns, self._after_run_mhz, self._run_last_ns = run_ends(
            self._clocks_mhz, self._times_ns or ()
        )
        self._slack_ns = None if slack_s is None else tuple(int(t * 1e9) for t in slack_s)
        self._clock_ns = clock_ns
        self._submit = submit
        self._requested_mhz: int | None = None  # the last clock submitted
        self.applied_mhz: int | None = None  # the last clock the owner reported applied
        self.retired = False
        self._moves = 0  # begin/end events seen: an early raise is for the move it was scheduled at
        self._begun: tuple[int, int] | None = None  # (position, begun_ns) of the running computation
        self.pace = 1.0  # actual / profiled duration, running mean
        self.begins = 0
        self.clock_changes = 0
        self.skipped = 0
        self.late = 0
        self.unplanned = 0
        self.errors = 0
        self.early_raises = 0
        self.early_lowerings = 0
        self._latencies_ns: deque[int] = deque(maxlen=LATENCY_SAMPLES)
        self._applied_at: deque[tuple[int, int]] = deque(maxlen=APPLIED_HISTORY)  # (applied_ns, clock_mhz)
        self._lock = threading.Lock()  # latency samples and applied clock (owner thread)
        self._move_lock = threading.RLock()  # moves, the requested clock, pace, retired (see the docstring)

    @property
    def computations(self) -> int:
        return len(self._order)

    @property
    def times_s(self) -> tuple[float, ...] | None:
        """Each computation's expected time at its clock (s), when the plan was given them."""
        return None if self._times_ns is None else tuple(t / 1e9 for t in self._times_ns)

    def carried(self) -> tuple[CarriedComputation, ...]:
        """The computations whose begin or end a client may carry (`perseusd.switching.carrying`)."""
        early = self._early
        flags = carried_events(
            self._clocks_mhz,
            self._times_ns if early is not None and self._times_ns is not None else (),
            self._run_left_ns,
            self._after_run_mhz,
            lead_ns=0 if early is None else early.lead_ns(self.gpu),
            lowers_early=self._slack_ns is not None,
        )
        return tuple(
            CarriedComputation(Instruction(instruction), microbatch, chunk, begin, end)
            for (instruction, microbatch, chunk), (begin, end) in zip(self._order, flags, strict=True)
            if begin or end
        )

    def start(self, received_ns: int) -> None:
        """Submit the first computation's clock so the first begin finds it applied."""
        with self._move_lock:
            self.ensure(self._clocks_mhz[0], received_ns)

    def forget_requested(self) -> None:
        """The clock was changed outside the plan (set_clock): submit the next change whatever it is."""
        with self._move_lock:
            self._requested_mhz = None

    def retire(self) -> None:
        """The plan was replaced or dropped: a raise or lowering still on the timer does nothing."""
        with self._move_lock:
            self.retired = True

    def on_begin(self, key: ComputationKey, received_ns: int, begun_ns: int | None = None) -> None:
        """A computation began (`begun_ns`: when, CLOCK_MONOTONIC, by the sender's account)."""
        position = self._position.get(key)
        if position is None:
            self.unplanned += 1
            return
        clock_mhz = self._clocks_mhz[position]
        self.begins += 1
        started_ns = self._trusted(begun_ns)
        if self._clock_at(started_ns) != clock_mhz:
            self.late += 1
        with self._move_lock:
            self._moves += 1
            self.ensure(clock_mhz, received_ns)
            self._begun = (position, started_ns)
            self._schedule_raise(position, started_ns)
            self._schedule_lowering(position, started_ns)

    def on_end(self, key: ComputationKey, received_ns: int, ended_ns: int | None = None) -> None:
        """A computation ended (`ended_ns`: when, CLOCK_MONOTONIC, by the sender's account)."""
        position = self._position.get(key)
        if position is None:
            return
        with self._move_lock:
            self._moves += 1
            self.ensure(self._clocks_mhz[self._following(position)], received_ns)
            self._update_pace(position, self._trusted(ended_ns))

    def _clock_at(self, at_ns: int) -> int | None:
        """The clock applied at `at_ns` (None: none known then)."""
        with self._lock:
            for applied_ns, clock_mhz in reversed(self._applied_at):
                if applied_ns <= at_ns:
                    return clock_mhz
        return None

    def _trusted(self, sent_ns: int | None) -> int:
        """A sender's timestamp clamped to [now - MAX_EVENT_AGE_NS, now] (now when there is none)."""
        now_ns = self._clock_ns()
        return now_ns if sent_ns is None else min(now_ns, max(sent_ns, now_ns - MAX_EVENT_AGE_NS))

    def _update_pace(self, position: int, ended_ns: int) -> None:
        begun, self._begun = self._begun, None
        if self._times_ns is None or begun is None or begun[0] != position or self._times_ns[position] <= 0:
            return
        low, high = PACE_RANGE
        sample = min(high, max(low, (ended_ns - begun[1]) / self._times_ns[position]))
        self.pace += PACE_WEIGHT * (sample - self.pace)

    def _following(self, position: int) -> int:
        return (position + 1) % len(self._order)  # wraps to the next iteration

    def _schedule_raise(self, position: int, started_ns: int) -> None:
        """If the run after this computation's run (consecutive computations at one clock) is planned higher,
        raise `lead` before this run is expected to end, from the computation during which that falls (or
        at once from the run's first, when the run is shorter than `lead`).

        Except that a raise is never submitted before the run's last computation begins when that
        computation alone outlasts the GPU's median clock-set latency (`EarlyRaise.covers`): submitted at its
        begin, the raise acts before it ends (a lock acts within its call: 0-12 ms into a 9-15 ms call on an
        H100), while submitted `lead` (the 90th percentile plus a margin) before its end, during the
        computation before it, it could act before it begins, and the GPU would run it at a clock its plan
        does not name. On the simulated H100 that was a run's last 12-15 ms computation begun at the raised
        clock in 2-5 of 9 iterations (`bench_closed_loop.py`, moe-uneven6x12)."""
        if self._early is None or self._times_ns is None:
            return
        following_mhz = self._after_run_mhz[position]
        if following_mhz <= self._clocks_mhz[position]:
            return
        own_ns = int(self._times_ns[position] * self.pace)
        deadline_ns = (
            started_ns + int(self._run_left_ns[position] * self.pace) - self._early.lead_ns(self.gpu)
        )
        if deadline_ns >= started_ns + own_ns:
            return  # falls during a later computation of the run: scheduled when that one begins
        last_ns = int(self._run_last_ns[position] * self.pace)
        if self._run_left_ns[position] > self._times_ns[position] and self._early.covers(self.gpu, last_ns):
            return  # held for the run's last computation's begin (`_schedule_raise`'s docstring)
        move = self._moves
        self._early.timer.call_at(deadline_ns, partial(self._switch_early, move, following_mhz, raising=True))

    def _schedule_lowering(self, position: int, started_ns: int) -> None:
        """If this computation ends its run and the next run is planned lower, lower `lead` before its
        expected end, or as much of it as the slack allows (running that long at the lower clock delays it by
        about as long; `LOWER_SLACK_FACTOR`), so that the lowered run begins at its clock (a lowering that
        waits for the end event acts 0-12 ms into the next computation on an H100; one submitted part of the
        lead before the end acts in time as often as that part covers the call's act time)."""
        if self._early is None or self._times_ns is None or self._slack_ns is None:
            return
        following_mhz = self._clocks_mhz[self._following(position)]
        if following_mhz >= self._clocks_mhz[position]:
            return
        expected_ns = int(self._times_ns[position] * self.pace)
        slack_ns = self._slack_ns[position]
        lead_ns = min(self._early.lead_ns(self.gpu), expected_ns, slack_ns // LOWER_SLACK_FACTOR)
        if lead_ns < MIN_LOWER_LEAD_NS:
            return
        move = self._moves
        lower = partial(self._switch_early, move, following_mhz, raising=False)
        self._early.timer.call_at(max(started_ns, started_ns + expected_ns - lead_ns), lower)

    def _switch_early(self, move: int, clock_mhz: int, *, raising: bool) -> None:
        """Timer thread: submit `clock_mhz` unless an event arrived since the raise or lowering was
        scheduled."""
        with self._move_lock:
            if self.retired or move != self._moves:
                return
            if raising:
                self.early_raises += 1
            else:
                self.early_lowerings += 1
            self.ensure(clock_mhz, self._clock_ns())

    def ensure(self, clock_mhz: int, received_ns: int) -> None:
        """Submit `clock_mhz` unless it is already the clock requested; never waits (call under
        `_move_lock`)."""
        if self._requested_mhz == clock_mhz:
            self.skipped += 1
            return
        self._requested_mhz = clock_mhz
        self.clock_changes += 1
        future = self._submit(self.gpu, clock_mhz)
        future.add_done_callback(lambda done: self._applied(done, received_ns))

    def _applied(self, future: Future[int], received_ns: int) -> None:
        """Done-callback, on the owner thread (or here when the owner had stopped)."""
        if future.cancelled() or future.exception() is not None:
            with self._move_lock:
                self.errors += 1
                self._requested_mhz = None  # unknown: the next change is submitted whatever it is
            return
        elapsed_ns = self._clock_ns() - received_ns
        with self._lock:
            self.applied_mhz = future.result()
            self._applied_at.append((received_ns + int(ACT_FRACTION * elapsed_ns), self.applied_mhz))
            self._latencies_ns.append(elapsed_ns)

    def stats(self) -> PlanStats:
        with self._lock:
            samples_ms = [ns / 1e6 for ns in self._latencies_ns]
        return project(
            PlanStats,
            self,
            event_to_clock_p50_ms=_round(statistics.median(samples_ms)) if samples_ms else None,
            event_to_clock_p99_ms=_round(percentile(samples_ms, 0.99)) if samples_ms else None,
        )


def run_ends(clocks_mhz: Sequence[int], times_ns: Sequence[int]) -> tuple[list[int], list[int], list[int]]:
    """For each computation: the expected time (ns) from its begin to the end of its run (the consecutive
    computations at its clock, cyclic), the clock planned after that run (its own when all are equal), and
    the expected time (ns) of the run's last computation (0 without times or when all are equal)."""
    n = len(clocks_mhz)
    left_ns = [0] * n
    after_mhz = list(clocks_mhz)
    last_ns = [0] * n
    if not times_ns or len(set(clocks_mhz)) < 2:
        return left_ns, after_mhz, last_ns
    last = next(i for i in range(n) if clocks_mhz[i] != clocks_mhz[(i + 1) % n])  # a run's last computation
    for step in range(n):  # backwards round the cycle from that run's last computation
        i = (last - step) % n
        following = (i + 1) % n
        if clocks_mhz[following] != clocks_mhz[i]:
            left_ns[i], after_mhz[i], last_ns[i] = times_ns[i], clocks_mhz[following], times_ns[i]
        else:
            left_ns[i], after_mhz[i] = times_ns[i] + left_ns[following], after_mhz[following]
            last_ns[i] = last_ns[following]
    return left_ns, after_mhz, last_ns


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank `q` quantile of non-empty `values`."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _round(value_ms: float) -> float:
    return round(value_ms, 4)


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
