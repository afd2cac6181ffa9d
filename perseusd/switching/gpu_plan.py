"""One GPU's clock plan: on a computation's end, the next computation's clock is submitted at once.

No transport and no waiting: a clock change is submitted to the GPU's owner thread and a done-callback (run on
that thread) records the clock applied, the event -> applied latency and errors. Everything here is counted;
nothing is logged per event.

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

The plan book (`perseusd.switching.plans`) holds a leased GPU's plan and gives it the GPU's events.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from functools import partial

from perseus_client.protocol import CarriedComputation, Instruction, PlanStats

from perseusd.records import project
from perseusd.switching.carrying import carried_events
from perseusd.switching.early_changes import EarlyRaise
from perseusd.switching.plan_entries import ComputationKey, run_ends

SubmitClock = Callable[[str, int], "Future[int]"]
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
LOWER_SLACK_FACTOR = 2
"""An early lowering needs this many times the time it runs low in slack: the slack is computed from the
profile's times, and real computations run a little longer (event overhead, a busy host)."""
MIN_LOWER_LEAD_NS = 1_000_000
"""A lowering the slack allows less lead than this waits for the end event (it would act after it anyway)."""


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


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank `q` quantile of non-empty `values`."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _round(value_ms: float) -> float:
    return round(value_ms, 4)
