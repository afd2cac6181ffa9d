"""The simulated workload: a training process's computations on simulated GPUs (`--backend sim`).

`sim_costs` turns a measured profile into each computation's time and energy at a clock on a board;
`sim_workload` runs computations on one simulated GPU (`SimGpuHandle`), `sim_group` on a tensor-parallel
group of them. The daemon's simulated backend (`perseusd.gpu.sim`) holds no workload: these bring it.
"""
