"""What one event of a leased GPU records on its job's slot: the order learner, the profiling run's
measurements (`jobs.profiling_run`) and, for a running job, the straggler response (`jobs.response`).

The daemon's hot path: the job manager (`perseusd.jobs.manager`) finds the event's job and slot and calls
`record_event`; nothing here waits, and only an iteration's end can move the job on.
"""

from __future__ import annotations

from perseus_client.protocol import ComputationBegin, ComputationEnd, Message, StepBegin, StepEnd

from perseusd.jobs.job import Job
from perseusd.jobs.profiling_run import ProfilingRun
from perseusd.jobs.response import StragglerResponse
from perseusd.jobs.slot import StageSlot
from perseusd.jobs.states import RUNNING


def record_event(
    job: Job, slot: StageSlot, message: Message, profiling: ProfilingRun, response: StragglerResponse
) -> bool:
    """Record one event of `slot`'s GPU; at an iteration boundary, submit the next profiling clock. True when
    the event ended a profiling iteration (the manager then moves the job forward)."""
    if isinstance(message, ComputationBegin):
        slot.learner.computation_begin(message.instruction, message.microbatch, message.chunk)
        if slot.sweep is not None and slot.in_step and slot.iteration_clock_mhz is not None:
            slot.open_since_ns[(message.instruction, message.microbatch, message.chunk)] = (
                message.timestamp_ns
            )
            profiling.read_capping(slot)
    elif isinstance(message, ComputationEnd):
        profiling.computation_end(slot, message)
        if job.state == RUNNING:
            response.computation_end(job, slot, message.timestamp_ns)
    elif isinstance(message, StepBegin):
        slot.step_begin(message.timestamp_ns)
        slot.current_step = message.step
        slot.learner.step_begin()
        if job.state == RUNNING:
            response.step_begin(job, slot, message.step, message.timestamp_ns)
    elif isinstance(message, StepEnd):
        slot.in_step = False
        slot.steps_done += 1
        slot.learner.step_end()
        if job.state == RUNNING:
            slot.running_steps += 1
            response.step_end(job, slot, message.step)
        return profiling.iteration_done(job, slot)
    return False
