"""Read and write EAGLE-3 head directories (config.json + model.safetensors or pytorch_model.bin).

    head = load_eagle3("path/to/head", target_spec, dtype=torch.bfloat16, device="cuda")
    head.config        # Eagle3Config (either layout)
    head.weights       # Eagle3Weights (fused, on device)
    head.layer_ids     # the target hidden states to record, resolved for the target

Every inconsistency is one `CheckpointError` line naming the file and the tensor or field: a
missing or misshapen tensor, a vocabulary or hidden size that differs from the target's
LlamaSpec, target layer ids out of range, an unknown architecture or layout.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from graphrt.checkpoint.hf_files import CheckpointError, present, read_json, reading
from graphrt.speculative.eagle3.config import Eagle3Config, parse_config
from graphrt.speculative.eagle3.weights import Eagle3Weights, from_layout, fuse, to_layout

SAFETENSORS, TORCH_BIN = "model.safetensors", "pytorch_model.bin"


@dataclass(frozen=True)
class Eagle3Checkpoint:
    """A loaded head: where from, its config, fused weights, and the target layers it reads."""
    path: Path
    config: Eagle3Config
    weights: Eagle3Weights
    layer_ids: tuple[int, ...]


def weights_file(path: Path) -> Path:
    """model.safetensors, else pytorch_model.bin; CheckpointError when neither exists."""
    for name in (SAFETENSORS, TORCH_BIN):
        if (path / name).is_file():
            return path / name
    raise CheckpointError(f"{path}: no {SAFETENSORS} and no {TORCH_BIN}")


def read_head(path) -> tuple[dict, Eagle3Config, dict[str, torch.Tensor]]:
    """(raw config.json, Eagle3Config, CPU tensors under original-layout names) of a head dir."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"draft model: {str(path)!r} is not a directory")
    cfg_file = path / "config.json"
    if not present(cfg_file):
        raise CheckpointError(f"{cfg_file}: missing (an EAGLE-3 head needs config.json)")
    raw = read_json(cfg_file)
    cfg = parse_config(raw, cfg_file)
    f = weights_file(path)
    with reading(f, "reading tensors"):
        if f.name == SAFETENSORS:
            from safetensors.torch import load_file
            stored = load_file(str(f), device="cpu")
        else:
            stored = torch.load(str(f), map_location="cpu", weights_only=True)
    if not isinstance(stored, dict) or not all(isinstance(v, torch.Tensor) for v in stored.values()):
        raise CheckpointError(f"{f}: expected a flat mapping of tensor names to tensors")
    tensors = {}
    for name, t in stored.items():
        if cfg.layout == "original" and name.startswith("layers."):
            raise CheckpointError(f"{f}: tensor {name!r} is a speculators-layout name, but config.json is "
                                  "the original layout (no speculators_model_type)")
        if cfg.layout == "speculators" and name.startswith("midlayer."):
            raise CheckpointError(f"{f}: tensor {name!r} is an original-layout name, but config.json is "
                                  "the speculators layout")
        tensors[from_layout(name, cfg.layout)] = t
    return raw, cfg, tensors


def load_eagle3(path, target_spec, *, dtype: torch.dtype = torch.float32, device="cpu") -> Eagle3Checkpoint:
    """An EAGLE-3 head directory (either layout) checked against the target's LlamaSpec and
    fused onto `device` in `dtype`; CheckpointError naming the file and tensor / field."""
    path = Path(path)
    _, cfg, tensors = read_head(path)
    ids = cfg.check_target(target_spec, str(path / "config.json"))
    weights = fuse(cfg, tensors, dtype=dtype, device=device, where=str(weights_file(path)))
    return Eagle3Checkpoint(path=path, config=cfg, weights=weights, layer_ids=ids)


def write_head(path, raw_config: dict, tensors: dict[str, torch.Tensor], layout: str) -> Path:
    """config.json + model.safetensors in `layout` (tensors given under original-layout names)."""
    from safetensors.torch import save_file
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    out = {to_layout(n, layout): t.detach().to("cpu").contiguous() for n, t in tensors.items()}
    save_file(out, str(path / SAFETENSORS), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(raw_config, indent=2) + "\n")
    return path


__all__ = ["Eagle3Checkpoint", "load_eagle3", "read_head", "write_head", "weights_file"]
