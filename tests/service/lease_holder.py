"""A client run inside a test machine: `lease_holder.py CLOCK_MHZ UUID_FILE JOB`.

Leases the daemon's first GPU (at /run/perseusd) as job JOB and locks its SM clock to CLOCK_MHZ, writes the
GPU's UUID to UUID_FILE (atomically: a test waits for the file), then holds the lease until it is killed.
"""

import os
import sys
import time

from perseus_client import PerseusClient

clock_mhz, uuid_file, job = int(sys.argv[1]), sys.argv[2], sys.argv[3]
client = PerseusClient("/run/perseusd", job=job, timeout_s=5.0)
uuid = client.daemon_info.gpus[0].uuid
client.claim([uuid])
print("locking", uuid, flush=True)
client.set_clock(uuid, clock_mhz)
with open(uuid_file + ".tmp", "w") as out:
    out.write(uuid)
os.rename(uuid_file + ".tmp", uuid_file)
while True:
    time.sleep(3600)
