"""`gpu_validate.py --layer-sweep`: the per-kind modules run forward and backward (on the CPU here: the
code, not the measurement), and the family reads a layer sweep's report as kinds `GPU/kind`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.gpu_layer_sweep import kind_cases
from benchmarks.gpu_validate import parse_args
from benchmarks.workload_family import (
    CLOCKS_MHZ,
    FAMILY,
    LAYER_SWEEPS,
    bounds_violations,
    mean_rows,
    measured_layer_kinds,
    stage_cost,
)


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


def test_two_sweeps_of_one_gpu_are_averaged_at_the_clocks_both_measured(tmp_path: Path) -> None:
    def rows(scale: float, clocks: tuple[int, ...]) -> list[dict[str, float]]:
        return [
            {
                "clock_mhz": c,
                "forward_s": scale * 1e-3,
                "forward_j": scale,
                "backward_s": 2e-3,
                "backward_j": 1.0,
            }
            for c in clocks
        ]

    for n, (scale, clocks) in enumerate(((1.0, (1980, 1500, 1005)), (3.0, (1980, 1005)))):
        report = {"gpu": "NVIDIA H200", "kinds": {"matmul": rows(scale, clocks)}}
        (tmp_path / f"layer-sweep-h200-{n}.json").write_text(json.dumps(report))
    assert mean_rows([rows(1.0, (1980, 1500)), rows(3.0, (1980,))]) == rows(2.0, (1980,))
    curve = measured_layer_kinds(tmp_path)["NVIDIA H200/matmul"]("forward")
    assert curve[1980] == pytest.approx((2e-3, 1000.0))
    assert curve[1485] == pytest.approx((2e-3, 1000.0))  # 1500 (one run only) left out


def test_the_measured_workloads_are_the_committed_h200_sweeps_alone() -> None:
    kinds = measured_layer_kinds()
    sweeps = sorted(LAYER_SWEEPS.glob("layer-sweep-h200-*.json"))
    assert len(sweeps) >= 2
    measured = [w for w in FAMILY.values() if w.measured_gpu]
    assert {w.measured_gpu for w in measured} == {"NVIDIA H200"}
    for workload in measured:
        last = workload.stages - 1
        for stage in (0, last):
            forward = workload.stage_parts(stage)[0]
            assert all(kind.startswith("NVIDIA H200/") for kind in forward)
            assert set(forward) <= set(kinds)
        clock = 1440  # a clock both sweeps measured
        layers_s = sum(
            units * kinds[f"NVIDIA H200/{kind}"]("forward")[clock][0]
            for kind, units in (("matmul", 4.0), ("attention", 1.0))
        )
        head_s = 4.0 * kinds[f"NVIDIA H200/lm_head@{workload.vocab}"]("forward")[clock][0]
        expected_s = workload.layers[last] * layers_s + head_s
        assert stage_cost(workload, last, "forward", clock)[0] == pytest.approx(expected_s)
        assert bounds_violations(workload) == []
