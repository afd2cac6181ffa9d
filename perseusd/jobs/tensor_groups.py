"""A stage run by several GPUs together (tensor and context parallel): one profile, the GPUs' energy summed.

The GPUs of one stage compute in step (they meet at every layer's collective), so they must run one clock:
the first GPU of the stage to register *leads*: its sweep chooses each profiling iteration's clock, the
others follow it (they are set the same clock at the same moment) and only the lead's computations are
timed. A stage's energy is the sum of its GPUs': while it profiles, every GPU's counter is sampled, and each
option the lead measured is scaled by the stage's power over the lead's (about the number of GPUs when they
draw alike), and so is its blocking power. So a stage of 8 GPUs profiles in as many iterations as one of 1.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from perseusd.jobs.metering import counter_power_w
from perseusd.jobs.slot import StageSlot
from perseusd.profiling.trace import CounterSample

Samples = Callable[[str, int], list[CounterSample]]


def power_ratio(lead: StageSlot, follower: StageSlot, samples: Samples) -> float:
    """The follower's mean power over the lead's while the stage profiled (1 when either is unknown)."""
    since_ns = max(lead.profiling_since_ns, follower.profiling_since_ns)
    lead_w = counter_power_w(samples(lead.gpu, since_ns))
    follower_w = counter_power_w(samples(follower.gpu, since_ns))
    if lead_w is None or follower_w is None or lead_w <= 0:
        return 1.0
    return follower_w / lead_w


def stage_scale(lead: StageSlot, followers: Sequence[StageSlot], samples: Samples) -> float:
    """The stage's energy per joule of its lead's: one plus each follower's power ratio."""
    return 1.0 + sum(power_ratio(lead, follower, samples) for follower in followers)


def follow(lead: StageSlot, follower: StageSlot, now_ns: int) -> None:
    """`follower` takes `lead`'s clocks from now on (it is timed no more: the lead is)."""
    follower.group_lead = lead.gpu
    follower.sweep = None
    follower.profiling_since_ns = now_ns


def finish_following(lead: StageSlot, followers: Sequence[StageSlot], samples: Samples) -> None:
    """Profiling ended: each follower's all-max energy per iteration is the lead's times its power ratio."""
    for follower in followers:
        if lead.all_max_energy_j is not None:
            follower.all_max_energy_j = lead.all_max_energy_j * power_ratio(lead, follower, samples)
        follower.all_max_iteration_s = lead.all_max_iteration_s
        follower.group_lead = None
