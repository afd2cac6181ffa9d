"""A training process's calls to perseusd from inside a container (run by tests/containers).

Prints one JSON line (what it saw and what the daemon answered), then waits on stdin until told to go
(or killed), holding its lease.
"""

from __future__ import annotations

import json
import os
import sys

from perseus_client import PerseusClient
from perseus_client.client import PerseusClientError


def main() -> None:
    clock_mhz = int(sys.argv[1])
    client = PerseusClient(
        os.environ.get("PERSEUSD_RUNTIME_DIR", "/run/perseusd"), job="in-container", strict=True
    )
    hello = client.daemon_info
    assert hello is not None
    mine = client.gpu_uuid(0)
    result: dict[str, object] = {
        "pid": os.getpid(),
        "uid": os.getuid(),
        "visible": hello.visible_gpus,
        "mine": mine,
    }
    client.claim([mine])
    result["applied_mhz"] = client.set_clock(mine, clock_mhz)
    others = [gpu.uuid for gpu in hello.gpus if gpu.uuid not in (hello.visible_gpus or ())]
    try:
        client.claim([others[0]])
        result["other"] = "ok"
    except PerseusClientError as exc:
        result["other"] = exc.code
        result["other_message"] = exc.message
    print(json.dumps(result), flush=True)
    sys.stdin.readline()
    client.close()


if __name__ == "__main__":
    main()
