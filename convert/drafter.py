"""The DFlash drafter: load a z-lab checkpoint (config.json + one flat-key model.safetensors, or shards of it with
an index) into `Drafter`, save it to / restore it from jaxspec's Orbax layout (convert/store.py), and
`load_draft` for either.

A converted drafter dir holds config.json (copied byte for byte), jaxspec.json (format "jaxspec-drafter")
and params/ (Orbax); it is written atomically by the same code as the target's.
"""

from __future__ import annotations

from pathlib import Path

from flax import nnx
from safetensors import safe_open

from convert import store
from convert.hf import (DRAFTER_FORMAT, FLOAT_DTYPES, INDEX_NAME, PICKLE_SUFFIXES, WEIGHTS_NAME, CheckpointError,
                        refuse_converted, scan)
from jaxspec.drafter import Drafter
from jaxspec.drafter_config import DrafterConfig, load_drafter_config

WEIGHTS = WEIGHTS_NAME


def drafter_layout(cfg: DrafterConfig) -> dict[str, tuple[tuple, tuple[int, ...], bool]]:
    """Checkpoint key -> (param path in the NNX state, checkpoint shape, transpose [out, in] -> [in, out])."""
    d, hd, f = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    out: dict[str, tuple[tuple, tuple[int, ...], bool]] = {
        "fc.weight": (("fc", "kernel"), (d, cfg.n_taps * d), True),
        "hidden_norm.weight": (("hidden_norm", "weight"), (d,), False),
        "norm.weight": (("norm", "weight"), (d,), False),
    }
    for i in range(cfg.num_layers):
        p, L = f"layers.{i}.", ("layers", i)
        shapes = {
            "self_attn.q_proj": (cfg.num_heads * hd, d), "self_attn.k_proj": (cfg.num_kv_heads * hd, d),
            "self_attn.v_proj": (cfg.num_kv_heads * hd, d), "self_attn.o_proj": (d, cfg.num_heads * hd),
            "mlp.gate_proj": (f, d), "mlp.up_proj": (f, d), "mlp.down_proj": (d, f),
        }
        for name, shape in shapes.items():
            out[p + name + ".weight"] = (L + tuple(name.split(".")) + ("kernel",), shape, True)
        for name, dim in (("input_layernorm", d), ("post_attention_layernorm", d),
                          ("self_attn.q_norm", hd), ("self_attn.k_norm", hd)):
            out[p + name + ".weight"] = (L + tuple(name.split(".")) + ("weight",), (dim,), False)
    return out


def weights_files(model_dir: Path) -> list[Path]:
    """z-lab's one model.safetensors, else the shards its model.safetensors.index.json lists (checked against
    their headers: each key in the shard the index names). Both at once is refused as by the target's loader
    (convert/hf.py `shard_files`), unless the index lists model.safetensors."""
    if (model_dir / INDEX_NAME).exists():
        return sorted({info.file for info in scan(model_dir).values()})
    f = model_dir / WEIGHTS
    if f.is_file():
        return [f]
    if list(model_dir.glob("*.safetensors")):
        found = sorted(p.name for p in model_dir.glob("*.safetensors*"))
        raise CheckpointError(f"{model_dir}: expected {WEIGHTS} (the DFlash drafter layout) or shards with "
                              f"{INDEX_NAME}, found {found}")
    pickles = sorted(p.name for p in model_dir.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise CheckpointError(f"{model_dir}: only pickle checkpoints ({', '.join(pickles)}); jaxspec refuses them "
                              "because loading pickle runs arbitrary code. Convert them to safetensors.")
    raise CheckpointError(f"{model_dir}: no {WEIGHTS}")


def load_drafter(model_dir: str | Path, *, dtype: str | None = None) -> Drafter:
    """The drafter in `model_dir` (config.json + model.safetensors), params cast to `dtype` (default: the
    config's dtype). Raises ConfigError / CheckpointError naming the file and the field or key."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise CheckpointError(f"{model_dir}: not a directory")
    refuse_converted(model_dir)
    cfg = load_drafter_config(model_dir, dtype=dtype)
    files = weights_files(model_dir)
    layout = drafter_layout(cfg)
    graphdef, flat = abstract_drafter(cfg)
    flat = dict(flat)
    values = {}
    for f in files:
        try:
            sf_ctx = safe_open(str(f), framework="flax")
        except Exception as e:  # safetensors raises its own error types for a corrupt header
            raise CheckpointError(f"{f}: not a readable safetensors file ({e})") from None
        with sf_ctx as sf:
            for key in sf.keys():
                if key not in layout:
                    hint = " (the drafter has no embedding or lm_head; it uses the target's)" if (
                        "embed" in key or "lm_head" in key) else ""
                    raise CheckpointError(f"{f}: unexpected tensor {key!r} for this config{hint}")
                path, shape, transpose = layout[key]
                # From the header, before the read: numpy has no type for some stored dtypes (F8_E4M3, ...).
                header = sf.get_slice(key)
                stored_shape, stored = tuple(header.get_shape()), header.get_dtype()
                if stored_shape != shape:
                    raise CheckpointError(f"{f}: tensor {key!r} has shape {stored_shape}, config expects {shape}")
                if stored not in FLOAT_DTYPES:
                    raise CheckpointError(f"{f}: tensor {key!r} is stored as {stored}; only floating-point "
                                          f"({', '.join(FLOAT_DTYPES)}) drafters are supported (a quantized "
                                          "drafter must be dequantized first)")
                arr = sf.get_tensor(key)
                values[path] = (arr.T if transpose else arr).astype(cfg.jnp_dtype)
    missing = sorted(k for k, (path, _, _) in layout.items() if path not in values)
    if missing:
        where = files[0] if len(files) == 1 else model_dir / INDEX_NAME
        raise CheckpointError(f"{where}: missing tensors {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    for path, var in flat.items():
        var.set_value(values[path])
    return nnx.merge(graphdef, nnx.from_flat_state(flat))


def abstract_drafter(cfg: DrafterConfig):
    """(graphdef, flat state of abstract variables) of the drafter, without allocating it."""
    graphdef, state = nnx.split(nnx.eval_shape(lambda: Drafter(cfg, rngs=nnx.Rngs(0))))
    return graphdef, nnx.to_flat_state(state)


DRAFTER = store.Kind("drafter", DRAFTER_FORMAT, 1, lambda path, dtype: load_drafter_config(path, dtype=dtype),
                     abstract_drafter, writer="save_drafter")


def save_drafter(drafter: Drafter, out_dir: str | Path, hf_dir: str | Path, *, overwrite: bool = False,
                 progress: bool = False) -> Path:
    """Write `drafter` (loaded from the HF dir `hf_dir`) to `out_dir` as config.json + params/, atomically:
    `out_dir` is the complete result or untouched; an existing one is replaced only with `overwrite=True`."""
    return store.save(DRAFTER, drafter, out_dir, hf_dir, overwrite=overwrite, progress=progress)


def restore_drafter(out_dir: str | Path, *, dtype: str | None = None,
                    sharding: store.ShardingSpec = None, progress: bool | None = None) -> Drafter:
    """The drafter from a dir written by `save_drafter`, read straight into `dtype` (default: the saved one).
    progress: as `store.restore`'s."""
    return store.restore(DRAFTER, out_dir, dtype=dtype, sharding=sharding, progress=progress)


def load_draft(path: str | Path, dtype: str | None = None) -> Drafter:
    """The drafter from either a converted dir (has `params/`, as for the target) or a HF drafter dir."""
    if store.is_converted(path):
        return restore_drafter(path, dtype=dtype)
    return load_drafter(path, dtype=dtype)
