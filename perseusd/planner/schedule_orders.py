"""Per-stage orders of the named pipeline schedules: which computations each stage runs, in order.

A step is (instruction, microbatch, chunk), chunk being the model chunk on the stage (0 for the first of its
model stages). The orders are those the frameworks run: Megatron-LM's 1F1B, GPipe and interleaved 1F1B, and
`torch.distributed.pipelining`'s zero-bubble schedules (`ScheduleInterleavedZeroBubble`,
`ScheduleZBVZeroBubble`, torch 2.13), whose backwards are split into the input gradient (I), which the
previous stage waits for, and the weight gradient (W), which only the end of the iteration waits for.
Which schedule is which, and its rules, is `perseusd.planner.schedules`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from perseus_client.message import Instruction

F = Instruction.FORWARD
B = Instruction.BACKWARD
I = Instruction.BACKWARD_INPUT  # noqa: E741 (torch's and the paper's letter)
W = Instruction.BACKWARD_WEIGHT

ScheduleStep = tuple[Instruction, int, int]
"""One entry of a per-stage order: (instruction, microbatch, chunk)."""


def one_f_one_b_order(num_stages: int, num_microbatches: int, stage: int) -> list[ScheduleStep]:
    """Synchronous 1F1B on one stage: min(S - s, M) warm-up forwards, alternate B and F, drain backwards."""
    warmup = min(num_stages - stage, num_microbatches)
    order: list[ScheduleStep] = [(F, j, 0) for j in range(warmup)]
    next_forward = warmup
    for j in range(num_microbatches):
        order.append((B, j, 0))
        if next_forward < num_microbatches:
            order.append((F, next_forward, 0))
            next_forward += 1
    return order


def gpipe_order(num_microbatches: int) -> list[ScheduleStep]:
    """GPipe on one stage: every forward, then every backward, both in microbatch order."""
    return [(F, j, 0) for j in range(num_microbatches)] + [(B, j, 0) for j in range(num_microbatches)]


def interleaved_order(
    num_stages: int, num_microbatches: int, num_chunks: int, stage: int
) -> list[ScheduleStep]:
    """Interleaved 1F1B (Megatron-LM) on one stage with `num_chunks` model chunks per stage.

    Microbatches go in groups of S: the k-th forward of a stage runs chunk (k // S) % V of microbatch
    (k // (S V)) S + k % S; backwards use the chunks in reverse. Warm-up is (S - s - 1) 2 + (V - 1) S
    forwards, capped at M V. M must be a multiple of S.
    """
    s_count, v_count, m_count = num_stages, num_chunks, num_microbatches
    total = m_count * v_count

    def step(k: int, forward: bool) -> ScheduleStep:
        group = k // (s_count * v_count)
        chunk = (k // s_count) % v_count
        if not forward:
            chunk = v_count - 1 - chunk
        return (F if forward else B, group * s_count + k % s_count, chunk)

    warmup = min((s_count - stage - 1) * 2 + (v_count - 1) * s_count, total)
    order = [step(k, True) for k in range(warmup)]
    for k in range(total - warmup):
        order.append(step(warmup + k, True))
        order.append(step(k, False))
    order.extend(step(k, False) for k in range(total - warmup, total))
    return order


def zero_bubble_rounds(num_stages: int, num_microbatches: int) -> int:
    """Rounds of torch's interleaved schedules: M // S at least 1 (M must be a multiple of it)."""
    return max(1, num_microbatches // num_stages)


def interleaved_zero_bubble_order(
    num_stages: int, num_microbatches: int, num_chunks: int, stage: int
) -> list[ScheduleStep]:
    """torch's `ScheduleInterleavedZeroBubble` (ZB1P) on one stage: interleaved 1F1B whose backwards are
    split, each stage s delaying its weight gradients by s backwards (they fill the cool-down's bubbles).

    Warm-up is (V - 1) M' + (S - 1 - s) forwards (M' = M / rounds microbatches per round), capped at M V.
    """
    per_round = num_microbatches // zero_bubble_rounds(num_stages, num_microbatches)
    total = num_microbatches * num_chunks
    warmup = min((num_chunks - 1) * per_round + num_stages - 1 - stage, total)

    def forward_chunk(op: int) -> int:
        return (op // per_round) % num_chunks

    def backward_chunk(op: int) -> int:
        return num_chunks - 1 - ((op - warmup) // per_round) % num_chunks

    return _split_backward_rank_ops(total, warmup, forward_chunk, backward_chunk, delay=stage)


def _split_backward_rank_ops(
    total: int,
    warmup: int,
    forward_chunk: Callable[[int], int],
    backward_chunk: Callable[[int], int],
    delay: int,
) -> list[ScheduleStep]:
    """torch's `_get_1f1b_rank_ops` with `enable_zero_bubble`, without its idle slots: `warmup` forwards,
    then forward + input gradient per op, then input gradients; each weight gradient follows its input
    gradient `delay` backwards later, the rest at the end, in the order of their input gradients."""
    next_microbatch: dict[tuple[Instruction, int], int] = defaultdict(int)
    order: list[ScheduleStep] = []
    backward_ops: list[int] = []
    weights = 0

    def add(instruction: Instruction, chunk: int) -> None:
        microbatch = next_microbatch[instruction, chunk]
        next_microbatch[instruction, chunk] = microbatch + 1
        order.append((instruction, microbatch, chunk))

    for op in range(total + warmup):
        if op < total:
            add(F, forward_chunk(op))
        if op >= warmup:
            add(I, backward_chunk(op))
            backward_ops.append(op)
            if op - warmup >= delay:
                add(W, backward_chunk(backward_ops[weights]))
                weights += 1
    for op in backward_ops[weights:]:
        add(W, backward_chunk(op))
    return order


def zbv_order(num_stages: int, num_microbatches: int, stage: int) -> list[ScheduleStep]:
    """torch's `ScheduleZBVZeroBubble` on one stage: two model chunks in a V (stage s holds model stages s,
    chunk 0, and 2 S - 1 - s, chunk 1), split backwards, weight gradients filling the bubbles."""
    s_count, rank = num_stages, stage
    n_micro = max(2 * s_count - 1, num_microbatches)
    counts: dict[tuple[Instruction, int], int] = defaultdict(int)
    order: list[ScheduleStep] = []

    def add(instruction: Instruction, chunk: int, microbatch: int | None = None) -> None:
        if microbatch is None:
            microbatch = counts[instruction, chunk]
            counts[instruction, chunk] = microbatch + 1
        order.append((instruction, microbatch, chunk))

    for _ in range(2 * (s_count - rank) - 1):
        add(F, 0)
    for _ in range(rank):
        add(F, 1)
        add(F, 0)
    for _ in range(s_count - rank):
        add(F, 1)
        add(I, 1, counts[W, 1])
        add(W, 1)
    while counts[F, 1] < counts[F, 0] or counts[F, 0] < n_micro:
        if counts[F, 0] < n_micro:
            add(F, 0)
        add(I, 0, counts[W, 0])
        add(W, 0)
        add(F, 1)
        add(I, 1, counts[W, 1])
        add(W, 1)
    inputs = {0: counts[W, 0], 1: counts[W, 1]}

    def add_input(chunk: int) -> None:
        add(I, chunk, inputs[chunk])
        inputs[chunk] += 1

    for _ in range(rank):
        add_input(0)
        add_input(1)
    for _ in range(s_count - rank):
        add_input(0)
        add(W, 0)
    while counts[W, 1] < inputs[1]:
        add(W, 1)
    while counts[W, 0] < inputs[0]:
        add(W, 0)
    return [step for step in order if step[1] < num_microbatches]
