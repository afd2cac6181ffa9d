"""Check a run against the daemon before any process starts, and lay the job out on its simulated GPUs.

Every mistake a user can make on the command line ends here with a message that says what to do (exit 2):
a schedule that cannot be built, a profile that cannot be read or does not cover the pipeline's stages, a
daemon that does not run simulated GPUs or has too few, a profile that is not the simulated GPUs' model
(the simulated GPUs always draw their model's costs, so a different profile would describe another job).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from perseus_client.client import PerseusClient
from perseus_client.protocol import StatusReply

from perseusd.emulate.topology import PipelineShape
from perseusd.errors import PerseusError, PlanningError, ProfileError
from perseusd.gpu.errors import GpuInvalidArgumentError
from perseusd.gpu.sim_boards import Board, load_board
from perseusd.gpu.sim_shared import StateMap, state_path
from perseusd.planner.baselines import all_max
from perseusd.planner.bundled import load_profile as read_named_profile
from perseusd.planner.dag import build_dag
from perseusd.planner.profile import Profile
from perseusd.planner.profile_csv import profile_to_csv
from perseusd.workload.sim_costs import check_profile_fits


class UsageError(PerseusError):
    """The command line does not fit the daemon or the profile (exit 2)."""


class EmulateError(PerseusError):
    """The run failed (exit 1)."""


@dataclass(frozen=True)
class ModelPrediction:
    """What the profile predicts for one iteration of all pipelines at all-max clocks (time-scaled)."""

    iteration_time_s: float
    energy_per_iteration_j: float


PLACEMENTS = ("pipelines", "stages")
"""How stages go to daemons: whole pipelines in contiguous blocks, or stage-major (stage s of every
pipeline together, the stages spread over the daemons: each pipeline spans nodes)."""


@dataclass(frozen=True)
class JobLayout:
    """The checked job: its pipelines' shape, daemons and GPUs, the simulated GPUs' board and the profile."""

    shape: PipelineShape
    stage_gpus: tuple[tuple[tuple[str, ...], ...], ...]
    """stage_gpus[pipeline][stage]: the simulated GPUs (UUIDs) that run the stage together (tensor parallel:
    more than one; the first leads)."""
    stage_daemons: tuple[tuple[int, ...], ...]
    """stage_daemons[pipeline][stage]: the index (in `runtime_dirs`) of the daemon that runs the stage."""
    runtime_dirs: tuple[Path, ...]
    board: Board
    profile: Profile
    all_max: ModelPrediction
    real_stage: int | None = None
    """Pipeline 0's stage that runs on the daemon's real GPU (`--real-stage`; a `--backend mixed` daemon)."""
    real_simulated: bool = False
    """The real stage's GPU is a simulated board standing in for a real one (it runs the profile's costs)."""

    @property
    def real_gpu(self) -> str | None:
        return None if self.real_stage is None else self.stage_gpus[0][self.real_stage][0]

    @property
    def profile_source(self) -> str:
        return self.profile.source

    @property
    def num_pipelines(self) -> int:
        return len(self.stage_gpus)

    @property
    def tensor_parallel(self) -> int:
        return len(self.stage_gpus[0][0])

    @property
    def gpus(self) -> tuple[tuple[str, ...], ...]:
        """gpus[pipeline]: every GPU of the pipeline, stage by stage."""
        return tuple(tuple(g for stage in pipeline for g in stage) for pipeline in self.stage_gpus)

    @property
    def daemons(self) -> tuple[int, ...]:
        """daemons[pipeline]: the daemon of the pipeline's first stage (its only one unless stages spread)."""
        return tuple(stages[0] for stages in self.stage_daemons)

    @property
    def spans(self) -> bool:
        """Whether a pipeline's stages run on several daemons."""
        return any(len(set(stages)) > 1 for stages in self.stage_daemons)

    @property
    def all_gpus(self) -> tuple[str, ...]:
        return tuple(gpu for pipeline in self.gpus for gpu in pipeline)

    @property
    def counter_keys(self) -> tuple[tuple[str, ...], ...]:
        """counter_keys[pipeline]: its GPUs' names in counter samples (unique across daemons)."""
        n = len(self.runtime_dirs)
        return tuple(
            tuple(
                counter_key(self.stage_daemons[p][s], gpu, n) for s, gpus in enumerate(stages) for gpu in gpus
            )
            for p, stages in enumerate(self.stage_gpus)
        )

    @property
    def all_counter_keys(self) -> tuple[str, ...]:
        return tuple(key for pipeline in self.counter_keys for key in pipeline)

    @property
    def max_clock_mhz(self) -> int:
        return self.board.max_clock_mhz

    def runtime_dir(self, pipeline: int, stage: int) -> Path:
        """The runtime directory of the daemon that runs the stage."""
        return self.runtime_dirs[self.stage_daemons[pipeline][stage]]

    def sim_dir(self, pipeline: int, stage: int) -> Path:
        """The sim directory of the daemon that runs the stage."""
        return self.runtime_dir(pipeline, stage) / "sim"


def counter_key(daemon: int, uuid: str, num_daemons: int) -> str:
    """A GPU's name in counter samples: its UUID, prefixed with its daemon ("d1/GPU-...") when there are
    several (simulated GPUs of different daemons have the same UUIDs)."""
    return uuid if num_daemons == 1 else f"d{daemon}/{uuid}"


def daemon_of(pipeline: int, pipelines: int, daemons: int) -> int:
    """Pipelines go to the daemons in contiguous blocks."""
    return pipeline * daemons // pipelines


def place_stages(placement: str, pipelines: int, stages: int, daemons: int) -> tuple[tuple[int, ...], ...]:
    """Each stage's daemon: `pipelines`, whole pipelines in contiguous blocks; `stages`, stage-major (stage s
    of every pipeline next to each other, then the next stage), cut into contiguous blocks, so that each
    pipeline spans the daemons as Megatron-LM lays pipeline stages out over nodes."""
    if placement == "pipelines":
        return tuple((daemon_of(p, pipelines, daemons),) * stages for p in range(pipelines))
    total = pipelines * stages
    return tuple(
        tuple((s * pipelines + p) * daemons // total for s in range(stages)) for p in range(pipelines)
    )


def default_placement(pipelines: int, daemons: int) -> str:
    """Whole pipelines per daemon when there are enough pipelines, else the stages spread."""
    return "pipelines" if daemons <= pipelines else "stages"


def check_shape(shape: PipelineShape) -> None:
    """The schedule can be built for these stages, microbatches and chunks."""
    schedule = "1f1b" if shape.schedule == "observed" else shape.schedule
    if shape.schedule == "interleaved" and shape.num_chunks < 2:
        raise UsageError("the interleaved schedule needs --chunks 2 or more")
    try:
        build_dag(schedule, shape.num_stages, shape.num_microbatches, shape.num_chunks)
    except PlanningError as exc:
        raise UsageError(str(exc)) from None


def load_profile(spec: str, shape: PipelineShape) -> Profile:
    """`--profile` for this schedule (`perseusd.planner.bundled.load_profile`); UsageError if unusable."""
    try:
        return read_named_profile(spec, shape.schedule)[0]
    except (ProfileError, PlanningError) as exc:
        raise UsageError(str(exc)) from None


def lay_out(
    clients: Sequence[PerseusClient],
    shape: PipelineShape,
    pipelines: int,
    profile: Profile,
    time_scale: float,
    real_stage: int | None = None,
    *,
    tensor_parallel: int = 1,
    placement: str | None = None,
) -> JobLayout:
    """Check the run against every daemon (sim GPUs, their board, how many are free) and pick the GPUs.

    `shape` passed `check_shape` and `profile` was loaded (both before connecting). `placement`: see
    `place_stages` (None: `default_placement`). With `real_stage`, pipeline 0's stage `real_stage` gets the
    first daemon's first GPU, the real one of a `--backend mixed` daemon (or the simulated board standing in
    for it): that stage must be placed on the first daemon, with one GPU.
    """
    placement = placement or default_placement(pipelines, len(clients))
    limit = pipelines if placement == "pipelines" else pipelines * shape.num_stages
    if len(clients) > limit:
        what = f"{pipelines} pipeline(s)" if placement == "pipelines" else f"{limit} stages"
        raise UsageError(f"{len(clients)} daemons (--runtime-dir) but only {what} to place on them")
    stage_daemons = place_stages(placement, pipelines, shape.num_stages, len(clients))
    statuses = [_visible(client, client.status()) for client in clients]
    real = _real_slot(clients[0].runtime_dir / "sim", statuses[0], shape, real_stage, time_scale)
    if real is not None:
        if real_stage is None or stage_daemons[0][real_stage] != 0 or tensor_parallel != 1:
            raise UsageError("--real-stage needs its stage on the first daemon (--runtime-dir), one GPU each")
        if shape.split_backward:
            raise UsageError("--real-stage runs whole backwards: choose a schedule that does not split them")
        statuses[0] = dataclasses.replace(statuses[0], gpus=statuses[0].gpus[1:])
    models = {
        _sim_model_name(c.runtime_dir / "sim", status) for c, status in zip(clients, statuses, strict=True)
    }
    if len(models) != 1:
        raise UsageError(f"the daemons' simulated GPUs are of different boards: {sorted(models)}")
    board = load_board(models.pop())
    _check_profile(profile, board, shape)
    placed = [d for stages in stage_daemons for d in stages]
    taken = int(real is not None)  # the real GPU, first daemon
    free = [
        iter(
            _free_gpus(
                status, client.runtime_dir, placed.count(d) * tensor_parallel - taken * (d == 0), len(clients)
            )
        )
        for d, (client, status) in enumerate(zip(clients, statuses, strict=True))
    ]
    gpus = tuple(
        tuple(
            (real.uuid,)
            if real is not None and (p, s) == (0, real_stage)
            else tuple(next(free[d]) for _ in range(tensor_parallel))
            for s, d in enumerate(stages)
        )
        for p, stages in enumerate(stage_daemons)
    )
    return JobLayout(
        shape,
        gpus,
        stage_daemons,
        tuple(client.runtime_dir for client in clients),
        board,
        profile,
        _predict(shape, pipelines * tensor_parallel, profile, board, time_scale),
        real_stage=None if real is None else real_stage,
        real_simulated=real is not None and real.simulated,
    )


def _visible(client: PerseusClient, status: StatusReply) -> StatusReply:
    """The status with only the GPUs this process may claim (its container's, in its order)."""
    visible = client.daemon_info.visible_gpus if client.daemon_info is not None else None
    if visible is None:
        return status
    rows = {gpu.uuid: gpu for gpu in status.gpus}
    return dataclasses.replace(status, gpus=tuple(rows[uuid] for uuid in visible if uuid in rows))


@dataclass(frozen=True)
class _RealSlot:
    uuid: str
    simulated: bool


def _real_slot(
    sim_dir: Path, status: StatusReply, shape: PipelineShape, real_stage: int | None, time_scale: float
) -> _RealSlot | None:
    """The first GPU of the first daemon, for the real stage: free, and really real unless a stand-in."""
    if real_stage is None:
        return None
    if not 0 <= real_stage < shape.num_stages or shape.num_chunks != 1:
        raise UsageError(
            f"--real-stage {real_stage} is not a stage of the pipeline (0..{shape.num_stages - 1}, one chunk)"
        )
    if not status.gpus:
        raise UsageError("the daemon has no GPU for the real stage")
    gpu = status.gpus[0]
    if gpu.lease is not None:
        raise EmulateError(f"the real GPU {gpu.uuid} is leased (see `perseusctl status`)")
    simulated = state_path(sim_dir, gpu.uuid).exists()
    if not simulated and time_scale != 1.0:
        raise UsageError("a real stage runs at the GPU's own pace: --time-scale must be 1")
    return _RealSlot(gpu.uuid, simulated)


def _free_gpus(status: StatusReply, runtime_dir: Path, needed: int, daemons: int) -> list[str]:
    """The daemon's free GPUs; it must have `needed` for the stages it runs (the real GPU not counted)."""
    where = "" if daemons == 1 else f" at {runtime_dir}"
    if len(status.gpus) < needed:
        raise UsageError(
            f"the stages placed on the daemon{where} need {needed} simulated GPUs, it has "
            f"{len(status.gpus)}: start perseusd with --sim-gpus {needed} or more"
        )
    free = [gpu.uuid for gpu in status.gpus if gpu.lease is None]
    if len(free) < needed:
        raise EmulateError(
            f"{needed} GPUs needed but only {len(free)} of {len(status.gpus)} are free{where} "
            "(others are leased: see `perseusctl status`)"
        )
    return free


def _sim_model_name(sim_dir: Path, status: StatusReply) -> str:
    """The board of the daemon's simulated GPUs, read from their shared files."""
    models: set[str] = set()
    for gpu in status.gpus:
        try:
            state = StateMap(state_path(sim_dir, gpu.uuid), writable=False)
        except (OSError, ValueError):
            raise UsageError(
                f"GPU {gpu.uuid} is not simulated (no {state_path(sim_dir, gpu.uuid)}): "
                "perseus-emulate needs perseusd started with --backend sim"
            ) from None
        models.add(state.header.model)
        state.close()
    if len(models) != 1:
        raise UsageError(f"the daemon's simulated GPUs are of {len(models)} boards: {sorted(models)}")
    return models.pop()


def _check_profile(profile: Profile, board: Board, shape: PipelineShape) -> None:
    try:
        check_profile_fits(profile, board)
    except GpuInvalidArgumentError as exc:
        raise UsageError(
            f"{exc.detail}: start perseusd with --sim-model naming a board that has them, or give a profile "
            "measured at the board's clocks"
        ) from None
    if profile.num_stages < shape.num_virtual_stages:
        raise UsageError(
            f"profile {profile.source} has {profile.num_stages} stages, but {shape.num_stages} stages x "
            f"{shape.num_chunks} chunks need {shape.num_virtual_stages}"
        )


def scaled_profile_csv(profile: Profile, shape: PipelineShape, time_scale: float) -> str:
    """The profile of what the stages run: the pipeline's stages, times and energies scaled like theirs."""
    scaled = profile.scaled(time_scale, time_scale)
    needed = [m for m in scaled.measurements if m.stage < shape.num_virtual_stages]
    return profile_to_csv(Profile.from_measurements(needed, profile.source))


def _predict(
    shape: PipelineShape, copies: int, profile: Profile, board: Board, time_scale: float
) -> ModelPrediction:
    """All-max by the profile: one pipeline's time, `copies` pipelines' energy (x tensor-parallel GPUs)."""
    schedule = "1f1b" if shape.schedule == "observed" else shape.schedule
    dag = build_dag(schedule, shape.num_stages, shape.num_microbatches, shape.num_chunks)
    point = all_max(dag, profile.scaled(time_scale, time_scale), board.blocking_power_w)
    return ModelPrediction(point.time_s, point.energy_j * copies)
