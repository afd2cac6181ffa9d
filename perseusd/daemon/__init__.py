"""The Perseus daemon: configuration, the core, the requests that take a caller (jobs, energy), IPC and the
composition root.

Importing it sets the daemon process's BLAS and OpenMP thread counts to 1, unless the environment already
sets them: the daemon's numeric work (profile fits over tens of points, the cost model's fits) gains nothing
from threads, and a threaded BLAS would start a thread per core in the daemon, its solver worker and the
worker's fork server, each spinning after a call on cores the node's training needs. It must run before
numpy is first imported (`python -m perseusd.daemon.main` and the `perseusd` script import this package
first); the solver worker inherits the environment.
"""

from __future__ import annotations

import os

BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")

for _variable in BLAS_THREAD_VARIABLES:
    os.environ.setdefault(_variable, "1")
