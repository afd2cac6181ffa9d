"""What a training job does, driven from a test through the real client: join a daemon (import the profile,
claim the GPUs, register one stage per GPU) and run 1F1B iterations whose computations do no work."""

from __future__ import annotations

from perseus_client import PerseusClient
from perseus_client.protocol import JobInfo

from perseusd.planner.dag import build_dag
from perseusd.planner.profile import Profile
from perseusd.planner.profile_csv import profile_to_csv
from tests.support.polling import wait_until
from tests.support.synthetic import synthetic_profile

WAIT_S = 60.0
"""How long `train_job`, and the end-to-end tests of the job it trains, wait for the daemon at most (a bound,
not a timing assertion)."""

STAGES, MICROBATCHES, ITERATIONS = 2, 4, 3
"""The end-to-end tests' job on a daemon of `STAGES` simulated GPUs: one pipeline of a stage per GPU, its
microbatches, and the iterations `train_job` runs (with `two_stage_profile`)."""


def two_stage_profile() -> Profile:
    """Two imbalanced stages at clocks the simulated A100 supports (1410 down to 960 MHz, 90 MHz apart)."""
    return synthetic_profile(STAGES, seed=3, clocks_mhz=tuple(range(1410, 885, -90)))


def daemon_gpus(client: PerseusClient) -> list[str]:
    """The UUIDs of every GPU of the daemon `client` is connected to, in the daemon's order."""
    assert client.daemon_info is not None
    return [gpu.uuid for gpu in client.daemon_info.gpus]


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


def train_job(
    client: PerseusClient, profile: Profile, num_microbatches: int, iterations: int, p_block_w: float = 80.0
) -> list[str]:
    """The client's one job trained: a pipeline of one stage per GPU of the daemon joined with `profile`
    (`join_pipeline`), its plan running, `iterations` iterations run and counted by the daemon (each wait
    bounded by `WAIT_S`). Returns the GPUs, stage 0's first."""
    gpus = daemon_gpus(client)
    join_pipeline(client, gpus, profile, num_microbatches, p_block_w)
    wait_until(lambda: _job(client).state in ("running", "failed"), WAIT_S, "the job to run")
    assert _job(client).state == "running", client.jobs()
    for step in range(iterations):
        run_iteration(client, gpus, step, num_microbatches)
    wait_until(lambda: _job(client).pipelines[0].iterations >= iterations, WAIT_S, "the iterations")
    return gpus


def _job(client: PerseusClient) -> JobInfo:
    return client.jobs().jobs[0]
