"""Frozen model configs, each read from a Hugging Face ``config.json`` in exactly one place."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import jax.numpy as jnp

FULL = "full_attention"
LINEAR = "linear_attention"


class ConfigError(ValueError):
    """A config.json that jaxspec cannot run: names the file and the field."""


@dataclasses.dataclass(frozen=True)
class TargetConfig:
    """The Qwen3.5/3.6 hybrid text model (``qwen3_5_text``). Hashable, so it is static under jit."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    layer_types: tuple[str, ...]
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rotary_dim: int
    rope_theta: float
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    conv_kernel: int
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    eos_token_ids: tuple[int, ...] = ()
    dtype: str = "bfloat16"
    # Rows of the embedding / columns of lm_head when tensor parallelism pads the vocabulary to a multiple
    # of its degree (jaxspec/sharding.py); 0 = vocab_size. Padded logits are -inf.
    padded_vocab: int = 0

    @property
    def vocab_rows(self) -> int:
        return self.padded_vocab or self.vocab_size

    @property
    def num_layers(self) -> int:
        return len(self.layer_types)

    @property
    def full_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == FULL)

    @property
    def linear_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == LINEAR)

    @property
    def key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim

    @property
    def jnp_dtype(self):
        return jnp.dtype(self.dtype)

    def replace(self, **kw) -> "TargetConfig":
        return dataclasses.replace(self, **kw)

    def __post_init__(self):
        for t in self.layer_types:
            if t not in (FULL, LINEAR):
                raise ConfigError(f"layer_types: unknown layer type {t!r} (expected {FULL!r} or {LINEAR!r})")
        positive = ("vocab_size", "hidden_size", "intermediate_size", "num_heads", "num_kv_heads", "head_dim",
                    "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                    "linear_value_head_dim", "conv_kernel")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(f"num_attention_heads ({self.num_heads}) is not a multiple of "
                              f"num_key_value_heads ({self.num_kv_heads})")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ConfigError(f"linear_num_value_heads ({self.linear_num_value_heads}) is not a multiple of "
                              f"linear_num_key_heads ({self.linear_num_key_heads})")
        if self.rotary_dim % 2 or not 0 < self.rotary_dim <= self.head_dim:
            raise ConfigError(f"rotary dim {self.rotary_dim} (head_dim x partial_rotary_factor) must be even "
                              f"and in (0, head_dim={self.head_dim}]")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ConfigError(f"dtype {self.dtype!r} is not one of float32, bfloat16, float16")


def load_json(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON ({e})") from None


_TARGET_TYPES = ("qwen3_5", "qwen3_5_text")


def target_config_from_hf(hf: dict[str, Any], *, dtype: str | None = None, source: str = "config.json") -> TargetConfig:
    """Build a TargetConfig from a HF config dict, multimodal (``text_config``) or flat layout."""
    model_type = hf.get("model_type")
    if model_type not in _TARGET_TYPES:
        raise ConfigError(f"{source}: model_type {model_type!r} is not a Qwen3.5/3.6 hybrid model {_TARGET_TYPES}")
    top = hf
    if model_type == "qwen3_5":
        if "text_config" not in hf:
            raise ConfigError(f"{source}: model_type 'qwen3_5' without a 'text_config' section")
        hf = hf["text_config"]

    def need(key):
        if key not in hf:
            raise ConfigError(f"{source}: missing field {key!r}")
        return hf[key]

    n_layers = int(need("num_hidden_layers"))
    layer_types = hf.get("layer_types")
    if layer_types is None:
        interval = int(hf.get("full_attention_interval", 4))
        if interval <= 0:
            raise ConfigError(f"{source}: full_attention_interval must be positive, got {interval}")
        layer_types = [FULL if (i + 1) % interval == 0 else LINEAR for i in range(n_layers)]
    if len(layer_types) != n_layers:
        raise ConfigError(f"{source}: layer_types has {len(layer_types)} entries but num_hidden_layers = {n_layers}")

    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", None):
        raise ConfigError(f"{source}: rope_type {rope_type!r} is not supported (only 'default')")
    theta = rope.get("rope_theta", hf.get("rope_theta"))
    if theta is None:
        raise ConfigError(f"{source}: no rope_theta (looked in rope_parameters and at the top level)")
    factor = rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    head_dim = int(hf.get("head_dim") or need("hidden_size") // need("num_attention_heads"))
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
                "linear_conv_kernel_dim"):
        need(key)

    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise ConfigError(f"{source}: hidden_act {act!r} is not supported (only 'silu')")
    if hf.get("attention_bias", False):
        raise ConfigError(f"{source}: attention_bias=true is not supported")
    if hf.get("mlp_only_layers"):
        raise ConfigError(f"{source}: mlp_only_layers (MoE) is not supported")
    eos = hf.get("eos_token_id", top.get("eos_token_id"))
    eos = () if eos is None else tuple(eos) if isinstance(eos, list) else (int(eos),)
    tie = bool(top.get("tie_word_embeddings", hf.get("tie_word_embeddings", False)))
    try:
        return _target_config(hf, layer_types, head_dim, theta, factor, tie, eos, dtype)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None


def _target_config(hf, layer_types, head_dim, theta, factor, tie, eos, dtype) -> TargetConfig:
    return TargetConfig(
        vocab_size=int(hf["vocab_size"]),
        hidden_size=int(hf["hidden_size"]),
        intermediate_size=int(hf["intermediate_size"]),
        layer_types=tuple(layer_types),
        num_heads=int(hf["num_attention_heads"]),
        num_kv_heads=int(hf["num_key_value_heads"]),
        head_dim=head_dim,
        rotary_dim=int(head_dim * float(factor)),
        rope_theta=float(theta),
        linear_num_key_heads=int(hf["linear_num_key_heads"]),
        linear_num_value_heads=int(hf["linear_num_value_heads"]),
        linear_key_head_dim=int(hf["linear_key_head_dim"]),
        linear_value_head_dim=int(hf["linear_value_head_dim"]),
        conv_kernel=int(hf["linear_conv_kernel_dim"]),
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=tie,
        eos_token_ids=eos,
        dtype=dtype or str(hf.get("dtype") or hf.get("torch_dtype") or "bfloat16"),
    )


def load_target_config(path: str | Path, *, dtype: str | None = None) -> TargetConfig:
    """From a model directory (or its config.json). Stop tokens also come from generation_config.json,
    where Qwen3.6 lists <|im_end|> beside config.json's <|endoftext|>."""
    p = Path(path)
    cfg = target_config_from_hf(load_json(p), dtype=dtype, source=str(p / "config.json" if p.is_dir() else p))
    gen = (p if p.is_dir() else p.parent) / "generation_config.json"
    if gen.exists():
        eos = load_json(gen).get("eos_token_id")
        eos = [] if eos is None else eos if isinstance(eos, list) else [eos]
        cfg = cfg.replace(eos_token_ids=tuple(dict.fromkeys([*cfg.eos_token_ids, *map(int, eos)])))
    return cfg


def qwen36_27b(dtype: str = "bfloat16") -> TargetConfig:
    """The real Qwen3.6-27B text shape (DESIGN.md section 1)."""
    return TargetConfig(
        vocab_size=248320, hidden_size=5120, intermediate_size=17408,
        layer_types=tuple(FULL if (i + 1) % 4 == 0 else LINEAR for i in range(64)),
        num_heads=24, num_kv_heads=4, head_dim=256, rotary_dim=64, rope_theta=1e7,
        linear_num_key_heads=16, linear_num_value_heads=48, linear_key_head_dim=128, linear_value_head_dim=128,
        conv_kernel=4, eos_token_ids=(248046, 248044), dtype=dtype)
