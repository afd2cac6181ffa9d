"""Who holds which GPU of this node, and what is put back when they let go: callers' identity, the lease
book, the registry of GPU owner threads, the restore keeper and its state file. No transport; below the
power cap, the cluster power pool and the daemon, above gpu.
"""

from __future__ import annotations
