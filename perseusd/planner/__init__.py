"""The Perseus planner: profiles, computation DAGs, the frontier solver, plans and baselines.

A pure library: no I/O except in `profile` and `plan`, no globals, never mutates its inputs.
"""
