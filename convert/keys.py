"""The one table from Hugging Face checkpoint keys to jaxspec parameter paths."""

from __future__ import annotations

import numpy as np

from jaxspec.config import FULL, TargetConfig

# Text weights appear as `model.language_model.X` (multimodal Qwen3_5ForConditionalGeneration) or
# `model.X` (Qwen3_5ForCausalLM); `lm_head.weight` is top level in both.
_TEXT_PREFIXES = ("model.language_model.", "model.")
VISUAL_PREFIX = "model.visual."
MTP_PREFIX = "mtp."  # the multi-token-prediction head: not part of the target; convert/mtp.py loads it
IGNORED_PREFIXES = (VISUAL_PREFIX, MTP_PREFIX)


def target_layout(cfg: TargetConfig) -> dict[str, tuple[tuple, tuple[int, ...], str]]:
    """HF key (without the text prefix) -> (param path in the NNX state, HF shape, transform).

    transform: 'linear' transposes [out, in] -> [in, out]; 'conv' maps [C, 1, K] -> [K, C];
    'copy' keeps the tensor as is. The GDN's fused q|k|v channels (in_proj_qkv rows, conv1d channels) are
    also reordered by key-head group: their transform is ('linear' or 'conv', *gdn_channels(cfg)).
    """
    d = cfg.hidden_size
    out: dict[str, tuple[tuple, tuple[int, ...], str]] = {
        "embed_tokens.weight": (("embed_tokens",), (cfg.vocab_size, d), "copy"),
        "norm.weight": (("norm", "weight"), (d,), "copy"),
    }
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = (("lm_head", "kernel"), (cfg.vocab_size, d), "linear")

    def lin(name, path, o, i):
        out[name] = (path + ("kernel",), (o, i), "linear")

    for i, t in enumerate(cfg.layer_types):
        p, L = f"layers.{i}.", ("layers", i)
        out[p + "input_layernorm.weight"] = (L + ("input_layernorm", "weight"), (d,), "copy")
        out[p + "post_attention_layernorm.weight"] = (L + ("post_attention_layernorm", "weight"), (d,), "copy")
        for n, (o, ii) in {"gate_proj": (cfg.intermediate_size, d), "up_proj": (cfg.intermediate_size, d),
                           "down_proj": (d, cfg.intermediate_size)}.items():
            lin(p + f"mlp.{n}.weight", L + ("mlp", n), o, ii)
        if t == FULL:
            a, A = p + "self_attn.", L + ("self_attn",)
            hd = cfg.head_dim
            lin(a + "q_proj.weight", A + ("q_proj",), cfg.num_heads * hd * 2, d)
            lin(a + "k_proj.weight", A + ("k_proj",), cfg.num_kv_heads * hd, d)
            lin(a + "v_proj.weight", A + ("v_proj",), cfg.num_kv_heads * hd, d)
            lin(a + "o_proj.weight", A + ("o_proj",), d, cfg.num_heads * hd)
            out[a + "q_norm.weight"] = (A + ("q_norm", "weight"), (hd,), "copy")
            out[a + "k_norm.weight"] = (A + ("k_norm", "weight"), (hd,), "copy")
        else:
            g, G = p + "linear_attn.", L + ("linear_attn",)
            hv = cfg.linear_num_value_heads
            qkv = gdn_channels(cfg)
            out[g + "in_proj_qkv.weight"] = (G + ("in_proj_qkv", "kernel"), (cfg.conv_dim, d), ("linear",) + qkv)
            lin(g + "in_proj_z.weight", G + ("in_proj_z",), cfg.value_dim, d)
            lin(g + "in_proj_b.weight", G + ("in_proj_b",), hv, d)
            lin(g + "in_proj_a.weight", G + ("in_proj_a",), hv, d)
            lin(g + "out_proj.weight", G + ("out_proj",), d, cfg.value_dim)
            out[g + "conv1d.weight"] = (G + ("conv1d",), (cfg.conv_dim, 1, cfg.conv_kernel), ("conv",) + qkv)
            out[g + "dt_bias"] = (G + ("dt_bias",), (hv,), "copy")
            out[g + "A_log"] = (G + ("A_log",), (hv,), "copy")
            out[g + "norm.weight"] = (G + ("norm", "weight"), (cfg.linear_value_head_dim,), "copy")
    return out


def strip_text_prefix(key: str) -> str | None:
    """The text-model key without its prefix; None for keys that are not text weights."""
    if key == "lm_head.weight":
        return key
    if key.startswith(IGNORED_PREFIXES):
        return None
    for pre in _TEXT_PREFIXES:
        if key.startswith(pre):
            return key[len(pre):]
    return None


def gdn_channels(cfg: TargetConfig) -> tuple[int, int, int, int]:
    """(key heads, key head dim, value heads, value head dim): what `gdn_channel_order` needs."""
    return (cfg.linear_num_key_heads, cfg.linear_key_head_dim, cfg.linear_num_value_heads, cfg.linear_value_head_dim)


def gdn_channel_order(hk: int, dk: int, hv: int, dv: int) -> np.ndarray:
    """The HF channel of each model channel of the fused GDN projection.

    HF stores [q heads | k heads | v heads]; the model stores, per key head h, q_h, k_h and then the value
    heads that read it (h * rep .. h * rep + rep - 1, rep = hv / hk). A contiguous block of whole groups,
    i.e. a tensor-parallel shard over key heads, then holds exactly its own heads' channels, for any
    degree that divides hk. `np.argsort` of it maps back to the HF layout.
    """
    rep = hv // hk
    order = []
    for h in range(hk):
        order.append(np.arange(h * dk, (h + 1) * dk))
        order.append(hk * dk + np.arange(h * dk, (h + 1) * dk))
        order.append(2 * hk * dk + np.arange(h * rep * dv, (h + 1) * rep * dv))
    return np.concatenate(order)


def transform(array, kind):
    base, groups = (kind[0], kind[1:]) if isinstance(kind, tuple) else (kind, ())
    if groups:  # rows of [out, in] / channels of [C, 1, K] into key-head-group order
        array = array[gdn_channel_order(*groups)]
    if base == "linear":
        return array.T
    if base == "conv":
        return array[:, 0, :].T
    return array
