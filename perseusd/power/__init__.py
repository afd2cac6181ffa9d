"""Power caps: a node budget in watts met at the least iteration-time growth (see docs/power-caps.md).

`target` is the interface a cluster pool agent drives; `allocate` is the pure allocation (frontier points and
per-GPU power limits under a grant); `node_cap` applies it on the node; `window` measures power from the
energy counters; `job_loads` turns running jobs into what `allocate` needs.
"""
