"""Online profiling math: per-computation time and energy from a stage's computation intervals and its GPU's
coarse energy counter (`estimator`), what is recorded (`trace`), and the clock sweep (`sweep`).

Pure computation: no threads, no transport, no GPU calls. See docs/profiling.md.
"""
