"""The MTP head's weights: the `mtp.*` tensors of a target checkpoint (HF dir, or a converted dir, which
keeps them in `mtp.safetensors`) -> `jaxspec.mtp.MTPHead`. Errors name the file and the key; every key, shape and
dtype is checked from the files' headers before any tensor is read."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
from flax import nnx

from convert.hf import (FLOAT_DTYPES, CheckpointError, ShardingSpec, assemble, mtp_tensor_infos, read_tensors,
                        resolve_sharding)
from convert.keys import MTP_PREFIX, target_layout, transform
from jaxspec.config import FULL, TargetConfig
from jaxspec.model import fuse_params, split_params
from jaxspec.mtp import MTPHead


def mtp_layout(cfg: TargetConfig) -> dict[str, tuple[tuple, tuple[int, ...], str]]:
    """Checkpoint key -> (param path in MTPHead, HF shape, transform), for the head of a target `cfg`."""
    d = cfg.hidden_size
    out = {
        MTP_PREFIX + "fc.weight": (("fc", "kernel"), (d, 2 * d), "linear"),
        MTP_PREFIX + "pre_fc_norm_embedding.weight": (("pre_fc_norm_embedding", "weight"), (d,), "copy"),
        MTP_PREFIX + "pre_fc_norm_hidden.weight": (("pre_fc_norm_hidden", "weight"), (d,), "copy"),
        MTP_PREFIX + "norm.weight": (("norm", "weight"), (d,), "copy"),
    }
    # layers.0 is a target full-attention decoder layer: the target's own table for one such layer.
    one = target_layout(cfg.replace(layer_types=(FULL,)))
    out.update({MTP_PREFIX + k: v for k, v in one.items() if k.startswith("layers.0.")})
    return out


def load_mtp(path: str | Path, target: TargetConfig, dtype: str | None = None,
             sharding: ShardingSpec = None) -> MTPHead:
    """The MTP head stored with the target in `path` (HF checkpoint dir or a `python -m convert target`
    dir), shaped by the target's config, params in `dtype` (default: the target's)."""
    path = Path(path)
    infos = mtp_tensor_infos(path)              # CheckpointError naming `path` when there are none
    cfg = target.replace(dtype=dtype or target.dtype)
    layout = mtp_layout(cfg)
    extra = sorted(k for k in infos if k not in layout)
    if extra:
        raise CheckpointError(f"{infos[extra[0]].file}: unexpected MTP tensor(s) {', '.join(map(repr, extra[:5]))}: "
                              f"jaxspec's MTP head has one full-attention layer (mtp.layers.0) and the keys "
                              f"{', '.join(k for k in layout if not k.startswith(MTP_PREFIX + 'layers.'))}")
    missing = [k for k in layout if k not in infos]
    if missing:
        raise CheckpointError(f"{path}: missing MTP tensor(s) {', '.join(map(repr, missing[:8]))}"
                              f"{' ...' if len(missing) > 8 else ''}")
    for key, (_, shape, _) in layout.items():
        info = infos[key]
        if info.shape != shape:
            raise CheckpointError(f"{info.file}: MTP tensor {key!r} has shape {list(info.shape)}, but the target's "
                                  f"config.json implies {list(shape)} (hidden_size={cfg.hidden_size})")
        if info.dtype not in FLOAT_DTYPES:
            raise CheckpointError(f"{info.file}: MTP tensor {key!r} is stored as {info.dtype}; only floating-point "
                                  f"({', '.join(FLOAT_DTYPES)}) heads are supported")

    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: MTPHead(cfg, rngs=nnx.Rngs(0))))
    flat = nnx.to_flat_state(abstract)
    abstract = split_params(cfg, {p: var.get_value() for p, var in flat})     # the checkpoint's separate kernels
    table = {entry[0] for entry in layout.values()}
    if table != set(abstract):  # mtp_layout and MTPHead disagree: a bug in jaxspec, not in the checkpoint
        raise RuntimeError(f"convert/mtp.py and jaxspec/mtp.py disagree: {sorted(set(abstract) ^ table)[:5]}")
    values = {}
    for key, a in read_tensors({k: infos[k] for k in layout}):
        p, _, kind = layout[key]
        want = abstract[p]
        x = jax.device_put(np.asarray(transform(a, kind)), resolve_sharding(sharding, p, want.shape))
        values[p] = x.astype(want.dtype)
    return assemble(graphdef, flat, fuse_params(cfg, values, lambda p, shape: resolve_sharding(sharding, p, shape)))
