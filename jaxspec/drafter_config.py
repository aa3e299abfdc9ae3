"""The DFlash drafter's config, read from its ``config.json`` (z-lab layout, reference/dflash.md section 3).

Resolution rules follow z-lab's reference package (``dflash.model``, PyPI 0.1.0):
- DFlash keys (``mask_token_id``, ``target_layer_ids``, ``block_size``) come from ``dflash_config`` first,
  then the top level;
- a top-level ``is_causal`` overrides every layer; without it, sliding layers are causal and full layers
  bidirectional (the Qwen3.6 drafter has no ``is_causal`` key and relies on this);
- ``sliding_window`` only counts when ``use_sliding_window`` is true (HF ``Qwen3Config`` nulls it otherwise); then
  an absent one is Qwen3Config's default 4096 and a null one means no window;
- ``rope_theta`` may sit at the top level or under ``rope_parameters`` (transformers 5 moves it there).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import jax.numpy as jnp

from jaxspec import config
from jaxspec.config import FULL, ConfigError, TargetConfig, load_json

SLIDING = "sliding_attention"


@dataclasses.dataclass(frozen=True)
class DrafterConfig:
    """Hashable, so it is static under jit."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    layer_types: tuple[str, ...]
    rope_theta: float
    target_layer_ids: tuple[int, ...]
    mask_token_id: int
    block_size: int = 16
    sliding_window: int | None = None   # None: sliding layers are unwindowed (use_sliding_window false)
    is_causal: bool | None = None       # explicit override for all layers; None: by layer type
    rms_norm_eps: float = 1e-6
    dtype: str = "bfloat16"
    # The depth of the target it was trained for (config.json's num_target_layers; None when a config lacks it).
    # Metadata, not architecture: left out of == and the hash, so a config built in code equals the one read back.
    num_target_layers: int | None = dataclasses.field(default=None, compare=False)

    @property
    def num_layers(self) -> int:
        return len(self.layer_types)

    @property
    def n_taps(self) -> int:
        return len(self.target_layer_ids)

    @property
    def jnp_dtype(self):
        return jnp.dtype(self.dtype)

    @property
    def causal(self) -> tuple[bool, ...]:
        if self.is_causal is not None:
            return (bool(self.is_causal),) * self.num_layers
        return tuple(t == SLIDING for t in self.layer_types)

    @property
    def windows(self) -> tuple[int | None, ...]:
        return tuple(self.sliding_window if t == SLIDING else None for t in self.layer_types)

    def replace(self, **kw) -> "DrafterConfig":
        return dataclasses.replace(self, **kw)

    def __post_init__(self):
        for t in self.layer_types:
            if t not in (FULL, SLIDING):
                raise ConfigError(f"layer_types: unknown layer type {t!r} (expected {SLIDING!r} or {FULL!r})")
        if not self.layer_types:
            raise ConfigError("num_hidden_layers must be positive")
        # Errors use the config.json field names.
        for name, field in (("vocab_size", "vocab_size"), ("hidden_size", "hidden_size"),
                            ("intermediate_size", "intermediate_size"), ("num_heads", "num_attention_heads"),
                            ("num_kv_heads", "num_key_value_heads"), ("head_dim", "head_dim"),
                            ("block_size", "block_size")):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{field} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(f"num_attention_heads ({self.num_heads}) is not a multiple of "
                              f"num_key_value_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ConfigError(f"head_dim must be even for rotate_half RoPE, got {self.head_dim}")
        if self.sliding_window is not None and self.sliding_window <= 0:
            raise ConfigError(f"sliding_window must be positive, got {self.sliding_window}")
        if not self.target_layer_ids or min(self.target_layer_ids) < 0:
            raise ConfigError(f"target_layer_ids must be a non-empty list of non-negative layer ids, "
                              f"got {list(self.target_layer_ids)}")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ConfigError(f"mask_token_id {self.mask_token_id} is outside the vocabulary [0, {self.vocab_size})")
        if self.block_size < 2:
            raise ConfigError(f"block_size must be at least 2 (anchor + one draft), got {self.block_size}")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ConfigError(f"dtype {self.dtype!r} is not one of float32, bfloat16, float16")


def _default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab's default taps: uniform from layer 1 to layer L-3 (reference/dflash.md section 1.3)."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [round(1 + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers)]


_TARGET_ARCHITECTURES = ("ForCausalLM", "ForConditionalGeneration")


def _target_model(hf: dict[str, Any]) -> str:
    """What marks `hf` as a target model's config rather than a drafter's ("" if nothing does): a Qwen3.5/3.6
    model_type, or architectures naming a causal LM, without any of the DFlash keys."""
    if any(k in hf for k in ("dflash_config", "mask_token_id", "target_layer_ids")):
        return ""
    model_type, archs = hf.get("model_type"), hf.get("architectures")
    archs = [a for a in archs if isinstance(a, str)] if isinstance(archs, list) else []
    if model_type in ("qwen3_5", "qwen3_5_text"):
        return f"model_type {model_type!r}"
    named = [a for a in archs if a.endswith(_TARGET_ARCHITECTURES)]
    return f"architectures {named}" if named else ""


def drafter_config_from_hf(hf: dict[str, Any], *, dtype: str | None = None,
                           source: str = "config.json") -> DrafterConfig:
    """Build a DrafterConfig from the drafter's HF config dict. Errors name `source` and the field."""
    if not isinstance(hf, dict):
        raise ConfigError(f"{source}: expected a JSON object, got {type(hf).__name__}")
    target = _target_model(hf)
    if target:
        raise ConfigError(f"{source}: describes a target checkpoint ({target}), not a DFlash drafter (it has no "
                          "dflash_config, mask_token_id or target_layer_ids); pass the drafter's checkpoint dir")
    dflash = hf.get("dflash_config") or {}
    if not isinstance(dflash, dict):
        raise ConfigError(f"{source}: dflash_config must be an object, got {type(dflash).__name__}")
    if any(k in dflash or k in hf for k in ("conv_kernel_size", "selector_rank")):
        raise ConfigError(f"{source}: a DFlash-2 drafter (conv_kernel_size / selector_rank); only the DFlash-1 "
                          "architecture is supported")

    def where(key):
        return f"dflash_config.{key}" if key in dflash else key

    def raw(key, *, draft=False):
        if draft and key in dflash:
            return dflash[key]
        return hf.get(key)

    def need(key, *, draft=False):
        v = raw(key, draft=draft)
        if v is None:
            extra = " (looked in dflash_config and at the top level)" if draft else ""
            raise ConfigError(f"{source}: missing field {key!r}{extra}")
        return v

    def as_int(key, v):
        return config.as_int(source, key, v)

    def as_float(key, v):
        return config.as_float(source, key, v)

    def as_bool(key, v):
        return config.as_bool(source, key, v)

    req = lambda key: as_int(key, need(key))
    n_layers = req("num_hidden_layers")
    if n_layers <= 0:
        raise ConfigError(f"{source}: num_hidden_layers must be positive, got {n_layers}")
    if "head_dim" not in hf:
        # HF Qwen3Config would silently default to 128, whatever hidden_size / heads are.
        raise ConfigError(f"{source}: missing field 'head_dim'")

    use_sw = as_bool("use_sliding_window", hf.get("use_sliding_window", False))
    window = None
    if use_sw:      # as HF Qwen3Config: an absent window is its default 4096, a null one means no window
        window = hf.get("sliding_window", 4096)
    if window is not None:
        window = as_int("sliding_window", window)
        if window <= 0:
            raise ConfigError(f"{source}: sliding_window must be positive, got {window}")

    layer_types = hf.get("layer_types")
    if layer_types is None:
        # HF Qwen3Config's derivation: layers from max_window_layers on slide when a window is set.
        first = as_int("max_window_layers", hf.get("max_window_layers", 28))
        layer_types = [SLIDING if window is not None and i >= first else FULL for i in range(n_layers)]
    if not isinstance(layer_types, list) or len(layer_types) != n_layers:
        raise ConfigError(f"{source}: layer_types must be a list of {n_layers} entries (num_hidden_layers), "
                          f"got {layer_types!r}")
    for t in layer_types:
        if t not in (FULL, SLIDING):
            raise ConfigError(f"{source}: layer_types: unknown layer type {t!r} (expected {SLIDING!r} or {FULL!r})")

    rope = config.rope_section(source, hf)
    theta = rope.get("rope_theta", hf.get("rope_theta"))
    if theta is None:
        raise ConfigError(f"{source}: missing field 'rope_theta' (looked in rope_parameters, rope_scaling and at "
                          "the top level)")
    theta = as_float("rope_theta", theta)
    if theta <= 0:
        raise ConfigError(f"{source}: rope_theta must be positive, got {theta}")

    is_causal = hf.get("is_causal")
    if is_causal is not None:
        is_causal = as_bool("is_causal", is_causal)

    n_target = hf.get("num_target_layers")
    if n_target is not None:
        n_target = as_int("num_target_layers", n_target)
        if n_target <= 0:
            raise ConfigError(f"{source}: num_target_layers must be positive, got {n_target}")
    ids = raw("target_layer_ids", draft=True)
    if ids is None:
        if n_target is None:
            raise ConfigError(f"{source}: missing field 'target_layer_ids' (looked in dflash_config and at the "
                              "top level; 'num_target_layers' to derive the default is missing too)")
        ids = _default_target_layer_ids(n_target, n_layers)
        if min(ids) < 0:
            raise ConfigError(f"{source}: no field 'target_layer_ids', and the default taps of {n_layers} draft "
                              f"layers over num_target_layers = {n_target} are not layers ({ids}); give "
                              "target_layer_ids")
    if not isinstance(ids, list) or not ids:
        raise ConfigError(f"{source}: field {where('target_layer_ids')!r} must be a non-empty list, got {ids!r}")
    ids = tuple(as_int(where("target_layer_ids"), i) for i in ids)
    if min(ids) < 0:
        raise ConfigError(f"{source}: field {where('target_layer_ids')!r} has a negative layer id: {list(ids)}")

    vocab = req("vocab_size")
    mask = as_int(where("mask_token_id"), need("mask_token_id", draft=True))
    if not 0 <= mask < vocab:
        raise ConfigError(f"{source}: field {where('mask_token_id')!r} = {mask} is outside the vocabulary "
                          f"[0, {vocab})")
    block = raw("block_size", draft=True)
    block = 16 if block is None else as_int(where("block_size"), block)   # the reference's default
    if block < 2:
        raise ConfigError(f"{source}: field {where('block_size')!r} must be at least 2 (anchor + one draft), "
                          f"got {block}")

    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise ConfigError(f"{source}: hidden_act {act!r} is not supported (only 'silu')")
    if hf.get("attention_bias", False):
        raise ConfigError(f"{source}: attention_bias=true is not supported")
    # Knobs of other DFlash drafters that the reference honours; refuse rather than silently ignore them.
    for key in ("input_embedding_scale", "output_multiplier"):
        v = raw(key, draft=True)
        if v is not None and v != 1.0:
            raise ConfigError(f"{source}: field {where(key)!r} = {v!r} is not supported (only 1.0)")
    v = raw("final_logit_softcapping", draft=True)
    if v is not None and as_float(where("final_logit_softcapping"), v) > 0:
        raise ConfigError(f"{source}: field {where('final_logit_softcapping')!r} = {v!r} is not supported "
                          "(no softcap)")

    if dtype is not None and dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"dtype argument {dtype!r} is not one of float32, bfloat16, float16")
    # Read before the try below: their errors name `source` already; the try prefixes only DrafterConfig's own.
    sizes = dict(hidden_size=req("hidden_size"), intermediate_size=req("intermediate_size"),
                 num_heads=req("num_attention_heads"), num_kv_heads=req("num_key_value_heads"),
                 head_dim=as_int("head_dim", hf["head_dim"]), rms_norm_eps=as_float("rms_norm_eps",
                                                                                     hf.get("rms_norm_eps", 1e-6)))
    try:
        return DrafterConfig(
            vocab_size=vocab,
            **sizes,
            layer_types=tuple(layer_types),
            rope_theta=theta,
            target_layer_ids=ids,
            mask_token_id=mask,
            block_size=block,
            sliding_window=window,
            is_causal=is_causal,
            dtype=dtype or str(hf.get("dtype") or hf.get("torch_dtype") or "bfloat16"),
            num_target_layers=n_target,
        )
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None


def load_drafter_config(path: str | Path, *, dtype: str | None = None) -> DrafterConfig:
    """`path` is the drafter directory or its config.json."""
    p = Path(path)
    return drafter_config_from_hf(load_json(p), dtype=dtype, source=str(p / "config.json" if p.is_dir() else p))


def check_pair(drafter: DrafterConfig, target: TargetConfig) -> None:
    """Raise ConfigError when this drafter cannot run on this target."""
    if drafter.hidden_size != target.hidden_size:
        raise ConfigError(f"drafter hidden_size {drafter.hidden_size} != target hidden_size {target.hidden_size}: "
                          "the drafter reads the target's hidden states and embeddings")
    if drafter.vocab_size != target.vocab_size:
        raise ConfigError(f"drafter vocab_size {drafter.vocab_size} != target vocab_size {target.vocab_size}: "
                          "the drafter uses the target's embedding and lm_head")
    bad = [i for i in drafter.target_layer_ids if not 0 <= i < target.num_layers]
    if bad:
        raise ConfigError(f"drafter target_layer_ids {list(drafter.target_layer_ids)}: ids {bad} are not layers of "
                          f"the {target.num_layers}-layer target")
    if drafter.num_target_layers is not None and drafter.num_target_layers != target.num_layers:
        raise ConfigError(f"drafter was trained for a {drafter.num_target_layers}-layer target; this target has "
                          f"{target.num_layers}")


def qwen36_27b_dflash(dtype: str = "bfloat16") -> DrafterConfig:
    """z-lab/Qwen3.6-27B-DFlash (DESIGN.md section 1)."""
    return DrafterConfig(
        vocab_size=248320, hidden_size=5120, intermediate_size=17408, num_heads=32, num_kv_heads=8, head_dim=128,
        layer_types=(SLIDING,) * 4 + (FULL,), rope_theta=1e7, target_layer_ids=(1, 16, 31, 46, 61),
        mask_token_id=248070, block_size=16, sliding_window=2048, dtype=dtype)
