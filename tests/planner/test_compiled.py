"""The compiled cores are used only when built from these sources (`perseusd.planner.compiled`)."""

from __future__ import annotations

import logging
import types

import pytest

from perseusd.planner.compiled import ABI, checked, load_core
from perseusd.planner.evaluate import SWITCHCORE
from perseusd.planner.solver import load_c_core


def test_the_built_cores_state_this_codes_interface_and_are_used() -> None:
    """setup.py builds both cores (CI and every install): they load, with the version the code expects."""
    for name in ABI:
        module = load_core(name)
        assert module is not None, name
        assert ABI[name] == module.ABI
    assert SWITCHCORE is not None
    assert load_c_core() is not None


@pytest.mark.parametrize("stated", [None, 0, 99])
def test_a_core_built_from_other_sources_is_refused_with_a_warning(
    stated: int | None, caplog: pytest.LogCaptureFixture
) -> None:
    """A module stating another interface version (or none: built before cores stated one) is not used:
    its first changed signature would fail a solve mid-way; the planner's Python implementation runs."""
    stale = types.SimpleNamespace() if stated is None else types.SimpleNamespace(ABI=stated)
    with caplog.at_level(logging.WARNING, logger="perseusd.planner.compiled"):
        assert checked(stale, "_switchcore") is None
    assert f"interface {stated}, this code needs {ABI['_switchcore']}" in caplog.text
    assert "rebuild it" in caplog.text


def test_an_unbuilt_core_is_none() -> None:
    assert load_core("_no_such_core") is None
