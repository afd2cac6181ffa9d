"""The one table from a domain error to its wire code."""

from __future__ import annotations

from perseus_client.protocol import ErrorCode

from perseusd import errors
from perseusd.daemon.wire_errors import CODES, protocol_error
from perseusd.gpu.errors import GpuLostError
from perseusd.gpu.registry import UnknownGpuError
from perseusd.leasing.state_file import StateWriteError


def test_each_domain_error_has_its_code_and_message() -> None:
    cases = {
        errors.JobNotFoundError("x"): (ErrorCode.BAD_FIELD, "no job 'x' on this node"),
        errors.JobOwnerError("x"): (ErrorCode.PERMISSION_DENIED, "job 'x' belongs to another user"),
        UnknownGpuError("no GPU u"): (ErrorCode.UNKNOWN_GPU, "no GPU u"),
        errors.GpuError("it failed"): (ErrorCode.GPU_ERROR, "it failed"),
        errors.InvalidValueError("bad"): (ErrorCode.BAD_FIELD, "bad"),
        errors.NotPermittedError("no"): (ErrorCode.PERMISSION_DENIED, "no"),
        errors.LimitReachedError("full"): (ErrorCode.LIMIT, "full"),
        errors.NotRegisteredError("send hello first"): (ErrorCode.NOT_REGISTERED, "send hello first"),
        errors.GpuBusyError("busy"): (ErrorCode.GPU_BUSY, "busy"),
        errors.NotLeasedError("claim GPU u first"): (ErrorCode.NOT_LEASED, "claim GPU u first"),
        errors.InconsistentStateError("odd"): (ErrorCode.INTERNAL, "odd"),
    }
    for exc, expected in cases.items():
        mapped = protocol_error(exc)
        assert mapped is not None
        assert (mapped.code, mapped.message) == expected


def test_a_subclass_takes_the_first_row_that_matches() -> None:
    lost = protocol_error(GpuLostError("fell off the bus", uuid="gpu0", op="set clock"))
    assert lost is not None
    assert lost.code == ErrorCode.GPU_ERROR
    bases = [kind for kind, _ in CODES]
    for i, kind in enumerate(bases):  # no row is shadowed by a base above it
        assert not any(issubclass(kind, above) for above in bases[:i]), kind


def test_a_failed_state_write_says_nothing_was_applied() -> None:
    mapped = protocol_error(StateWriteError("state file: no space"))
    assert mapped is not None
    assert mapped.code == ErrorCode.STATE_WRITE_FAILED
    assert mapped.message.startswith("state file: no space; the request was not applied")


def test_an_error_outside_the_table_is_internal() -> None:
    assert protocol_error(errors.ConfigError("bad")) is None


def test_a_refusal_names_where_in_the_request_its_problem_is() -> None:
    """A library names the field within the request; the daemon puts the request's type before it."""
    entry = errors.InvalidValueError("5000 outside 210..1410 MHz", "plan[3].freq_mhz")
    whole = errors.InvalidValueError("stage 4 outside 0..3", "")
    said = errors.InvalidValueError("policy must be one of fastest, min_energy")
    assert [protocol_error(exc, "set_plan").message for exc in (entry, whole, said)] == [  # type: ignore[union-attr]
        "set_plan.plan[3].freq_mhz: 5000 outside 210..1410 MHz",
        "set_plan: stage 4 outside 0..3",
        "policy must be one of fastest, min_energy",
    ]
    assert entry.located() == "plan[3].freq_mhz: 5000 outside 210..1410 MHz"
