"""Reading power capping at the highest clock: skip the clocks above only when every read says capped."""

from __future__ import annotations

from concurrent.futures import Future

from perseusd.gpu.backend import CLOCK_EVENT_SW_POWER_CAP
from perseusd.gpu.reading import GpuReading
from perseusd.jobs.capping import capped_clock_mhz, finished_readings


def reading(clock_mhz: int | None, reasons: int | None) -> GpuReading:
    return GpuReading("GPU-a", clock_mhz, 1980, 690.0, 700.0, 1, clock_event_reasons=reasons)


def test_every_read_capped_gives_the_highest_clock_read() -> None:
    capped = [reading(1695, CLOCK_EVENT_SW_POWER_CAP), reading(1755, CLOCK_EVENT_SW_POWER_CAP)]
    assert capped_clock_mhz(capped) == 1755
    assert capped_clock_mhz([*capped, reading(1980, 0)]) is None  # one computation runs uncapped
    assert capped_clock_mhz([*capped, reading(None, None)]) == 1755  # a failed read says nothing
    assert capped_clock_mhz([]) is None


def test_only_finished_reads_count() -> None:
    done: Future[GpuReading] = Future()
    done.set_result(reading(1700, CLOCK_EVENT_SW_POWER_CAP))
    failed: Future[GpuReading] = Future()
    failed.set_exception(RuntimeError("gone"))
    pending: Future[GpuReading] = Future()
    assert finished_readings([done, failed, pending]) == [done.result()]
