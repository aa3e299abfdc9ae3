"""DFlash drafter rules the parity runs of test_drafter.py do not reach.

- Grouped-query attention where a KV head serves more query heads than there are KV heads (the real drafter's 32 q /
  8 kv heads: q head h reads kv head h // 4), on the sliding and the full layers, against z-lab's reference.
- The taps `add_context` takes: [B, T, n_taps, D] as the target returns them, or flat; any other layout (a
  transposed [B, T, D, n_taps] one included) is refused, not reshaped into the wrong features.
- A DrafterConfig built in code refuses what a config.json would be refused for.
- config.json as transformers' Qwen3Config reads it: no window without use_sliding_window, rope_parameters over a
  top-level rope_theta, `dtype` over the legacy `torch_dtype`; knobs the drafter does not run (DFlash-2 keys, an
  embedding scale or logit multiplier other than 1, a softcap, another activation) are refused, their neutral
  values accepted; a drafter trained for a target of another depth, shallower or deeper, is refused.
"""

from __future__ import annotations

import re

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from convert.drafter import load_drafter
from jaxspec.config import ConfigError, qwen36_27b
from jaxspec.drafter import Drafter
from jaxspec.drafter_config import check_pair, drafter_config_from_hf, qwen36_27b_dflash
from test_dflash import drafter_config
from test_drafter import D, N_TAPS, REAL, SWA, V, add_context, assert_close, draft, make_reference, ref_logits, tiny_hf

# ---------------------------------------------------------------- attention


def test_query_heads_grouped_onto_fewer_kv_heads_match_the_reference(tmp_path, seed):
    """8 query heads over 2 KV heads (groups of 4, as 32 over 8): sliding and full layers give z-lab's logits, for
    a context longer than the window."""
    hf = {**tiny_hf("qwen36"), "num_attention_heads": 8, "num_key_value_heads": 2}
    model = make_reference(tmp_path, hf, seed=seed % 1000)
    drafter = load_drafter(tmp_path)
    cfg = drafter.cfg
    assert (cfg.num_heads, cfg.num_kv_heads) == (8, 2) and None in cfg.windows and 8 in cfg.windows
    rng = np.random.default_rng(seed)
    embed = rng.standard_normal((V, D)).astype(np.float32)
    lm = (rng.standard_normal((D, V)) / D ** 0.5).astype(np.float32)
    ctx = rng.standard_normal((13, N_TAPS * D)).astype(np.float32)
    anchor = int(rng.integers(0, V))
    want = ref_logits(model, ctx, 13, anchor, embed, lm, block_size=cfg.block_size)
    cache = add_context(drafter, drafter.init_cache(1, 24), jnp.asarray(ctx[None]), jnp.array([13]))
    assert_close(draft(drafter, cache, jnp.array([anchor]), jnp.asarray(embed), jnp.asarray(lm))[0], want)


def test_taps_in_another_layout_are_refused(seed):
    """Per-tap [B, T, n_taps, D] and flat [B, T, n_taps * D] taps fill the same cache; a transposed
    [B, T, D, n_taps] layout or a wrong width is a ValueError naming both accepted shapes."""
    cfg = drafter_config()                                     # taps (0, 2): two of them, hidden 64
    drafter = Drafter(cfg, rngs=nnx.Rngs(seed % 1000))
    rng = np.random.default_rng(seed)
    taps = jnp.asarray(rng.standard_normal((2, 5, 2, 64)), jnp.float32)
    per_tap = drafter.add_context(drafter.init_cache(2, 16), taps, jnp.array([5, 3]))
    flat = drafter.add_context(drafter.init_cache(2, 16), taps.reshape(2, 5, 128), jnp.array([5, 3]))
    for a, b in zip(per_tap.keys + per_tap.values, flat.keys + flat.values):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for bad in (jnp.swapaxes(taps, 2, 3), jnp.concatenate([taps, taps[..., :1]], -1), taps.reshape(2, 5, 128)[..., 1:]):
        want = re.escape(f"taps {tuple(bad.shape)}: expected [B, T, 2, 64] or [B, T, 128]")
        with pytest.raises(ValueError, match=want):
            drafter.add_context(drafter.init_cache(2, 16), bad, jnp.array([5, 3]))


# ---------------------------------------------------------------- config built in code


@pytest.mark.parametrize("kw,msg", [
    ({"layer_types": (SWA, "linear_attention")}, r"layer_types: unknown layer type 'linear_attention'"),
    ({"layer_types": ()}, r"num_hidden_layers must be positive"),
    ({"head_dim": 15}, r"head_dim must be even for rotate_half RoPE, got 15"),
    ({"sliding_window": 0}, r"sliding_window must be positive, got 0"),
    ({"target_layer_ids": (0, -1)}, r"target_layer_ids must be a non-empty list of non-negative .*, got \[0, -1\]"),
    ({"target_layer_ids": ()}, r"target_layer_ids must be a non-empty list of non-negative .*, got \[\]"),
    ({"mask_token_id": -1}, r"mask_token_id -1 is outside the vocabulary \[0, 512\)"),
])
def test_a_config_built_in_code_is_checked_like_a_config_json(kw, msg):
    drafter_config()                                         # the base is valid
    with pytest.raises(ConfigError, match=f"^{msg}"):
        drafter_config(**kw)


# ---------------------------------------------------------------- config.json


def test_no_window_without_use_sliding_window_as_qwen3config():
    """use_sliding_window defaults to false (transformers' Qwen3Config): a sliding_window alone sets no window, and
    the sliding layers stay causal."""
    from transformers import Qwen3Config
    hf = {k: v for k, v in REAL.items() if k != "use_sliding_window"}
    cfg = drafter_config_from_hf(hf)
    assert Qwen3Config(**{k: v for k, v in hf.items() if k != "dflash_config"}).sliding_window is None
    assert cfg.sliding_window is None and cfg.windows == (None,) * 5
    assert cfg.causal == (True,) * 4 + (False,)


def test_rope_parameters_win_over_a_top_level_rope_theta_and_theta_must_be_positive():
    from transformers import Qwen3Config
    hf = {**REAL, "rope_theta": 123.0, "rope_parameters": {"rope_type": "default", "rope_theta": 5e6}}
    want = Qwen3Config(**{k: v for k, v in hf.items() if k != "dflash_config"}).rope_parameters["rope_theta"]
    assert drafter_config_from_hf(hf).rope_theta == want == 5e6
    for theta in (0, -1e4):
        with pytest.raises(ConfigError, match=rf"^cfg\.json: rope_theta must be positive, got {float(theta)}"):
            drafter_config_from_hf({**REAL, "rope_theta": theta}, source="cfg.json")


def test_dtype_key_wins_over_the_legacy_torch_dtype():
    """As transformers 5 reads them: `dtype` first, then `torch_dtype`, then bfloat16."""
    assert drafter_config_from_hf({**REAL, "dtype": "float16", "torch_dtype": "float32"}).dtype == "float16"
    assert drafter_config_from_hf({**REAL, "torch_dtype": "float32"}).dtype == "float32"
    assert drafter_config_from_hf(REAL).dtype == "bfloat16"


@pytest.mark.parametrize("patch,msg", [
    ({"selector_rank": 16}, r"a DFlash-2 drafter \(conv_kernel_size / selector_rank\)"),
    ({"conv_kernel_size": 4}, r"a DFlash-2 drafter"),
    ({"dflash_config": [1, 2]}, r"dflash_config must be an object, got list"),
    ({"input_embedding_scale": 0.5}, r"field 'input_embedding_scale' = 0\.5 is not supported \(only 1\.0\)"),
    ({"dflash_config": {**REAL["dflash_config"], "input_embedding_scale": 2.0}},
     r"field 'dflash_config\.input_embedding_scale' = 2\.0 is not supported"),
    ({"output_multiplier": 0.5}, r"field 'output_multiplier' = 0\.5 is not supported"),
    ({"hidden_act": "gelu"}, r"hidden_act 'gelu' is not supported \(only 'silu'\)"),
    ({"dflash_config": {**REAL["dflash_config"], "mask_token_id": -1}},
     r"field 'dflash_config\.mask_token_id' = -1 is outside the vocabulary \[0, 248320\)"),
    ({"num_hidden_layers": 0, "layer_types": []}, r"num_hidden_layers must be positive, got 0"),
])
def test_what_the_drafter_cannot_run_is_refused(patch, msg):
    with pytest.raises(ConfigError, match=r"^cfg\.json: " + msg):
        drafter_config_from_hf({**REAL, **patch}, source="cfg.json")


def test_neutral_values_of_those_knobs_are_accepted():
    """No softcap (0 or null), scale and multiplier 1, silu: the real drafter's config, unchanged."""
    for patch in ({"final_logit_softcapping": 0.0}, {"final_logit_softcapping": None},
                  {"input_embedding_scale": 1.0, "output_multiplier": 1.0, "hidden_act": "silu"},
                  {"dflash_config": {**REAL["dflash_config"], "final_logit_softcapping": 0, "output_multiplier": 1}}):
        assert drafter_config_from_hf({**REAL, **patch}) == qwen36_27b_dflash(), patch


@pytest.mark.parametrize("depth", [48, 80])
def test_a_drafter_trained_for_another_target_depth_is_refused(depth):
    """Shallower or deeper than the 64-layer target, with every tap still a layer of it."""
    target, drafter = qwen36_27b(), qwen36_27b_dflash()
    check_pair(drafter.replace(num_target_layers=64), target)
    with pytest.raises(ConfigError, match=f"drafter was trained for a {depth}-layer target; this target has 64"):
        check_pair(drafter.replace(num_target_layers=depth), target)
