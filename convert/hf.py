"""Load a Hugging Face Qwen3.5/3.6 checkpoint (single or sharded safetensors) into the Flax model."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors import safe_open

from convert.keys import strip_text_prefix, target_layout, transform
from jaxspec.config import TargetConfig, load_target_config
from jaxspec.model import Qwen35


class CheckpointError(ValueError):
    """A checkpoint jaxspec refuses to load; the message names the file and the key."""


def shard_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as e:
            raise CheckpointError(f"{index}: not a valid safetensors index ({e})") from None
        files = sorted({model_dir / f for f in weight_map.values()})
    else:
        files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        pickles = sorted(p.name for p in model_dir.glob("*") if p.suffix in (".bin", ".pt", ".pth", ".ckpt"))
        if pickles:
            raise CheckpointError(f"{model_dir}: only pickle checkpoints ({', '.join(pickles)}); jaxspec refuses "
                                  "them because loading pickle runs arbitrary code. Convert them to safetensors.")
        raise CheckpointError(f"{model_dir}: no *.safetensors files and no model.safetensors.index.json")
    for f in files:
        if not f.exists():
            raise CheckpointError(f"{f}: listed in the index but missing")
    return files


def abstract_model(cfg: TargetConfig):
    return nnx.eval_shape(lambda: Qwen35(cfg, rngs=nnx.Rngs(0)))


def load_target(model_dir: str | Path, *, dtype: str | None = None) -> Qwen35:
    model_dir = Path(model_dir)
    cfg = load_target_config(model_dir, dtype=dtype)
    layout = target_layout(cfg)
    graphdef, abstract = nnx.split(abstract_model(cfg))
    flat = dict(nnx.to_flat_state(abstract))
    seen: dict[str, Path] = {}
    values = {}
    for f in shard_files(model_dir):
        with safe_open(str(f), framework="flax") as sf:
            for key in sf.keys():
                name = strip_text_prefix(key)
                if name is None:
                    continue
                if name not in layout:
                    raise CheckpointError(f"{f}: unexpected tensor {key!r} for this config")
                path, shape, kind = layout[name]
                arr = sf.get_tensor(key)
                if tuple(arr.shape) != shape:
                    raise CheckpointError(f"{f}: tensor {key!r} has shape {tuple(arr.shape)}, config expects {shape}")
                values[path] = transform(arr, kind).astype(cfg.jnp_dtype)
                seen[name] = f
    missing = sorted(set(layout) - set(seen))
    if missing:
        raise CheckpointError(f"{model_dir}: missing tensors {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    for path, var in flat.items():
        var.set_value(values[path]) if hasattr(var, "set_value") else setattr(var, "value", values[path])
    return nnx.merge(graphdef, nnx.from_flat_state(flat))


