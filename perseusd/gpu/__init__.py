"""GPU backends behind one small contract: `nvml` (real GPUs) and `sim` (simulated GPUs from real profiles)."""
