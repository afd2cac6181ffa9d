"""The real stage's executor: real layers, run forward and backward in a 1F1B order (on the CPU here; the
flag kernel that makes the GPU wait like a NCCL receive only on a GPU, `-m gpu`)."""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")

from perseusd.emulate.executors import StagePlace, open_executor  # noqa: E402
from perseusd.emulate.real_stage import RealStageSpec  # noqa: E402
from perseusd.planner.schedule_orders import one_f_one_b_order  # noqa: E402

TINY = RealStageSpec(layers=1, d_model=64, seq=16, device="cpu")


@pytest.mark.parametrize(("first", "last"), [(True, False), (False, False), (False, True)])
def test_a_stage_runs_its_1f1b_order_and_drops_what_an_iteration_kept(first: bool, last: bool) -> None:
    executor = open_executor("", "GPU-cpu", None, TINY, StagePlace(first, last, microbatches=4))
    try:
        for _ in range(2):  # two iterations: nothing accumulates across them
            for instruction, microbatch, _chunk in one_f_one_b_order(4, 4, 1):
                with executor.waiting():
                    pass
                record = executor.run(1, instruction.value, microbatch, 1.0)
                assert record.instruction == instruction.value
                assert record.duration_s > 0
            executor.iteration_done()
        module = executor._module  # type: ignore[attr-defined]
        assert all(p.grad is None for p in module.parameters())  # dropped at the iteration's end
        assert executor._outputs == {}  # type: ignore[attr-defined]
        assert executor.wait_kind == "idle"  # type: ignore[attr-defined]  (no GPU: nothing to spin)
    finally:
        executor.close()


def test_a_backward_before_its_forward_is_an_error() -> None:
    executor = open_executor("", "GPU-cpu", None, TINY, StagePlace(True, False, microbatches=2))
    with pytest.raises(KeyError):
        executor.run(0, "backward", 0, 1.0)
    executor.close()


def test_the_real_stage_cannot_be_throttled() -> None:
    executor = open_executor("", "GPU-cpu", None, TINY, StagePlace(True, True, microbatches=1))
    executor.throttle(1.0)
    with pytest.raises(ValueError, match="cannot be throttled"):
        executor.throttle(1.5)
    executor.close()


@pytest.fixture
def cuda() -> torch.device:
    """The first CUDA device (the test is skipped without one)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    return torch.device("cuda", 0)


@pytest.mark.gpu
def test_on_a_gpu_the_stage_waits_on_a_flag_kernel_released_by_the_host(cuda: torch.device) -> None:
    from perseusd.emulate.torch_stage import FlagWait

    wait = FlagWait(cuda)
    latency_s = wait.self_test()
    assert latency_s < 0.05  # the kernel ends within microseconds of the flag, not at its poll bound
    behind_spin = torch.cuda.Event()
    with wait.waiting():
        behind_spin.record()  # queued behind the spinning kernel on the stage's stream
        time.sleep(0.02)
        assert not behind_spin.query()  # the GPU still waits: the host has not raised the flag
    behind_spin.synchronize()  # raised: the stream moves on at once


@pytest.mark.gpu
def test_on_a_gpu_the_clock_probe_reads_the_sm_clock_on_the_gpu(cuda: torch.device) -> None:
    from perseusd.emulate.torch_stage import ClockProbe

    probe = ClockProbe(cuda)
    clock_mhz = probe.self_test()
    top_mhz = (
        torch.cuda.get_device_properties(0).clock_rate / 1000
        if hasattr(torch.cuda.get_device_properties(0), "clock_rate")
        else 5000
    )
    assert 100 <= clock_mhz <= top_mhz * 1.05
