"""`gpu_validate.py --layer-sweep`: the per-kind modules run forward and backward (on the CPU here: the
code, not the measurement), and the family reads a layer sweep's report as kinds `GPU/kind`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.gpu_layer_sweep import kind_cases
from benchmarks.gpu_validate import parse_args
from benchmarks.workload_family import CLOCKS_MHZ, measured_layer_kinds


def test_every_kind_runs_forward_and_backward() -> None:
    cases = kind_cases(d_model=64, seq=32, vocabs=(100, 300), device="cpu")
    assert [c.name for c in cases] == [
        "matmul",
        "attention",
        "memory",
        "embedding@100",
        "lm_head@100",
        "embedding@300",
        "lm_head@300",
    ]
    for case in cases:
        out = case.module(case.make_input())
        out.float().square().mean().backward()  # what the locked sweep runs
        grads = [p.grad for p in case.module.parameters()]
        assert grads
        assert all(g is not None for g in grads), case.name


def test_the_flag_parses_and_vocabularies_are_numbers() -> None:
    args = parse_args(["--layer-sweep", "--vocabs", "32000,256000"])
    assert args.layer_sweep
    assert args.vocabs == (32000, 256000)
    with pytest.raises(SystemExit):
        parse_args(["--layer-sweep", "--vocabs", "many"])


def test_a_layer_sweep_report_becomes_kinds_of_the_family(tmp_path: Path) -> None:
    rows = [
        {"clock_mhz": c, "forward_s": 0.001 * 1980 / c, "forward_j": 0.5}
        | {"backward_s": 0.002, "backward_j": 1.0}
        for c in (1980, 1500, 1005)
    ]
    report = {"gpu": "NVIDIA H100", "kinds": {"matmul": rows, "lm_head@128256": rows}}
    (tmp_path / "layer-sweep-h100-2026-11-26.json").write_text(json.dumps(report))
    (tmp_path / "h200-other-record.json").write_text("{}")  # not a layer sweep: ignored
    kinds = measured_layer_kinds(tmp_path)
    assert set(kinds) == {"NVIDIA H100/matmul", "NVIDIA H100/lm_head@128256"}
    curve = kinds["NVIDIA H100/matmul"]("forward")
    assert set(curve) == set(CLOCKS_MHZ)
    assert curve[1980] == pytest.approx((0.001, 500.0))
    assert curve[900][0] == pytest.approx(0.001 * 1980 / 1005 * 1005 / 900)  # below the sweep: compute-bound
