"""The layer sweep of the real-GPU check (`gpu_validate.py --layer-sweep`): per kind of computation, its
forward and backward time and energy at locked clocks, the curves `benchmarks/workload_family.py` composes
workloads from.

Kinds measured (bf16, one microbatch of `--seq` tokens at `--d-model`):

- `matmul`: an MLP block (d -> 4d -> d with GELU): compute-bound matrix multiplies;
- `attention`: `scaled_dot_product_attention` over 4 x `--seq` tokens, 32 heads, with its QKV projection;
- `memory`: LayerNorm and elementwise work (SiLU, residual add): memory-bound;
- `embedding`: an `nn.Embedding` lookup of the sequence, its dense gradient over the whole vocabulary;
- `lm_head`: the output projection to the vocabulary and cross-entropy;

the vocabulary kinds at each of `--vocabs` (default 32000 and 128256). Each row is the same measurement as the
check's ground-truth sweep (`gpu_validate_run.locked_sweep`: a window of at least 1 s at the counter's
updates). The MoE all-to-all is not measured (one GPU has no peer): the family keeps it synthesised.

Write the report with `--out docs/gpu-validate/layer-sweep-GPU-DATE.json`; the family reads every such file
in `docs/gpu-validate/` (`workload_family.measured_layer_kinds`) and names its kinds `GPU/kind` (for a
vocabulary kind, per vocabulary: `GPU/lm_head@128256`).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional

DEFAULT_VOCABS = (32_000, 128_256)
HEADS = 32
LONG_CONTEXT = 4


class _Mlp(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(functional.gelu(self.up(x)))


class _Attention(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, d = x.shape
        q, k, v = self.qkv(x).view(batch, seq, 3, HEADS, d // HEADS).permute(2, 0, 3, 1, 4)
        out = functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return out.transpose(1, 2).reshape(batch, seq, d)


class _Memory(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + functional.silu(self.norm(x)) * 0.5


class _Head(nn.Module):
    def __init__(self, d: int, vocab: int) -> None:
        super().__init__()
        self.proj = nn.Linear(d, vocab, bias=False)
        self.vocab = vocab

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.proj(x).float()
        labels = torch.arange(x.shape[1], device=x.device) % self.vocab
        return functional.cross_entropy(logits.view(-1, self.vocab), labels.repeat(x.shape[0]))


@dataclasses.dataclass(frozen=True)
class KindCase:
    """One kind to sweep: its name (with `@vocab` for vocabulary kinds), module and input."""

    name: str
    module: nn.Module
    make_input: Callable[[], torch.Tensor]


def kind_cases(d_model: int, seq: int, vocabs: tuple[int, ...], device: str = "cuda") -> list[KindCase]:
    """Every kind's module and input on `device` (bf16 on CUDA, float32 elsewhere: a CPU runs the code, not
    the measurement)."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)

    def activations(tokens: int) -> Callable[[], torch.Tensor]:
        return lambda: torch.randn(1, tokens, d_model, device=device, dtype=dtype, requires_grad=True)

    cases = [
        KindCase("matmul", _Mlp(d_model), activations(seq)),
        KindCase("attention", _Attention(d_model), activations(LONG_CONTEXT * seq)),
        KindCase("memory", _Memory(d_model), activations(seq)),
    ]
    for vocab in vocabs:
        tokens = torch.arange(seq, device=device) % vocab
        cases.append(KindCase(f"embedding@{vocab}", nn.Embedding(vocab, d_model), lambda t=tokens: t[None]))
        cases.append(KindCase(f"lm_head@{vocab}", _Head(d_model, vocab), activations(seq)))
    return [dataclasses.replace(c, module=c.module.to(device=device, dtype=dtype)) for c in cases]


def run_layer_sweep(args: argparse.Namespace) -> dict[str, Any]:
    """On the GPU: every kind at `--sweep-clocks` clocks (locked, then reset); the report."""
    from benchmarks.gpu_validate_run import locked_sweep, sweep_clocks
    from perseusd.gpu.nvml import NvmlBackend

    backend = NvmlBackend()
    try:
        device = backend.devices()[args.gpu]
        clocks = sweep_clocks(device, args.sweep_clocks)
        kinds: dict[str, list[dict[str, float]]] = {}
        for case in kind_cases(args.d_model, args.seq, args.vocabs):
            rows = locked_sweep(device, case.module, case.make_input(), clocks)
            kinds[case.name] = [dataclasses.asdict(row) for row in rows]
        gpu = device.info.name
    finally:
        backend.close()
    return {
        "benchmark": "gpu_validate",
        "mode": "layer_sweep",
        "ok": True,
        "gpu": gpu,
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "d_model": args.d_model,
        "seq": args.seq,
        "kinds": kinds,
    }
