"""Frozen model configs, each read from a Hugging Face ``config.json`` in exactly one place."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import jax.numpy as jnp

FULL = "full_attention"
LINEAR = "linear_attention"


class ConfigError(ValueError):
    """A config.json that jaxspec cannot run: names the file and the field."""


# config.json's names of the TargetConfig fields named otherwise, for errors
_HF_NAMES = {"num_heads": "num_attention_heads", "num_kv_heads": "num_key_value_heads",
             "conv_kernel": "linear_conv_kernel_dim"}


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
    # The model's context limit (prompt + generated tokens), config.json's max_position_embeddings; 0 = none known.
    # Engine.generate refuses requests beyond it. Not part of equality or the hash: it changes no program.
    max_position_embeddings: int = dataclasses.field(default=0, compare=False)

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
                raise ConfigError(f"{_HF_NAMES.get(name, name)} must be positive, got {getattr(self, name)}")
        if self.max_position_embeddings < 0:
            raise ConfigError(f"max_position_embeddings must be >= 0 (0: no limit), got {self.max_position_embeddings}")
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
    """The JSON object in `path`, or in its config.json when `path` is a dir."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    return read_json_object(path)


def read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in the file `path`; every way it can fail is a ConfigError naming the file."""
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, not a JSON file") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read it ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason})") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def as_int(source: str, key: str, v: Any) -> int:
    """`v`, the value of field `key` of `source`, as an int: a JSON integer (or a float with an integral value,
    1e3). Strings ("384") are refused, as transformers refuses them."""
    if isinstance(v, bool) or not (isinstance(v, int) or isinstance(v, float) and v.is_integer()):
        raise ConfigError(f"{source}: field {key!r} must be an integer, got {v!r}")
    return int(v)


def as_float(source: str, key: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ConfigError(f"{source}: field {key!r} must be a finite number, got {v!r}")
    return float(v)


def as_bool(source: str, key: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise ConfigError(f"{source}: field {key!r} must be true or false, got {v!r}")
    return v


def eos_ids(source: str, v: Any) -> tuple[int, ...]:
    """An ``eos_token_id`` field: absent (None), one token id or a list of them."""
    if v is None:
        return ()
    ids = v if isinstance(v, list) else [v]
    if any(isinstance(i, bool) or not isinstance(i, int) for i in ids):
        raise ConfigError(f"{source}: field 'eos_token_id' must be an integer or a list of integers, got {v!r}")
    return tuple(ids)


_TARGET_TYPES = ("qwen3_5", "qwen3_5_text")


def rope_section(source, hf: dict) -> dict:
    """The RoPE settings of an HF config: the legacy `rope_scaling` where it is set, else `rope_parameters`
    (transformers 5), one replacing the other, not merged, as in transformers' `convert_rope_params_to_dict`
    (rope_parameters = rope_scaling or rope_parameters): what the chosen block lacks comes from the top level.
    Only the plain rotation is supported: a YaRN / linear / dynamic type in either block is refused, never
    silently run as plain RoPE (a `rope_scaling` block added beside `rope_parameters`)."""
    parts = {}
    for key in ("rope_parameters", "rope_scaling"):
        part = hf.get(key)
        if not part:
            continue
        if not isinstance(part, dict):
            raise ConfigError(f"{source}: field {key!r} must be an object, got {part!r}")
        rope_type = part.get("rope_type", part.get("type", "default"))
        if rope_type not in ("default", None):
            raise ConfigError(f"{source}: {key}.rope_type {rope_type!r} is not supported (only 'default')")
        parts[key] = part
    return parts.get("rope_scaling", parts.get("rope_parameters", {}))


def target_config_from_hf(hf: dict[str, Any], *, dtype: str | None = None, source: str = "config.json") -> TargetConfig:
    """Build a TargetConfig from a HF config dict, multimodal (``text_config``) or flat layout. Every field
    of the wrong type or value is a ConfigError naming `source` and the field."""
    if not isinstance(hf, dict):
        raise ConfigError(f"{source}: expected a JSON object, got {type(hf).__name__}")
    model_type = hf.get("model_type")
    if model_type not in _TARGET_TYPES:
        raise ConfigError(f"{source}: model_type {model_type!r} is not a Qwen3.5/3.6 hybrid model {_TARGET_TYPES}")
    top = hf
    if model_type == "qwen3_5":
        if "text_config" not in hf:
            raise ConfigError(f"{source}: model_type 'qwen3_5' without a 'text_config' section")
        hf = hf["text_config"]
        if not isinstance(hf, dict):
            raise ConfigError(f"{source}: field 'text_config' must be an object, got {hf!r}")

    def need(key):
        if key not in hf:
            raise ConfigError(f"{source}: missing field {('text_config.' if hf is not top else '') + key!r}")
        return hf[key]

    def req(key):
        return as_int(source, key, need(key))

    def opt(key, default, convert=as_int):
        """An optional field; null counts as absent (transformers' to_dict() writes unset fields as null)."""
        v = hf.get(key)
        return default if v is None else convert(source, key, v)

    n_layers = req("num_hidden_layers")
    layer_types = hf.get("layer_types")
    if layer_types is None:
        interval = opt("full_attention_interval", 4)
        if interval <= 0:
            raise ConfigError(f"{source}: full_attention_interval must be positive, got {interval}")
        layer_types = [FULL if (i + 1) % interval == 0 else LINEAR for i in range(n_layers)]
    if not isinstance(layer_types, list):
        raise ConfigError(f"{source}: field 'layer_types' must be a list, got {layer_types!r}")
    if len(layer_types) != n_layers:
        raise ConfigError(f"{source}: layer_types has {len(layer_types)} entries but num_hidden_layers = {n_layers}")

    rope = rope_section(source, hf)
    theta = rope.get("rope_theta", hf.get("rope_theta"))
    if theta is None:
        raise ConfigError(f"{source}: no rope_theta (looked in rope_parameters, rope_scaling and at the top level)")
    theta = as_float(source, "rope_theta", theta)
    if theta <= 0:
        raise ConfigError(f"{source}: rope_theta must be positive, got {theta}")
    # Absent from both, transformers rotates a quarter of the head: Qwen3_5TextConfig.__post_init__
    # (transformers/models/qwen3_5/configuration_qwen3_5.py) defaults partial_rotary_factor to 0.25 "for BC", and
    # convert_rope_params_to_dict (modeling_rope_utils.py) puts that into rope_parameters.
    factor = as_float(source, "partial_rotary_factor",
                      rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", 0.25)))
    ints = {name: req(key) for name, key in (
        ("vocab_size", "vocab_size"), ("hidden_size", "hidden_size"), ("intermediate_size", "intermediate_size"),
        ("num_heads", "num_attention_heads"), ("num_kv_heads", "num_key_value_heads"),
        ("linear_num_key_heads", "linear_num_key_heads"), ("linear_num_value_heads", "linear_num_value_heads"),
        ("linear_key_head_dim", "linear_key_head_dim"), ("linear_value_head_dim", "linear_value_head_dim"),
        ("conv_kernel", "linear_conv_kernel_dim"))}
    head_dim = opt("head_dim", 256)   # absent: Qwen3_5TextConfig's default, 256 (not hidden_size / heads)

    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise ConfigError(f"{source}: hidden_act {act!r} is not supported (only 'silu')")
    if opt("attention_bias", False, as_bool):
        raise ConfigError(f"{source}: attention_bias=true is not supported")
    if hf.get("mlp_only_layers"):
        raise ConfigError(f"{source}: mlp_only_layers (MoE) is not supported")
    # A text_config's null eos_token_id (transformers' to_dict writes unset keys as null) defers to the top level's.
    eos = hf.get("eos_token_id")
    eos = eos_ids(source, top.get("eos_token_id") if eos is None else eos)
    # The multimodal layout's flag is its top-level one (Qwen3_5ForConditionalGeneration reads no other, false when
    # absent); the flat layout's is its own.
    tie = top.get("tie_word_embeddings")
    tie = False if tie is None else as_bool(source, "tie_word_embeddings", tie)
    eps, max_pos = opt("rms_norm_eps", 1e-6, as_float), opt("max_position_embeddings", 0)
    try:
        return TargetConfig(
            **ints,
            layer_types=tuple(layer_types),
            head_dim=head_dim,
            rotary_dim=int(head_dim * factor),
            rope_theta=theta,
            rms_norm_eps=eps,
            tie_word_embeddings=tie,
            eos_token_ids=eos,
            max_position_embeddings=max_pos,
            # transformers 5 writes the multimodal layout's dtype at the top level only.
            dtype=dtype or str(hf.get("dtype") or hf.get("torch_dtype") or top.get("dtype") or top.get("torch_dtype")
                               or "bfloat16"),
        )
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None


def load_target_config(path: str | Path, *, dtype: str | None = None) -> TargetConfig:
    """From a model directory (or its config.json). Stop tokens also come from generation_config.json,
    where Qwen3.6 lists <|im_end|> beside config.json's <|endoftext|>."""
    p = Path(path)
    cfg = target_config_from_hf(load_json(p), dtype=dtype, source=str(p / "config.json" if p.is_dir() else p))
    gen = (p if p.is_dir() else p.parent) / "generation_config.json"
    if gen.exists():
        eos = eos_ids(str(gen), read_json_object(gen).get("eos_token_id"))
        cfg = cfg.replace(eos_token_ids=tuple(dict.fromkeys([*cfg.eos_token_ids, *eos])))
    return cfg


def qwen36_27b(dtype: str = "bfloat16") -> TargetConfig:
    """The real Qwen3.6-27B text shape (DESIGN.md section 1)."""
    return TargetConfig(
        vocab_size=248320, hidden_size=5120, intermediate_size=17408,
        layer_types=tuple(FULL if (i + 1) % 4 == 0 else LINEAR for i in range(64)),
        num_heads=24, num_kv_heads=4, head_dim=256, rotary_dim=64, rope_theta=1e7,
        linear_num_key_heads=16, linear_num_value_heads=48, linear_key_head_dim=128, linear_value_head_dim=128,
        conv_kernel=4, eos_token_ids=(248046, 248044), max_position_embeddings=262144, dtype=dtype)
