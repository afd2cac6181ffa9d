"""`benchmarks/bench_frontier_read.py` runs and reports what it says: the same frontier read both ways, and
registration reading a frontier over `INLINE_FRONTIER_BYTES` not at all (its figures are the benchmark's,
never a test's)."""

from __future__ import annotations

import json

import pytest

from benchmarks import bench_frontier_read
from perseusd.jobs import cache as cache_module


@pytest.mark.parametrize("inline_bytes", [cache_module.INLINE_FRONTIER_BYTES, 0])
def test_the_benchmark_reports_each_shape(
    inline_bytes: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cache_module, "INLINE_FRONTIER_BYTES", inline_bytes)
    assert bench_frontier_read.main(["--shapes", "a100_sxm:2:4", "--repeat", "1"]) == 0
    result = json.loads(capsys.readouterr().out)
    (shape,) = result["shapes"]
    assert shape["shape"] == "a100_sxm:2:4"
    assert shape["points"] > 10
    assert shape["read_at_registration"] is (inline_bytes > 0)
    assert all(shape[key] >= 0 for key in ("parse_s", "walk_s", "registration_s"))
