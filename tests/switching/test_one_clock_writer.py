"""One writer of a leased GPU's locked clock: the plan book. A plan's switches, a job's profiling sweep and a
client's set_clock all go through it, so a plan knows when another writer moved its GPU's clock."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from perseusd.switching.plan_entries import computation_key
from perseusd.switching.plans import PlanBook
from tests.daemon.test_plans import CLOCKS_MHZ, PLAN, ManualOwner

REPO_ROOT = Path(__file__).resolve().parents[2]
F0 = computation_key("forward", 0, 0)
CLOCK_CALLS = {"submit_locked_sm_clock_mhz", "set_locked_sm_clock_mhz"}
MAY_NAME_THEM = {
    "perseusd/gpu",  # the backends, the owner threads and the registry that make the calls
    "perseusd/metrics/gpu_calls.py",  # times a device's calls
    "perseusd/switching/plans.py",  # the one writer
    "perseusd/daemon/components.py",  # where the plan book is given the registry's clock calls
}


def test_only_the_plan_book_is_given_the_clock_calls() -> None:
    found = []
    for path in sorted((REPO_ROOT / "perseusd").rglob("*.py")):
        relative = path.relative_to(REPO_ROOT).as_posix()
        if any(relative == allowed or relative.startswith(allowed + "/") for allowed in MAY_NAME_THEM):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in CLOCK_CALLS:
                found.append(f"{relative}:{node.lineno}: {node.attr}")
    assert not found, "clock sets outside the plan book:\n" + "\n".join(found)


def test_a_clock_set_outside_the_plan_makes_the_plan_submit_its_next_change() -> None:
    owner = ManualOwner()
    set_now: list[tuple[str, int | None]] = []

    def set_clock_now(gpu: str, clock_mhz: int | None) -> int | None:
        set_now.append((gpu, clock_mhz))
        return clock_mhz

    book = PlanBook(owner.submit, set_now=set_clock_now)
    book.set("GPU-a", PLAN, CLOCKS_MHZ)
    owner.complete_all()
    book.on_begin("GPU-a", F0, book.now_ns())
    assert owner.clocks() == [1410]  # its clock is the one the plan requested: nothing submitted
    book.submit_clock("GPU-a", 1005)  # a profiling sweep's
    owner.complete_all()
    book.on_begin("GPU-a", F0, book.now_ns())
    assert owner.clocks() == [1410, 1005, 1410]  # the plan's clock again
    owner.complete_all()
    assert book.set_clock("GPU-a", None) is None  # a client's, applied before it returns
    assert set_now == [("GPU-a", None)]
    book.on_begin("GPU-a", F0, book.now_ns())
    assert owner.clocks() == [1410, 1005, 1410, 1410]


def test_a_plan_book_without_a_way_to_set_now_says_so() -> None:
    book = PlanBook(ManualOwner().submit)
    with pytest.raises(RuntimeError, match="set a clock now"):
        book.set_clock("GPU-a", 1005)
