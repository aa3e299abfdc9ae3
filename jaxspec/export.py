"""Flax -> Hugging Face safetensors: the inverse of convert/keys.py (target) and convert/drafter.py (drafter).

`export_target` writes the flat `qwen3_5_text` layout (config.json, model-0000i-of-0000n.safetensors shards of
at most `max_shard_bytes`, model.safetensors.index.json, generation_config.json); `export_drafter` writes z-lab's
DFlash layout (config.json + one flat-key model.safetensors). `convert.hf.load_target` and
`convert.drafter.load_drafter` read them back bit for bit (tests/test_train.py). A model in the tensor-parallel
layout of jaxspec/sharding.py (kv heads repeated, vocabulary padded) is written in the unsharded one (`unsharded`).
Tokenizer files are not written: the caller adds them (jaxspec/train.py `save_tokenizer`); those already in the
output dir stay.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path
from typing import Callable

import numpy as np
from flax import nnx
from safetensors.numpy import save_file

from jaxspec.config import FULL, LINEAR, TargetConfig
from jaxspec.drafter_config import DrafterConfig
from jaxspec.files import blocking_file, clear_leftovers, real_dir, replace_dir, temp_sibling

INDEX_NAME = "model.safetensors.index.json"
# Weights an export does not write but that a load would read with its own: an earlier model's MTP head
# (convert/hf.py MTP_FILE) goes with the rest of that model's weights.
STALE_WEIGHTS = ("mtp.safetensors",)


@contextlib.contextmanager
def staged_dir(out: str | Path, keep: Callable[[Path], bool] | None = None):
    """Write the directory `out` whole or not at all: yields a new temporary sibling to write into. On success the
    entries of an existing `out` that `keep(path)` accepts and that were not written anew are copied over, the old
    `out` is moved aside, the sibling renamed into place, and only then the old one removed. On an error (a full
    disk, an interrupt) the sibling is removed and `out` is as it was. What a killed export of `out` left beside it
    is cleared first (jaxspec/files.py `clear_leftovers`); an `out` that links to a dir writes that dir."""
    out = real_dir(out).absolute()      # `.` has no name to put the sibling's beside
    _check_not_a_file(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    clear_leftovers(out, "export")
    tmp = temp_sibling(out)
    tmp.mkdir()
    try:
        yield tmp
        if keep is not None and out.is_dir():
            for p in out.iterdir():
                if keep(p) and not (tmp / p.name).exists():
                    (shutil.copytree if p.is_dir() else shutil.copy2)(p, tmp / p.name)
        replace_dir(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _check_not_a_file(out: Path) -> None:
    """Refuse an `out` that is not a directory (it would be replaced by one) or that a file above keeps from being
    made."""
    blocking = blocking_file(out)
    if blocking is not None and blocking == out.absolute():
        raise FileExistsError(f"{out}: not replaced: it is {'a file' if out.is_file() else 'not a directory'}, "
                              "not an export dir")
    if blocking is not None:
        raise NotADirectoryError(f"{out}: cannot be created: {blocking} is not a directory")


def check_export_dir(out: str | Path) -> None:
    """Refuse an `out` that an export must not write: not a directory (`_check_not_a_file`), or a converted
    checkpoint dir (jaxspec.json, params/). As `convert --overwrite` never replaces a dir of another kind, the
    converted one is left whole: remove it yourself or choose another output dir."""
    from convert.store import META, PARAMS      # what makes a dir a converted checkpoint; a load reads its params/
    out = Path(out)
    _check_not_a_file(out)
    found = [name + ("/" if (out / name).is_dir() else "") for name in (META, PARAMS)
             if (out / name).exists() or (out / name).is_symlink()]
    if found:
        raise FileExistsError(f"{out}: not replaced: it holds a converted checkpoint ({', '.join(found)}), whose "
                              "Orbax params a load would read instead of the exported weights; remove it yourself "
                              "or choose another output dir")


def _weights_file(p: Path) -> bool:
    """Whether `p` is one of the files an export writes its weights to (one file, or shards and their index)."""
    return p.name in ("model.safetensors", INDEX_NAME) or (p.name.startswith("model-") and p.suffix == ".safetensors")


def _stale(p: Path) -> bool:
    """Whether `p` holds weights that must not survive an export: an earlier export's, or another model's."""
    return _weights_file(p) or p.name in STALE_WEIGHTS


def _flat(model) -> dict[tuple, np.ndarray]:
    return {p: np.asarray(v.get_value()) for p, v in nnx.to_flat_state(nnx.state(model))}


def unsharded(model) -> tuple:
    """(config, {param path: host array}) of `model` (target or drafter) in the unsharded layout: for a model in
    the tp-way layout of jaxspec/sharding.py (config `tp_config(cfg, tp)`), sharding's own `tp_index` undone, so
    the padded vocabulary rows are dropped and the repeated kv heads kept once.

    tp_config sets num_kv_heads to tp where it repeats them, so the count they were repeated from is not in the
    config: it is the fewest kv heads whose repetition gives the stored k/v weights bit for bit (its copies of a
    head are identical; were a model's own heads identical too, the fewer heads compute the same). Params on a
    mesh but not in that layout, or whose copies differ (trained apart), are written as they are: `cfg` describes
    them (less any padded vocabulary rows, which `_untransform` drops)."""
    from jaxspec import sharding as S
    cfg, flat, tp = model.cfg, _flat(model), S.model_tp_degree(model)
    base = cfg.replace(padded_vocab=0) if getattr(cfg, "padded_vocab", 0) else cfg
    if tp == 1:
        return base, flat
    fewer = [k for k in range(1, tp) if tp % k == 0 and cfg.num_heads % k == 0] if cfg.num_kv_heads == tp else []
    for src in [base.replace(num_kv_heads=k) for k in fewer] + [base]:
        if S.tp_config(src, tp) == cfg:
            values = S.from_tp_layout(src, tp, flat)
            if values is not None:
                return src, values
    return base, flat


def _full_attention_period(layer_types) -> int | None:
    """k where every k-th layer (and only those) is full attention, as transformers' `full_attention_interval`
    lays them out; None where the layer types follow no such period."""
    n = len(layer_types)
    for k in range(1, n + 1):
        if tuple(layer_types) == tuple(FULL if (i + 1) % k == 0 else LINEAR for i in range(n)):
            return k
    return None


def target_hf_config(cfg: TargetConfig) -> dict:
    """A flat `qwen3_5_text` config.json that `jaxspec.config.target_config_from_hf` reads back to `cfg`."""
    return {
        "architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text",
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers, "layer_types": list(cfg.layer_types),
        "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
        "linear_num_key_heads": cfg.linear_num_key_heads, "linear_num_value_heads": cfg.linear_num_value_heads,
        "linear_key_head_dim": cfg.linear_key_head_dim, "linear_value_head_dim": cfg.linear_value_head_dim,
        "linear_conv_kernel_dim": cfg.conv_kernel, "hidden_act": "silu", "attention_bias": False,
        "rms_norm_eps": cfg.rms_norm_eps, "tie_word_embeddings": cfg.tie_word_embeddings,
        # Only where the layer types have that period (readers take layer_types first; some read only this).
        **({"full_attention_interval": period} if (period := _full_attention_period(cfg.layer_types)) else {}),
        # Written only where the model has a limit: 0 (none known, e.g. jaxspec.train's targets) reads back as 0.
        **({"max_position_embeddings": cfg.max_position_embeddings} if cfg.max_position_embeddings else {}),
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta,
                            "partial_rotary_factor": cfg.rotary_dim / cfg.head_dim},
        "eos_token_id": list(cfg.eos_token_ids)[0] if cfg.eos_token_ids else None,
        "dtype": cfg.dtype,
    }


def target_tensors(model) -> dict[str, np.ndarray]:
    """HF key -> array (stored dtype = the model's), keys as Qwen3_5ForCausalLM saves them; the unsharded layout
    (`unsharded`)."""
    return _target_tensors(*unsharded(model))


def _target_tensors(cfg: TargetConfig, flat: dict) -> dict[str, np.ndarray]:
    from convert.keys import target_layout, transform
    from jaxspec.model import split_params
    flat = split_params(cfg, flat)                        # the checkpoint's separate kernels
    out = {}
    for name, (path, shape, kind) in target_layout(cfg).items():
        a = _untransform(flat[path], kind, shape)
        # The loader's own transform must give back exactly what the model holds.
        back, held = np.ascontiguousarray(transform(a, kind)), np.ascontiguousarray(flat[path])
        if back.shape == held.shape and not np.array_equal(back.view(np.uint8), held.view(np.uint8)):
            raise RuntimeError(f"export of {name}: not the inverse of convert/keys.py's transform {kind!r}")
        out[name if name == "lm_head.weight" else "model." + name] = np.ascontiguousarray(a)
    return out


def _untransform(a: np.ndarray, kind, shape) -> np.ndarray:
    """The inverse of convert.keys.transform: kind 'linear' / 'conv' / 'copy', or a tuple (base, *gdn groups)
    whose rows (linear) / channels (conv) the loader reorders into key-head-group order."""
    base, groups = (kind[0], tuple(kind[1:])) if isinstance(kind, tuple) else (kind, ())
    if base == "linear":
        a = a.T
    elif base == "conv":                           # [K, C] -> [C, 1, K]
        a = a.T[:, None, :]
    if a.shape[0] != shape[0] and len(shape) == 2 and base != "conv":
        a = a[:shape[0]]                           # a padded vocabulary (tensor parallelism): drop the pad rows
    if groups:
        from convert.keys import gdn_channel_order
        a = a[np.argsort(gdn_channel_order(*groups))]
    if a.shape != tuple(shape):
        raise RuntimeError(f"export: shape {a.shape}, the checkpoint layout says {tuple(shape)}")
    return a


def save_shards(tensors: dict[str, np.ndarray], out: Path, max_shard_bytes: int) -> None:
    """model-0000i-of-0000n.safetensors shards of at most max_shard_bytes (a larger tensor gets one alone), keys
    in sorted order, and the model.safetensors.index.json naming each key's shard."""
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for key in sorted(tensors):
        nbytes = tensors[key].nbytes
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][key] = tensors[key]
        size += nbytes
    n = len(shards)
    weight_map = {}
    for i, shard in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        save_file(shard, str(out / name), metadata={"format": "pt"})
        weight_map.update({k: name for k in shard})
    index = {"metadata": {"total_size": int(sum(t.nbytes for t in tensors.values()))}, "weight_map": weight_map}
    (out / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")


def export_target(model, out_dir: str | Path, *, max_shard_bytes: int = 10 * 2**20) -> Path:
    """Write the target as a HF checkpoint (sharded safetensors + index + config.json + generation_config.json).
    Tokenizer files are the caller's business (those already in out_dir stay). Written into a new sibling renamed
    into place (`staged_dir`): a failed export leaves the previous one whole; other files already in out_dir stay,
    but not weights (an earlier model's mtp.safetensors included). Refused (`check_export_dir`): an out_dir that is
    a file, or a converted checkpoint dir. A tensor-parallel model is written in the unsharded layout
    (`unsharded`)."""
    out = Path(out_dir)
    check_export_dir(out)
    cfg, flat = unsharded(model)
    tensors = _target_tensors(cfg, flat)
    own = lambda p: _stale(p) or p.name in ("config.json", "generation_config.json")
    with staged_dir(out, keep=lambda p: not own(p)) as tmp:
        save_shards(tensors, tmp, max_shard_bytes)
        (tmp / "config.json").write_text(json.dumps(target_hf_config(cfg), indent=2) + "\n")
        gen = {"eos_token_id": list(cfg.eos_token_ids), "do_sample": False}
        (tmp / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    return out


def drafter_hf_config(cfg: DrafterConfig, num_target_layers: int) -> dict:
    """z-lab's DFlash config.json (read by `jaxspec.drafter_config.drafter_config_from_hf` back to `cfg`)."""
    hf = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers, "layer_types": list(cfg.layer_types),
        "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
        "rope_theta": cfg.rope_theta, "rms_norm_eps": cfg.rms_norm_eps, "hidden_act": "silu",
        "attention_bias": False, "num_target_layers": num_target_layers, "block_size": cfg.block_size,
        "use_sliding_window": cfg.sliding_window is not None, "sliding_window": cfg.sliding_window,
        "dflash_config": {"mask_token_id": cfg.mask_token_id, "target_layer_ids": list(cfg.target_layer_ids),
                          "block_size": cfg.block_size},
        "dtype": cfg.dtype,
    }
    if cfg.is_causal is not None:
        hf["is_causal"] = cfg.is_causal
    return hf


def export_drafter(drafter, out_dir: str | Path, *, num_target_layers: int, max_shard_bytes: int | None = None) -> Path:
    """Write the drafter as config.json + one model.safetensors with z-lab's flat keys; with max_shard_bytes, a
    drafter larger than that goes to shards of at most that size and an index instead (e.g. for a repository
    that takes files of <= 16 MB), which `convert.drafter.load_drafter` reads too. Written into a new sibling
    renamed into place (`staged_dir`): a failed export leaves the previous one whole; other files already in out_dir
    stay, but not weights in the other layout (they would be read instead of, or beside, these). Refused and written
    in the unsharded layout as by `export_target`."""
    from convert.drafter import WEIGHTS, drafter_layout
    out = Path(out_dir)
    check_export_dir(out)
    cfg, flat = unsharded(drafter)
    tensors = {}
    for key, (path, shape, transpose) in drafter_layout(cfg).items():
        a = flat[path].T if transpose else flat[path]
        assert a.shape == shape, (key, a.shape, shape)
        tensors[key] = np.ascontiguousarray(a)
    with staged_dir(out, keep=lambda p: not (_stale(p) or p.name in (WEIGHTS, "config.json"))) as tmp:
        if max_shard_bytes is not None and sum(t.nbytes for t in tensors.values()) > max_shard_bytes:
            save_shards(tensors, tmp, max_shard_bytes)
        else:
            save_file(tensors, str(tmp / WEIGHTS), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(drafter_hf_config(cfg, num_target_layers), indent=2) + "\n")
    return out


__all__ = ["export_target", "export_drafter", "save_shards", "staged_dir", "target_hf_config", "drafter_hf_config",
           "target_tensors", "unsharded", "check_export_dir", "FULL"]
