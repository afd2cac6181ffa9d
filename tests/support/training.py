"""What a training job does, driven from a test through the real client: join a daemon (import the profile,
claim the GPUs, register one stage per GPU) and run 1F1B iterations whose computations do no work."""

from __future__ import annotations

from perseus_client import PerseusClient

from perseusd.planner.dag import build_dag
from perseusd.planner.profile import Profile
from perseusd.planner.profile_csv import profile_to_csv


def join_pipeline(
    client: PerseusClient, gpus: list[str], profile: Profile, num_microbatches: int, p_block_w: float = 80.0
) -> None:
    """Import `profile`, claim `gpus` and register stage i of a 1F1B pipeline on `gpus[i]`."""
    client.profile_import(profile_to_csv(profile), source="synthetic", p_block_w=p_block_w)
    client.claim(gpus)
    for stage, gpu in enumerate(gpus):
        client.register(gpu, stage=stage, num_stages=len(gpus), num_microbatches=num_microbatches)


def run_iteration(client: PerseusClient, gpus: list[str], step: int, num_microbatches: int) -> None:
    """Iteration `step` of the pipeline on `gpus`: each stage's computations in 1F1B order, one stage after
    the other."""
    dag = build_dag("1f1b", len(gpus), num_microbatches, 1)
    for stage, gpu in enumerate(gpus):
        with client.step(gpu, step):
            for node in dag.stage_orders[stage]:
                comp = dag.computations[node]
                with client.computation(gpu, stage, comp.instruction.value, comp.microbatch):
                    pass
