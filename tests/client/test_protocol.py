"""The wire protocol: round trips, strict validation with stable codes."""

from __future__ import annotations

import json

import pytest
from perseus_client import protocol as p
from perseus_client.validation import MAX_NAME_CHARS

from tests.support.frames import V, register_body


def _code(data: bytes, max_bytes: int = p.DEFAULT_MAX_FRAME_BYTES) -> str:
    with pytest.raises(p.ProtocolError) as info:
        p.decode(data, max_bytes)
    return str(info.value.code)


@pytest.mark.parametrize(
    "message",
    [
        p.Hello(job="j", client_version="1"),
        p.Claim(gpus=("GPU-a", "GPU-b"), job="j"),
        p.Release(gpus=()),
        p.SetClock(gpu="GPU-a", sm_clock_mhz=None),
        p.ComputationBegin("GPU-a", 1, "backward", 3, 0, 123),
        p.StepEnd("GPU-a", 7, 9),
        p.AdminSetPowerLimit(gpu="GPU-a", power_limit_w=250.0),
        p.StatusReply(
            daemon=p.DaemonHealth("0.1", 1, 5, 1.5, 2, 10, 1, {"BAD_FRAME": 1}, 0, 0, None, 0),
            gpus=(
                p.GpuStatus(
                    "GPU-a", "n", None, 1200, 80.5, 400.0, 1.5, p.LeaseInfo(1, 0, "j"), None, {"read": 0.1}
                ),
            ),
        ),
    ],
)
def test_round_trip(message: p.Message) -> None:
    frame = p.decode(p.encode(message, 42))
    assert frame == p.Frame(42, message, p.PROTOCOL_MINOR)


def test_frames_are_compact_json_with_version_id_type() -> None:
    body = json.loads(p.encode(p.StatusRequest(), 3))
    assert body == {"v": p.PROTOCOL_MAJOR, "id": 3, "m": p.PROTOCOL_MINOR, "type": "status"}
    assert json.loads(p.encode(p.StatusRequest(), 3, 0)) == {"v": p.PROTOCOL_MAJOR, "id": 3, "type": "status"}


def test_rejections_have_stable_codes() -> None:
    assert _code(b"\xff\x00") == "BAD_FRAME"
    assert _code(b"[1,2]") == "BAD_FRAME"
    assert _code(V + b'"id":1,"type":"stat') == "BAD_FRAME"
    assert _code(b'{"id":1,"type":"status"}') == "BAD_FRAME"
    assert _code(b'{"v":1,"id":1,"type":"status"}') == "VERSION_MISMATCH"
    assert _code(V + b'"id":-1,"type":"status"}') == "BAD_FRAME"
    assert _code(V + b'"id":1,"type":"nope"}') == "UNKNOWN_TYPE"
    assert _code(V + b'"id":1,"type":"status","extra":1}') == "BAD_FIELD"
    assert _code(V + b'"id":1,"type":"claim","gpus":["a"]}') == "BAD_FIELD"
    assert _code(V + b'"id":1,"type":"claim","gpus":[1],"job":"j"}') == "BAD_FIELD"
    assert _code(V + b'"id":1,"type":"set_clock","gpu":"a","sm_clock_mhz":true}') == "BAD_FIELD"
    bad_instruction = V + b'"id":0,"type":"comp_begin","gpu":"a","stage":0,"instruction":"up",' \
        b'"microbatch":0,"chunk":0,"timestamp_ns":0}'  # fmt: skip
    assert _code(bad_instruction) == "BAD_FIELD"
    assert _code(V + b'"id":1,"type":"status"}' + b" " * 2000, max_bytes=1024) == "TOO_LARGE"


@pytest.mark.parametrize(
    "job",
    ["x" * (MAX_NAME_CHARS + 1), "evil\x1b]0;pwned\x07", "nul\x00", "bell\x07", "lone\ud800surrogate"],
    ids=["too-long", "osc-escape", "nul", "bell", "lone-surrogate"],
)
@pytest.mark.parametrize("kind", ["hello", "claim", "register"])
def test_job_names_are_bounded_and_printable(job: str, kind: str) -> None:
    """A job name lands in the state file, in root's terminal and in the logs: one that is huge (a state file
    too big to read back), carries escape sequences or cannot be encoded is refused at decode."""
    bodies = {
        "hello": {"job": job, "client_version": "1"},
        "claim": {"gpus": ["GPU-a"], "job": job},
        "register": register_body("GPU-a", job),
    }  # fmt: skip
    frame = {"v": p.PROTOCOL_MAJOR, "id": 1, "type": kind, **bodies[kind]}
    assert _code(json.dumps(frame).encode()) == "BAD_FIELD"
    good = {**frame, "job": "a job-name_1 \u00e9\u6f22" + "x" * (MAX_NAME_CHARS - 15)}
    assert p.decode(json.dumps(good).encode()).message.job == good["job"]  # type: ignore[attr-defined]


def test_request_id_of_bad_frame_is_best_effort() -> None:
    assert p.request_id_of(b'{"v":9,"id":17}') == 17
    assert p.request_id_of(b"junk") == 0


@pytest.mark.parametrize(
    "module",
    [
        "protocol",
        "codes",
        "validation",
        "envelope",
        "version",
        "message",
        "message_types",
        "lease_messages",
        "clock_messages",
        "event_messages",
        "job_messages",
        "job_info",
        "status_messages",
    ],
)
def test_protocol_modules_import_only_stdlib(module: str) -> None:
    import ast
    import sys
    from pathlib import Path

    tree = ast.parse((Path(p.__file__).parent / f"{module}.py").read_text())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert names - {"__future__", "perseus_client"} <= set(sys.stdlib_module_names)
