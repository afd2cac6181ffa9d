"""Per-stage orders of the named pipeline schedules: which computations each stage runs, in order.

A step is (instruction, microbatch, chunk), chunk being the model chunk on the stage (0 for the first of its
model stages). The orders are those the frameworks run: Megatron-LM's 1F1B, GPipe and interleaved 1F1B.
Which schedule is which, and its rules, is `perseusd.planner.schedules`.
"""

from __future__ import annotations

from perseus_client.message import Instruction

F = Instruction.FORWARD
B = Instruction.BACKWARD

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
