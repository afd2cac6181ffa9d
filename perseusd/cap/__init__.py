"""The node power cap the daemon runs: a budget (admin) and/or a grant (a cluster pool) held by frontier
points and power limits (see docs/power-caps.md).

`node_cap` applies the allocation of `perseusd.power` on the node each tick; `job_loads` turns running jobs
into what the allocation needs; `limit_writer` writes the power limits (`limit_check` finds one written
over); `window` measures power from the energy counters and `measured_check` corrects the plan by it;
`cap_file` keeps the budget across a restart; `declared_cap` reads a budget declared in files.
"""
