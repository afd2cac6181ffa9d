"""What an emulated pipeline's real stage computes (`perseusd.emulate.torch_stage` runs it): it travels to the
stage process, so it holds no torch."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RealStageSpec:
    """The real stage's layers: `layers` GPT-like transformer layers (`torch.nn.TransformerEncoderLayer`,
    `d_model` wide, `d_model // 128` heads, bf16) over microbatches of one `seq`-token sequence."""

    layers: int = 4
    d_model: int = 4096
    seq: int = 2048
    device: str = "cuda"
    """"cuda" (the CUDA device whose UUID is the stage's GPU) or "cpu" (tests: the same code, no GPU)."""
