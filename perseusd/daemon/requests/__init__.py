"""The daemon's requests: each file serves one family of them (`gpu`, `job`, `energy`, `slurm`, the power cap
`cap`, the power pool `pool`), taking the kernel-attested caller; `table` is the one table from a request's
message type to its handler, for the control socket and for the admin socket, built once with the core.

A new request: its message (`perseus_client`), its handler in the family's file, one line in `table`.
"""
