"""GPU backends behind one small contract: `nvml` (real GPUs) and `sim` (simulated, from real profiles)."""
