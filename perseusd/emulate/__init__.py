"""`perseus-emulate`: an emulated pipeline-parallel training job that exercises perseusd's whole closed loop.

One real OS process per pipeline stage runs its schedule's computations on its own simulated GPU
(`perseusd.workload.sim_workload`), with the real dependencies between neighbouring stages, and talks to the
daemon through the real client library. The coordinator measures a baseline at all-max clocks, then lets the
daemon profile, solve and run its plan, and reports the energy saved (from the GPUs' energy counters).
"""
