"""The cluster power pool: nodes share one budget through etcd (see docs/power-pool.md).

Only when the daemon is configured with a pool. `keys` names and encodes what the nodes store, `alloc` is
the pure allocation of a budget over the nodes' needs, `view` reads the pool, `allocator` (the elected
node) grants (each move written to etcd by `move_writer`, absent nodes' grants kept or released by
`absent_nodes`), `agent` is each node's thread that reports its need and applies its grant to the node's power
target (its lease and report in `membership`, what it applies in `grant_holder`, its etcd watches in
`watches`), `feed` reads a facility's budget file, `admin` sets the budget, and `uniform` is the power target
that splits a grant over the GPUs when the node runs no cap (its originals kept in `limits_file`).
"""
