"""Do no harm, for a job: under `no_slowdown`, a stage whose plan would not measurably save runs one clock.

The rule and its figures are `perseusd.planner.no_harm`; this module applies it to a job's deployed point:
the stages judged not worth their plan run their safe clock throughout (`Job.plan_entries` gives them a
one-clock plan at that point), the deployed point's predicted energy is the corrected one, and `plan_note`
says which stages and why (`perseusctl jobs`, the log). The profile's per-option energy errors come from
online profiling (`energy_rel_errors`); an imported or cached profile has none, so only clock changes count.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping, Sequence

from perseusd.jobs.job import Job
from perseusd.planner.dag import Instruction
from perseusd.planner.no_harm import OptionKey, StageVerdict, judge_stages
from perseusd.planner.policy import REGISTRY
from perseusd.profiling.estimator import OptionEstimate

logger = logging.getLogger(__name__)


def energy_rel_errors(kept: Mapping[str, Sequence[OptionEstimate]]) -> dict[OptionKey, float]:
    """Per option (profile stage, instruction, clock), the relative standard error of its energy merged over
    the GPUs that measured it (the count-weighted mean's, from each GPU's own)."""
    merged: dict[OptionKey, list[OptionEstimate]] = {}
    for estimates in kept.values():
        for est in estimates:
            key = (int(est.key[0]), Instruction(est.key[1]), int(est.clock_mhz))
            merged.setdefault(key, []).append(est)
    errors = {}
    for key, ests in merged.items():
        total = sum(e.count for e in ests)
        if total > 0:
            errors[key] = math.sqrt(sum((e.count / total * e.energy_rel_err) ** 2 for e in ests))
    return errors


def apply_no_harm(job: Job, latency_s: float) -> list[StageVerdict]:
    """Judge the stages of the job's deployed point; those that do not keep their plan run their safe clock.
    Returns the verdicts (empty when the rule does not apply)."""
    job.safe_clocks, job.safe_for_index, job.plan_note = {}, None, ""
    deployed = job.deployed
    if deployed is None or not REGISTRY[job.policy.name].no_harm or job.profile is None:
        return []
    placed = job.node_clocks(deployed.point.index)
    if placed is None:
        return []
    dag, clocks = placed
    try:
        verdicts = judge_stages(
            dag, job.profile, clocks, job.p_block_w, deployed.point.time_s, job.energy_rel_err, latency_s
        )
    except ValueError as exc:
        logger.warning("job %s: cannot judge its plan's stages (%s); the plan runs as solved", job.name, exc)
        return []
    safe = [v for v in verdicts if not v.keep_plan]
    if not safe:
        return verdicts
    job.safe_clocks = {v.stage: v.safe_clock_mhz for v in safe}
    job.safe_for_index = deployed.point.index
    job.plan_note = "; ".join(v.reason() for v in safe)
    corrected_j = deployed.point.energy_j + sum(v.saving_j for v in safe)
    job.deployed = dataclasses.replace(
        deployed, point=dataclasses.replace(deployed.point, energy_j=corrected_j)
    )
    logger.info("job %s: %s", job.name, job.plan_note)
    return verdicts
