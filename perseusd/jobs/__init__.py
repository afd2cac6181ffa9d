"""Jobs: what the daemon does by itself for a training job (registration -> online profiling -> solving ->
running a per-computation plan), without transport: the daemon core calls the `JobManager`.
"""
