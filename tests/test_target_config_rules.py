"""config.json -> TargetConfig rules that the layout tests of test_config.py do not reach.

- Which spelling wins where a config.json states a value twice, as transformers' Qwen3_5TextConfig reads it:
  rope_scaling over rope_parameters, rope_parameters' rope_theta and partial_rotary_factor over the top-level
  ones, `dtype` over the legacy `torch_dtype`.
- What an absent key means, as in transformers: rms_norm_eps 1e-6, hidden_act silu; the multimodal layout's
  eos_token_id at the top level when text_config has none (written as null by transformers' to_dict(), too).
- The rotary part of the head: all of it (partial_rotary_factor 1) runs, none of it or more than the head is refused.
- Each Gated DeltaNet size from its own key: key and value head dims, head counts.
- Value checks naming the config.json field: head_dim and linear_conv_kernel_dim positive, max_position_embeddings
  >= 0 (0: no limit), rope_theta positive and finite; JSON true is not a number, 64.0 is the integer 64.
- A config.json path (not its directory) still picks up the generation_config.json beside it.
- Every refusal names the file once, the optional fields' ones included.
"""

from __future__ import annotations

import copy
import json

import pytest

from jaxspec.config import ConfigError, load_target_config, target_config_from_hf
from test_config import flat, nested, refuse, write


def hf_text(hf):
    """transformers' reading of a flat (Qwen3_5ForCausalLM) config.json."""
    from transformers import Qwen3_5TextConfig
    return Qwen3_5TextConfig.from_dict(copy.deepcopy(hf))


# ------------------------------------------------------------------------------------------------
# Keys stated twice, and absent keys: as transformers reads them


def with_rope(**rope):
    hf = flat()
    hf["rope_parameters"] = {"rope_type": "default", **rope}
    return hf


@pytest.mark.parametrize("hf,theta,rotary", [
    # transformers runs rope_scaling where both are given (rope_parameters = rope_scaling or rope_parameters)
    ({**with_rope(rope_theta=1e7, partial_rotary_factor=0.25),
      "rope_scaling": {"rope_type": "default", "rope_theta": 5e5, "partial_rotary_factor": 0.5}}, 5e5, 16),
    # rope_parameters' values over the top-level ones
    ({**with_rope(rope_theta=1e7, partial_rotary_factor=0.25), "rope_theta": 123.0}, 1e7, 8),
    ({**with_rope(rope_theta=1e7, partial_rotary_factor=0.25), "partial_rotary_factor": 0.5}, 1e7, 8),
    # the top-level ones where rope_parameters has none
    ({**with_rope(), "rope_theta": 5e5, "partial_rotary_factor": 0.5}, 5e5, 16),
])
def test_rope_keys_stated_twice_resolve_as_in_transformers(hf, theta, rotary):
    cfg = target_config_from_hf(hf)
    rope = hf_text(hf).rope_parameters
    assert (rope["rope_theta"], int(32 * rope["partial_rotary_factor"])) == (theta, rotary)
    assert (cfg.rope_theta, cfg.rotary_dim) == (theta, rotary)


def test_dtype_over_the_legacy_torch_dtype():
    import torch
    hf = {**flat(), "dtype": "float32", "torch_dtype": "float16"}
    assert hf_text(hf).dtype == torch.float32
    assert target_config_from_hf(hf).dtype == "float32"
    top = nested()
    top["text_config"].pop("dtype", None)
    assert target_config_from_hf({**top, "dtype": "float32", "torch_dtype": "float16"}).dtype == "float32"


def test_absent_rms_norm_eps_and_hidden_act_take_transformers_defaults():
    hf = flat()
    del hf["rms_norm_eps"], hf["hidden_act"]
    cfg = target_config_from_hf(hf)
    ref = hf_text(hf)
    assert ref.hidden_act == "silu"
    assert cfg.rms_norm_eps == ref.rms_norm_eps == 1e-6
    assert cfg == target_config_from_hf(flat())


def test_multimodal_eos_token_id_at_the_top_level():
    """Without one in text_config, the stop token is the top-level eos_token_id, which transformers' generation
    config takes from a Qwen3_5Config."""
    from transformers import GenerationConfig, Qwen3_5Config
    hf = nested()
    del hf["text_config"]["eos_token_id"]
    hf["eos_token_id"] = 311
    assert GenerationConfig.from_model_config(Qwen3_5Config.from_dict(copy.deepcopy(hf))).eos_token_id == 311
    assert target_config_from_hf(hf).eos_token_ids == (311,)
    hf["text_config"]["eos_token_id"] = [7, 9]  # text_config's own wins
    assert target_config_from_hf(hf).eos_token_ids == (7, 9)


def test_multimodal_eos_token_id_null_in_text_config_falls_back_to_the_top_level():
    """transformers' to_dict() writes text_config's unset eos_token_id as null; null is absent, as for every other
    optional field, so the top-level id is the stop token (before, the null gave no stop token at all)."""
    from transformers import GenerationConfig, Qwen3_5Config
    hf = nested()
    assert "eos_token_id" in hf["text_config"] and hf["text_config"]["eos_token_id"] is None
    hf["eos_token_id"] = 311
    assert GenerationConfig.from_model_config(Qwen3_5Config.from_dict(copy.deepcopy(hf))).eos_token_id == 311
    assert target_config_from_hf(hf).eos_token_ids == (311,)


def test_rope_scaling_replaces_rope_parameters_as_in_transformers():
    """transformers takes rope_scaling instead of rope_parameters, not merged with it: a value rope_scaling lacks
    comes from the top level (or transformers' default, a quarter of the head), never from the rope_parameters
    block it replaced (before, the two were merged: theta 1e7 and rotary 16, from rope_parameters)."""
    hf = {**with_rope(rope_theta=1e7, partial_rotary_factor=0.5), "rope_scaling": {"rope_type": "default"},
          "rope_theta": 5e5}
    rope = hf_text(hf).rope_parameters
    assert (rope["rope_theta"], rope["partial_rotary_factor"]) == (5e5, 0.25)
    cfg = target_config_from_hf(hf)
    assert (cfg.rope_theta, cfg.rotary_dim) == (5e5, 8)


def test_gdn_sizes_from_their_own_keys():
    hf = {**flat(), "linear_num_key_heads": 3, "linear_num_value_heads": 6, "linear_key_head_dim": 8,
          "linear_value_head_dim": 24}
    cfg = target_config_from_hf(hf)
    ref = hf_text(hf)
    assert (cfg.linear_num_key_heads, cfg.linear_num_value_heads) == (ref.linear_num_key_heads,
                                                                     ref.linear_num_value_heads) == (3, 6)
    assert (cfg.linear_key_head_dim, cfg.linear_value_head_dim) == (ref.linear_key_head_dim,
                                                                   ref.linear_value_head_dim) == (8, 24)
    assert (cfg.key_dim, cfg.value_dim, cfg.conv_dim) == (24, 144, 192)


# ------------------------------------------------------------------------------------------------
# The rotary part of the head


def test_whole_head_rotates_with_partial_rotary_factor_1():
    hf = with_rope(rope_theta=1e7, partial_rotary_factor=1.0)
    assert int(hf_text(hf).head_dim * hf_text(hf).rope_parameters["partial_rotary_factor"]) == 32
    assert target_config_from_hf(hf).rotary_dim == 32


@pytest.mark.parametrize("factor,dim", [(0.0, 0), (0.03, 0), (2.0, 64), (1.0625, 34)])
def test_rotary_dim_outside_the_head_is_refused(tmp_path, factor, dim):
    refuse(tmp_path, with_rope(rope_theta=1e7, partial_rotary_factor=factor), f"rotary dim {dim} ",
           "in (0, head_dim=32]")


# ------------------------------------------------------------------------------------------------
# Values and types, each refusal naming the config.json field


@pytest.mark.parametrize("edit,words", [
    ({"linear_conv_kernel_dim": 0}, ["linear_conv_kernel_dim must be positive, got 0"]),
    ({"linear_conv_kernel_dim": -3}, ["linear_conv_kernel_dim must be positive, got -3"]),
    ({"head_dim": 0}, ["head_dim must be positive, got 0"]),
    ({"head_dim": -32}, ["head_dim must be positive, got -32"]),
    ({"max_position_embeddings": -1}, ["max_position_embeddings must be >= 0 (0: no limit), got -1"]),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 0}}, ["rope_theta must be positive, got 0.0"]),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": -1e4}}, ["rope_theta must be positive, got -10000.0"]),
    ({"num_hidden_layers": True}, ["field 'num_hidden_layers' must be an integer, got True"]),
    ({"vocab_size": False}, ["field 'vocab_size' must be an integer, got False"]),
    ({"rms_norm_eps": True}, ["field 'rms_norm_eps' must be a finite number, got True"]),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": True}}, ["field 'rope_theta' must be a finite"]),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": float("inf")}},
     ["field 'rope_theta' must be a finite number, got inf"]),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": float("nan")}},
     ["field 'rope_theta' must be a finite number, got nan"]),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": float("nan")}},
     ["field 'partial_rotary_factor' must be a finite number, got nan"]),
])
def test_values_refused_naming_the_field(tmp_path, edit, words):
    refuse(tmp_path, {**flat(), **edit}, *words)


def test_max_position_embeddings_zero_is_no_limit():
    assert target_config_from_hf({**flat(), "max_position_embeddings": 0}).max_position_embeddings == 0


def test_integral_floats_are_integers():
    """1e3-style numbers (a float with an integral value) are read as the integer they spell."""
    hf = {**flat(), "hidden_size": 64.0, "vocab_size": 5.12e2, "num_hidden_layers": 4.0, "head_dim": 3.2e1}
    cfg = target_config_from_hf(hf)
    assert cfg == target_config_from_hf(flat())
    assert all(type(getattr(cfg, k)) is int for k in ("hidden_size", "vocab_size", "head_dim"))


@pytest.mark.parametrize("edit,words", [
    ({"rms_norm_eps": "1e-6"}, ["field 'rms_norm_eps' must be a finite number"]),
    ({"max_position_embeddings": "262144"}, ["field 'max_position_embeddings' must be an integer"]),
    ({"head_dim": "32"}, ["field 'head_dim' must be an integer"]),
    ({"linear_conv_kernel_dim": 0}, ["linear_conv_kernel_dim must be positive"]),
])
def test_refusals_name_the_file_once(tmp_path, edit, words):
    """rms_norm_eps and max_position_embeddings too (before, their errors read '<file>: <file>: field ...')."""
    msg = refuse(tmp_path, {**flat(), **edit}, *words)
    path = str(tmp_path / "config.json")
    assert msg.startswith(f"{path}: ") and msg.count(path) == 1, msg


# ------------------------------------------------------------------------------------------------
# generation_config.json


def test_generation_config_beside_a_config_json_path(tmp_path):
    path = write(tmp_path, {**flat(), "eos_token_id": 248044})
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [248046, 248044]}))
    assert load_target_config(path).eos_token_ids == load_target_config(tmp_path).eos_token_ids == (248044, 248046)
    (tmp_path / "generation_config.json").write_text("{")
    with pytest.raises(ConfigError, match="generation_config.json: not valid JSON"):
        load_target_config(path)
