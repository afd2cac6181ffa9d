"""Power caps, the pure library: a node budget in watts met at the least iteration-time growth (see
docs/power-caps.md). No I/O and no daemon: `perseusctl cap model` uses it offline, the daemon's node cap
(`perseusd.cap`) on the node.

`allocate` is the allocation (frontier points and per-GPU power limits under a grant), `target` the interface
a cluster pool agent drives; `limit_fit`, `limit_model`, `hard_line` and `aliasing` size power limits and
window power on a job's DAG; `replay`, `scenario` and `pool_model` are the replay and analytic models.
"""
