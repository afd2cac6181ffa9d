"""A training process of a Slurm job (run by tests/slurm through srun): finds its GPUs through the daemon and
CUDA_VISIBLE_DEVICES, claims them, runs a few steps of events, tries a GPU it was not allocated, and prints
one JSON line. With --hold it then waits (holding its leases) until killed."""

from __future__ import annotations

import json
import os
import sys
import time

from perseus_client import PerseusClient
from perseus_client.client import PerseusClientError


def main() -> None:
    runtime_dir, hold = sys.argv[1], "--hold" in sys.argv
    job = f"slurm-{os.environ.get('SLURM_JOB_ID', '?')}"
    with PerseusClient(runtime_dir, job=job, strict=True) as client:
        hello = client.daemon_info
        assert hello is not None
        count = len(os.environ.get("CUDA_VISIBLE_DEVICES", "").split(","))
        mine = [client.gpu_uuid(device) for device in range(count)]
        client.claim(mine)
        for gpu in mine:
            client.set_clock(gpu, 1005)
        for step in range(3):
            for stage, gpu in enumerate(mine):
                with client.step(gpu, step), client.computation(gpu, stage, "forward", 0):
                    time.sleep(0.05)
        others = [gpu.uuid for gpu in hello.gpus if gpu.uuid not in mine]
        try:
            client.claim(others[:1])
            other = "ok"
        except PerseusClientError as exc:
            other = exc.code
        result = {
            "job": os.environ.get("SLURM_JOB_ID"),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "visible": hello.visible_gpus,
            "mine": mine,
            "other": other,
        }
        print(json.dumps(result), flush=True)
        if hold:
            time.sleep(600)
        time.sleep(0.3)  # some energy under the lease
        client.release()


if __name__ == "__main__":
    main()
