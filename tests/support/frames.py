"""Hostile frames for the adversarial tests and benchmarks/bench_fuzz.py, and the checks every case ends with.

Two generators over the same ingredients (a valid body of every request and event, the issue's regression
frames): `frames()`, a hypothesis strategy for the tests (shrinks to the smallest failing frame), and
`random_frame(rng)`, a plain `random.Random` generator for the benchmark's 100,000+ frames.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import zmq
from hypothesis import strategies as st
from perseus_client import PerseusClient
from perseus_client.protocol import PROTOCOL_VERSION, ErrorCode, ErrorReply, Frame, decode_reply

from tests.support.perseusd_proc import sim_control
from tests.support.sockets import connected

V = b'{"v":%d,' % PROTOCOL_VERSION
"""How a frame of the current protocol version starts (tests never spell the version out)."""

REPLY_TIMEOUT_MS = 5000
DEEP = 100_000


def register_body(gpu: str, job: str) -> dict[str, Any]:
    """A register body (no type): `job` as one pipeline of one stage on `gpu`, 1F1B, one microbatch."""
    return {
        "gpu": gpu,
        "job": job,
        "pipeline": 0,
        "stage": 0,
        "num_stages": 1,
        "num_microbatches": 1,
        "schedule": "1f1b",
        "chunks": 1,
    }


def valid_bodies(gpu: str) -> list[dict[str, Any]]:
    """One valid body of every request, admin request and event (without v and id)."""
    comp = {"gpu": gpu, "stage": 0, "instruction": "forward", "microbatch": 0, "chunk": 0, "timestamp_ns": 1}
    entry = {"instruction": "forward", "microbatch": 0, "chunk": 0, "freq_mhz": 1200}
    csv = "stage,instruction,frequency,time,energy\n0,forward,1410,0.01,2.0\n0,backward,1410,0.02,4.0\n"
    return [
        {"type": "hello", "job": "fuzz", "client_version": "0.1.0"},
        {"type": "claim", "gpus": [gpu], "job": "fuzz"},
        {"type": "release", "gpus": []},
        {"type": "set_clock", "gpu": gpu, "sm_clock_mhz": 1200},
        {"type": "set_plan", "gpu": gpu, "plan": [entry]},
        {"type": "clear_plan", "gpu": gpu},
        {"type": "status"},
        {"type": "event_count"},
        {"type": "register", **register_body(gpu, "fuzz")},
        {"type": "set_policy", "job": "fuzz", "policy": "slowdown", "target": 0.1},
        {"type": "jobs"},
        {"type": "frontier", "job": "fuzz"},
        {"type": "plan", "job": "fuzz"},
        {"type": "profile_export", "job": "fuzz"},
        {"type": "profile_import", "job": "fuzz", "csv": csv, "source": "fuzz.csv", "p_block_w": 60.0},
        {"type": "announce_straggler", "job": "fuzz", "pipeline": 0, "factor": 1.2, "clear": False},
        {"type": "admin_reset", "gpus": []},
        {"type": "admin_set_power_limit", "gpu": gpu, "power_limit_w": 300.0},
        {"type": "comp_begin", **comp},
        {"type": "comp_end", **comp},
        {"type": "step_begin", "gpu": gpu, "step": 0, "timestamp_ns": 1},
        {"type": "step_end", "gpu": gpu, "step": 0, "timestamp_ns": 1},
    ]


def new_surface_bodies(gpu: str) -> list[dict[str, Any]]:
    """One valid body of each request added since the first round of fuzzing: energy windows, the node cap,
    the power pool, Slurm (for `benchmarks/bench_fuzz.py`; the suite's fuzz tests keep `valid_bodies`)."""
    return [
        {"type": "energy_read", "gpus": [gpu]},
        {"type": "energy_read", "gpus": []},
        {"type": "admin_set_cap", "budget_w": 900.0},
        {"type": "admin_clear_cap"},
        {"type": "admin_cap_status"},
        {"type": "admin_set_job_priority", "job": "fuzz", "priority": 2},
        {"type": "admin_pool_set_budget", "pool": "fuzz", "budget_w": 1000.0},
        {"type": "admin_pool_status", "pool": "fuzz"},
        {"type": "admin_pool_release", "pool": "fuzz", "node": "fuzz"},
        {"type": "slurm_jobs"},
        {"type": "admin_slurm_prolog", "job": 7, "uid": 1000, "gpu_minors": [0]},
        {"type": "admin_slurm_epilog", "job": 7},
    ]


def frame_bytes(body: dict[str, Any], request_id: int = 1) -> bytes:
    """`body` as a frame; NaN and infinities written as the non-standard JSON Python emits."""
    return json.dumps({"v": PROTOCOL_VERSION, "id": request_id, **body}, allow_nan=True).encode()


def regression_frames(gpu: str) -> dict[str, bytes]:
    """The frames of issue 14, by name: each once took the daemon down or left it inconsistent."""
    head = b'{"v":%d,"id":41,"type":"status","x":' % PROTOCOL_VERSION
    profile = "stage,instruction,frequency,time,energy\n3000000,forward,1410,0.01,2.0\n"
    register = next(b for b in valid_bodies(gpu) if b["type"] == "register")
    comp = next(b for b in valid_bodies(gpu) if b["type"] == "comp_begin")
    return {
        "deep_lists": b"[" * DEEP,
        "deep_objects": b'{"a":' * DEEP,
        "deep_after_id": head + b"[" * DEEP + b"]" * DEEP + b"}",
        "deep_valid_json": b"[" * 5000 + b"]" * 5000,
        "nan_target": frame_bytes(
            {"type": "set_policy", "job": "fuzz", "policy": "time", "target": float("nan")}
        ),
        "inf_target": b'{"v":%d,"id":3,"type":"set_policy","job":"fuzz","policy":"time","target":1e999}'
        % PROTOCOL_VERSION,
        "nan_p_block_w": frame_bytes(
            {"type": "profile_import", "job": "nanjob", "csv": "x", "source": "s", "p_block_w": float("nan")}
        ),
        "huge_stage_profile": frame_bytes(
            {"type": "profile_import", "job": "huge", "csv": profile, "source": "huge.csv", "p_block_w": 60.0}
        ),
        "pipeline_2_70": frame_bytes({**register, "pipeline": 2**70}),
        "pipeline_2_62": frame_bytes({**register, "pipeline": 2**62}),
        "negative_stage_event": frame_bytes({**comp, "stage": -1}),
        "negative_timestamp_event": frame_bytes({**comp, "timestamp_ns": -(2**62)}),
        "set_clock_far_above": frame_bytes({"type": "set_clock", "gpu": gpu, "sm_clock_mhz": 10**9}),
        "huge_id": b'{"v":%d,"id":%d,"type":"status"}' % (PROTOCOL_VERSION, 2**80),
        "huge_int_text": b'{"v":%d,"id":1,"type":"status","x":%s}' % (PROTOCOL_VERSION, b"9" * 5000),
        "not_utf8": V + b'"id":1,"type":"\xff\xfe"}',
        "empty": b"",
    }


# ------------------------------------------------------------------ hypothesis strategies

_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
    | st.sampled_from(["forward", "backward", "1f1b", "interleaved", "time", "slowdown", "GPU-0", ""])
)
json_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@st.composite
def mutated_bodies(draw: st.DrawFn, gpu: str) -> dict[str, Any]:
    """A valid body with some fields replaced, removed or added."""
    body = dict(draw(st.sampled_from(valid_bodies(gpu))))
    keys = [k for k in body if k != "type"]
    for key in draw(st.lists(st.sampled_from(keys), max_size=3, unique=True)) if keys else []:
        action = draw(st.sampled_from(["replace", "remove"]))
        if action == "remove":
            body.pop(key)
        else:
            body[key] = draw(json_values)
    if draw(st.booleans()) and draw(st.booleans()):
        body[draw(st.text(min_size=1, max_size=8))] = draw(json_values)
    return body


def frames(gpu: str) -> st.SearchStrategy[bytes]:
    """Frames of every kind: mutated requests (all ids), random JSON, random bytes, deep nesting."""
    mutated = st.builds(
        frame_bytes,
        mutated_bodies(gpu),
        st.integers(min_value=-5, max_value=2**64) | st.integers(min_value=0, max_value=10),
    )
    raw_json = json_values.map(lambda v: json.dumps(v, allow_nan=True).encode())
    deep = st.tuples(st.sampled_from([b"[", b'{"a":', V + b'"id":9,"x":[']), st.integers(1, 20_000)).map(
        lambda t: t[0] * t[1]
    )
    return mutated | raw_json | st.binary(max_size=200) | deep


# ------------------------------------------------------------------ random generator (benchmark)


def _random_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(10 if depth < 3 else 7)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.choice([0, -1, 1, 2**31, 2**63, 2**70, -(2**70), rng.randrange(-(10**6), 10**6)])
    if kind == 3:
        return rng.choice([0.0, -0.0, 1e-300, 1e308, float("nan"), float("inf"), -float("inf"), rng.random()])
    if kind in (4, 5, 6):
        return rng.choice(["", "forward", "backward", "1f1b", "GPU-x", "\u0000", "x" * rng.randrange(100)])
    if kind in (7, 8):
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {str(rng.randrange(5)): _random_value(rng, depth + 1) for _ in range(rng.randrange(4))}


def random_frame(rng: random.Random, gpu: str, bodies: list[dict[str, Any]] | None = None) -> bytes:
    """One hostile frame from `rng`: mostly mutated valid requests (of `bodies`, default `valid_bodies`),
    some raw JSON, bytes and deep nesting."""
    kind = rng.randrange(100)
    if kind < 70:
        body = dict(rng.choice(bodies or valid_bodies(gpu)))
        if rng.random() < 0.2:  # the protocol's minors: any, a newer one, nonsense
            body["m"] = rng.choice([0, 1, 5, 6, 99, -1, "5", None])
        for key in rng.sample([k for k in body if k != "type"], k=min(len(body) - 1, rng.randrange(3))):
            if rng.random() < 0.2:
                body.pop(key)
            else:
                body[key] = _random_value(rng)
        if rng.random() < 0.05:
            body[str(rng.randrange(100))] = _random_value(rng)
        return frame_bytes(body, rng.choice([0, 1, rng.randrange(2**40), -1, 2**64]))
    if kind < 85:
        return json.dumps(_random_value(rng), allow_nan=True).encode()
    if kind < 95:
        return rng.randbytes(rng.randrange(200))
    return rng.choice([b"[", b'{"a":', V + b'"id":9,"x":[']) * rng.randrange(1, DEEP)


# ------------------------------------------------------------------ raw peers and checks


class RawPeer:
    """Raw ZeroMQ sockets to a daemon: send any bytes, read the reply of the control/admin socket."""

    reply_timeout_ms = REPLY_TIMEOUT_MS

    def __init__(self, runtime_dir: Path) -> None:
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.control = connected(self.ctx, zmq.DEALER, runtime_dir / "control.sock")
        self.admin = connected(self.ctx, zmq.DEALER, runtime_dir / "admin.sock")
        self.events = connected(self.ctx, zmq.PUSH, runtime_dir / "events.sock")

    def send(self, data: bytes, *, admin: bool = False) -> bytes:
        """Send `data` on the control (or admin) socket; the reply's bytes (which must come)."""
        sock = self.admin if admin else self.control
        sock.send(data)
        if not sock.poll(self.reply_timeout_ms):
            raise AssertionError(f"no reply within {self.reply_timeout_ms} ms to {data[:80]!r}")
        return sock.recv()

    def ask(self, data: bytes, *, admin: bool = False) -> Frame:
        """Send `data` and decode the reply (which must come, and must decode)."""
        return decode_reply(self.send(data, admin=admin), 1 << 30)

    def event(self, data: bytes) -> None:
        self.events.send(data)

    def close(self) -> None:
        for sock in (self.control, self.admin, self.events):
            sock.close(linger=0)
        self.ctx.term()


def assert_error_or_reply(frame: Frame) -> None:
    """A reply decoded; an error reply has a stable code and says what went wrong."""
    if isinstance(frame.message, ErrorReply):
        assert frame.message.code in {code.value for code in ErrorCode}
        assert frame.message.message


def assert_serves_and_nothing_locked(
    runtime_dir: Path, *, state_dir: Path | None = None, settle_s: float = 5.0
) -> None:
    """A well-behaved client claims, sets a clock, sends events and releases; afterwards no GPU is leased or
    locked (the daemon restored everything the hostile peers did) and state.json, if any, reads back whole."""
    with PerseusClient(runtime_dir, job="well-behaved", timeout_s=5.0) as client:
        assert client.daemon_info is not None
        gpu = client.daemon_info.gpus[0].uuid
        client.claim([gpu])
        assert client.set_clock(gpu, 1200) is not None
        with client.step(gpu, 0), client.computation(gpu, 0, "forward", 0):
            pass
        released = client.release()
        assert released.failed == ()
    deadline_s = time.monotonic() + settle_s
    while True:
        with PerseusClient(runtime_dir, job="checker", timeout_s=5.0) as checker:
            status = checker.status()
            assert checker.daemon_info is not None
            uuids = [g.uuid for g in checker.daemon_info.gpus]
        locked = {u: sim_control(runtime_dir, u).locked_sm_clock_mhz for u in uuids}
        leased = [row.uuid for row in status.gpus if row.lease is not None]
        if not leased and all(v is None for v in locked.values()):
            _assert_state_whole(state_dir)
            return
        if time.monotonic() > deadline_s:
            raise AssertionError(f"GPUs left leased {leased} or locked {locked}")
        time.sleep(0.1)


def _assert_state_whole(state_dir: Path | None) -> None:
    """state.json is absent (nothing to restore) or one whole JSON object."""
    path = None if state_dir is None else state_dir / "state.json"
    if path is not None and path.exists():
        assert isinstance(json.loads(path.read_text()), dict)
