"""config.json -> TargetConfig: both HF layouts, the legacy spellings, and every refusal."""

from __future__ import annotations

import copy
import json
import shutil

import pytest

from conftest import TINY, text_config
from jaxspec.config import (FULL, LINEAR, ConfigError, TargetConfig, load_target_config, qwen36_27b,
                            target_config_from_hf)

L, F = LINEAR, FULL

# The real Qwen3.6-27B config.json (reference/qwen36.md section 2), trimmed to the text-relevant part.
REAL = {
    "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5", "tie_word_embeddings": False,
    "image_token_id": 248056, "video_token_id": 248057,
    "text_config": {
        "model_type": "qwen3_5_text", "hidden_size": 5120, "intermediate_size": 17408, "num_hidden_layers": 64,
        "layer_types": [L, L, L, F] * 16, "full_attention_interval": 4, "num_attention_heads": 24,
        "num_key_value_heads": 4, "head_dim": 256, "linear_num_key_heads": 16, "linear_num_value_heads": 48,
        "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "hidden_act": "silu",
        "rms_norm_eps": 1e-6, "vocab_size": 248320, "tie_word_embeddings": False, "attention_bias": False,
        "attn_output_gate": True, "partial_rotary_factor": 0.25, "max_position_embeddings": 262144,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                            "mrope_interleaved": True, "mrope_section": [11, 11, 10]},
        "mtp_num_hidden_layers": 1, "mtp_use_dedicated_embeddings": False, "mamba_ssm_dtype": "float32",
        "mlp_only_layers": [], "dtype": "bfloat16", "eos_token_id": 248044,
    },
    "vision_config": {"model_type": "qwen3_5_vision", "depth": 27, "hidden_size": 1152, "out_hidden_size": 5120},
}

REQUIRED = ("num_hidden_layers", "vocab_size", "hidden_size", "intermediate_size", "num_attention_heads",
            "num_key_value_heads", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
            "linear_value_head_dim", "linear_conv_kernel_dim")


def flat():
    """The tiny text config as transformers writes it for Qwen3_5ForCausalLM."""
    return text_config().to_dict()


def nested():
    """The same text config in the multimodal Qwen3_5ForConditionalGeneration layout."""
    from transformers import Qwen3_5Config
    vision = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=TINY["hidden_size"])
    return Qwen3_5Config(text_config=text_config().to_dict(), vision_config=vision,
                         tie_word_embeddings=False).to_dict()


def write(tmp_path, hf, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(hf))
    return path


def test_flat_and_multimodal_layouts_agree():
    a, b = target_config_from_hf(flat()), target_config_from_hf(nested())
    assert a == b
    assert a == TargetConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, layer_types=(L, L, L, F), num_heads=4,
        num_kv_heads=2, head_dim=32, rotary_dim=8, rope_theta=1e7, linear_num_key_heads=2, linear_num_value_heads=6,
        linear_key_head_dim=16, linear_value_head_dim=16, conv_kernel=4, rms_norm_eps=1e-6,
        tie_word_embeddings=False, eos_token_ids=(), dtype="bfloat16")  # to_dict() has dtype None
    assert (a.key_dim, a.value_dim, a.conv_dim, a.full_layers, a.linear_layers) == (32, 96, 160, (3,), (0, 1, 2))
    hash(a)  # static under jit


def test_real_27b_config():
    cfg = target_config_from_hf(REAL)
    # config.json names one EOS; generation_config.json adds <|im_end|> 248046, which qwen36_27b() carries.
    assert cfg.eos_token_ids == (248044,)
    assert cfg.max_position_embeddings == 262144 == qwen36_27b().max_position_embeddings
    assert cfg.replace(eos_token_ids=qwen36_27b().eos_token_ids) == qwen36_27b()
    assert (cfg.conv_dim, cfg.rotary_dim, len(cfg.full_layers), cfg.full_layers[:2]) == (10240, 64, 16, (3, 7))


def test_load_from_dir_and_file(tmp_path):
    path = write(tmp_path, nested())
    assert load_target_config(tmp_path) == load_target_config(path) == target_config_from_hf(nested())


def test_dtype_from_config_or_override():
    hf = {**flat(), "dtype": "float32"}
    assert target_config_from_hf(hf).dtype == "float32"
    assert target_config_from_hf(hf, dtype="bfloat16").dtype == "bfloat16"
    del hf["dtype"]
    assert target_config_from_hf({**hf, "torch_dtype": "float16"}).dtype == "float16"
    assert target_config_from_hf(hf).dtype == "bfloat16"


def test_layer_types_from_full_attention_interval():
    hf = flat()
    del hf["layer_types"]
    hf.update(num_hidden_layers=6, full_attention_interval=3)
    assert target_config_from_hf(hf).layer_types == (L, L, F, L, L, F)
    del hf["full_attention_interval"]  # HF's default interval is 4
    assert target_config_from_hf(hf).layer_types == (L, L, L, F, L, L)


def test_explicit_layer_types_win_over_the_interval():
    hf = flat()
    hf.update(layer_types=[F, L, F, L], full_attention_interval=4)
    assert target_config_from_hf(hf).layer_types == (F, L, F, L)


def test_rope_parameters_and_legacy_rope_theta_agree():
    new = flat()
    legacy = flat()
    del legacy["rope_parameters"]
    legacy.update(rope_theta=1e7, partial_rotary_factor=0.25)
    assert target_config_from_hf(new) == target_config_from_hf(legacy)
    scaling = copy.deepcopy(legacy)
    scaling["rope_scaling"] = {"type": "default"}
    assert target_config_from_hf(scaling) == target_config_from_hf(new)
    # Without partial_rotary_factor a quarter of the head rotates, as in transformers (next test).
    del legacy["partial_rotary_factor"]
    assert target_config_from_hf(legacy).rotary_dim == 8


@pytest.mark.parametrize("where", ["rope_parameters", "legacy"])
def test_partial_rotary_factor_defaults_like_transformers(where):
    """A config.json without partial_rotary_factor rotates what transformers' Qwen3_5TextConfig does (0.25 of
    the head), not the whole head."""
    from transformers import Qwen3_5TextConfig
    hf = flat()
    hf.pop("partial_rotary_factor", None)
    if where == "legacy":
        del hf["rope_parameters"]
        hf["rope_theta"] = 1e7
    else:
        del hf["rope_parameters"]["partial_rotary_factor"]
    want = Qwen3_5TextConfig(**copy.deepcopy(hf)).rope_parameters["partial_rotary_factor"]
    assert want == 0.25
    assert target_config_from_hf(hf).rotary_dim == int(32 * want) == 8


def test_multimodal_dtype_falls_back_to_the_top_level():
    """transformers 5 writes a Qwen3_5ForConditionalGeneration config's dtype at the top level only."""
    hf = nested()
    hf["text_config"].pop("dtype", None)
    hf["text_config"].pop("torch_dtype", None)
    assert target_config_from_hf({**hf, "dtype": "float32"}).dtype == "float32"
    assert target_config_from_hf({**hf, "torch_dtype": "float16"}).dtype == "float16"
    assert target_config_from_hf({**hf, "dtype": "float32"}, dtype="bfloat16").dtype == "bfloat16"
    # text_config's own dtype wins where both are written.
    hf["text_config"]["dtype"] = "float16"
    assert target_config_from_hf({**hf, "dtype": "float32"}).dtype == "float16"


def test_head_dim_defaults_like_transformers():
    """Absent, head_dim is Qwen3_5TextConfig's default (256), not hidden_size / heads (16 here): that default made
    jaxspec refuse, naming a head_dim the file never states, a checkpoint transformers loads."""
    from transformers import Qwen3_5TextConfig
    hf = flat()
    del hf["head_dim"]
    assert target_config_from_hf(hf).head_dim == Qwen3_5TextConfig.from_dict(hf).head_dim == 256


def test_tie_word_embeddings_at_the_top_level_of_the_multimodal_layout():
    """The multimodal layout's flag is the top-level one, as in transformers: text_config's is not read (it made
    jaxspec tie the head, and refuse lm_head.weight, where transformers loads the model untied)."""
    from transformers import Qwen3_5Config
    hf = nested()
    hf["tie_word_embeddings"] = True
    assert target_config_from_hf(hf).tie_word_embeddings
    for top, text in ((None, True), (False, True), (True, False)):
        hf = nested()
        hf.pop("tie_word_embeddings", None)
        if top is not None:
            hf["tie_word_embeddings"] = top
        hf["text_config"]["tie_word_embeddings"] = text
        want = Qwen3_5Config.from_dict(copy.deepcopy(hf)).tie_word_embeddings
        assert target_config_from_hf(hf).tie_word_embeddings == want == bool(top), (top, text)


# ------------------------------------------------------------------------------------------------
# Refusals: ConfigError naming the file and the field


def refuse(tmp_path, hf, *words, names_file=True):
    path = write(tmp_path, hf)
    with pytest.raises(ConfigError) as e:
        load_target_config(tmp_path)
    msg = str(e.value)
    if names_file:
        assert str(path) in msg, msg
    for w in words:
        assert w in msg, msg
    return msg


def text(hf):
    return hf["text_config"] if hf.get("model_type") == "qwen3_5" else hf


@pytest.mark.parametrize("layout", [flat, nested])
def test_value_heads_not_a_multiple_of_key_heads(tmp_path, layout):
    hf = layout()
    text(hf)["linear_num_value_heads"] = 5
    refuse(tmp_path, hf, "linear_num_value_heads (5)", "linear_num_key_heads (2)", names_file=False)


def test_attention_heads_not_a_multiple_of_kv_heads(tmp_path):
    hf = flat()
    hf["num_key_value_heads"] = 3
    refuse(tmp_path, hf, "num_attention_heads (4)", "num_key_value_heads (3)", names_file=False)


@pytest.mark.parametrize("layout", [flat, nested])
def test_unknown_layer_type(tmp_path, layout):
    hf = layout()
    text(hf)["layer_types"] = [L, "sliding_attention", L, F]
    refuse(tmp_path, hf, "layer_types", "'sliding_attention'", names_file=False)


def test_layer_types_length_differs_from_num_hidden_layers(tmp_path):
    hf = flat()
    hf["num_hidden_layers"] = 5
    refuse(tmp_path, hf, "layer_types has 4 entries", "num_hidden_layers = 5")


def test_full_attention_interval_must_be_positive(tmp_path):
    hf = flat()
    del hf["layer_types"]
    hf["full_attention_interval"] = 0
    refuse(tmp_path, hf, "full_attention_interval")


@pytest.mark.parametrize("field", REQUIRED)
@pytest.mark.parametrize("layout", [flat, nested])
def test_missing_field(tmp_path, layout, field):
    hf = layout()
    del text(hf)[field]
    refuse(tmp_path, hf, f"missing field {('text_config.' if layout is nested else '') + field!r}")


@pytest.mark.parametrize("model_type", ["qwen3", "qwen3_5_moe", "qwen3_next", None])
def test_model_type_not_qwen3_5(tmp_path, model_type):
    hf = flat()
    if model_type is None:
        del hf["model_type"]
    else:
        hf["model_type"] = model_type
    refuse(tmp_path, hf, "model_type", repr(model_type))


def test_qwen3_5_without_text_config(tmp_path):
    hf = flat()
    hf["model_type"] = "qwen3_5"
    refuse(tmp_path, hf, "text_config")


@pytest.mark.parametrize("edit,words", [
    ({"hidden_act": "gelu"}, ["hidden_act", "'gelu'"]),
    ({"attention_bias": True}, ["attention_bias"]),
    ({"mlp_only_layers": [0]}, ["mlp_only_layers"]),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e7, "factor": 4.0}}, ["rope_type", "'yarn'"]),
    ({"rope_parameters": {"rope_type": "default"}}, ["rope_theta"]),
    # transformers runs rope_scaling where both are given: a YaRN block beside plain rope_parameters ran as plain RoPE
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}},
     ["rope_scaling.rope_type 'yarn'"]),
    ({"rope_scaling": {"type": "linear", "factor": 2.0}}, ["rope_scaling.rope_type 'linear'"]),
])
def test_unsupported_values(tmp_path, edit, words):
    refuse(tmp_path, {**flat(), **edit}, *words)


# Checked in TargetConfig.__post_init__, which does not know the file.
VALUE_ERRORS = [
    ({"linear_num_value_heads": 5}, ["linear_num_value_heads (5)", "linear_num_key_heads (2)"]),
    ({"num_key_value_heads": 3}, ["num_attention_heads (4)", "num_key_value_heads (3)"]),
    ({"layer_types": [L, "sliding_attention", L, F]}, ["layer_types", "'sliding_attention'"]),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.3}},
     ["rotary dim 9"]),
    ({"vocab_size": 0}, ["vocab_size must be positive"]),
]


@pytest.mark.parametrize("edit,words", VALUE_ERRORS)
def test_invalid_values(tmp_path, edit, words):
    refuse(tmp_path, {**flat(), **edit}, *words)


def test_generation_config_adds_stop_tokens(tmp_path):
    import json
    (tmp_path / "config.json").write_text(json.dumps({**flat(), "eos_token_id": 248044}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [248046, 248044]}))
    assert load_target_config(tmp_path).eos_token_ids == (248044, 248046)


def test_unsupported_dtype():
    with pytest.raises(ConfigError, match="float64"):
        target_config_from_hf(flat(), dtype="float64")


def test_missing_or_broken_file(tmp_path):
    with pytest.raises(ConfigError, match="no such file") as e:
        load_target_config(tmp_path)
    assert str(tmp_path / "config.json") in str(e.value)
    (tmp_path / "config.json").write_text("{\"model_type\": ")
    with pytest.raises(ConfigError, match="not valid JSON") as e:
        load_target_config(tmp_path)
    assert str(tmp_path / "config.json") in str(e.value)


# ------------------------------------------------------------------------------------------------
# Malformed files and fields of the wrong type: a ConfigError naming the file and the field, never a raw
# UnicodeDecodeError, AttributeError, ValueError or TypeError


@pytest.mark.parametrize("edit,words", [
    ({"hidden_size": "abc"}, ["field 'hidden_size' must be an integer, got 'abc'"]),
    ({"hidden_size": "64"}, ["field 'hidden_size' must be an integer, got '64'"]),  # transformers refuses it too
    ({"vocab_size": 512.5}, ["field 'vocab_size' must be an integer, got 512.5"]),
    ({"num_hidden_layers": None}, ["field 'num_hidden_layers' must be an integer, got None"]),
    ({"rope_parameters": "default"}, ["field 'rope_parameters' must be an object, got 'default'"]),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": "1e7"}}, ["field 'rope_theta' must be a finite"]),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": "0.25"}},
     ["field 'partial_rotary_factor' must be a finite number"]),
    ({"rms_norm_eps": [1e-6]}, ["field 'rms_norm_eps' must be a finite number"]),
    ({"layer_types": "linear_attention"}, ["field 'layer_types' must be a list"]),
    ({"tie_word_embeddings": "false"}, ["field 'tie_word_embeddings' must be true or false"]),
    ({"eos_token_id": "abc"}, ["field 'eos_token_id' must be an integer or a list of integers, got 'abc'"]),
    ({"eos_token_id": [1, "2"]}, ["field 'eos_token_id' must be an integer or a list of integers"]),
    ({"num_attention_heads": 0}, ["num_attention_heads must be positive"]),
    ({"head_dim": None, "num_key_value_heads": 0}, ["num_key_value_heads must be positive"]),
])
def test_fields_of_the_wrong_type(tmp_path, edit, words):
    refuse(tmp_path, {**flat(), **edit}, *words)


def test_text_config_of_the_wrong_type(tmp_path):
    refuse(tmp_path, {**nested(), "text_config": [1]}, "field 'text_config' must be an object")
    refuse(tmp_path, ["qwen3_5_text"], "expected a JSON object, got list")
    with pytest.raises(ConfigError, match="^cfg: expected a JSON object, got list"):
        target_config_from_hf([], source="cfg")


@pytest.mark.parametrize("content,words", [
    (b'{"model_type": "qwen3_5_text", "note": "caf\xe9"}', ["not UTF-8 text", "byte 43"]),
    (b"[1, 2]", ["expected a JSON object, got list"]),
    (b'"config"', ["expected a JSON object, got str"]),
])
def test_config_file_that_is_not_a_utf8_json_object(tmp_path, content, words):
    (tmp_path / "config.json").write_bytes(content)
    with pytest.raises(ConfigError) as e:
        load_target_config(tmp_path)
    assert str(e.value).startswith(f"{tmp_path / 'config.json'}: "), e.value
    for w in words:
        assert w in str(e.value), e.value


def test_config_json_that_is_a_directory(tmp_path):
    (tmp_path / "config.json").mkdir()
    with pytest.raises(ConfigError, match="is a directory, not a JSON file") as e:
        load_target_config(tmp_path)
    assert str(e.value).startswith(f"{tmp_path / 'config.json'}: ")


@pytest.mark.parametrize("content,words", [
    ('{"eos_token_id": "abc"}', ["field 'eos_token_id' must be an integer or a list of integers, got 'abc'"]),
    ('{"eos_token_id": [248046, null]}', ["field 'eos_token_id'"]),
    ('{"eos_token_id": true}', ["field 'eos_token_id'"]),
    ("[0]", ["expected a JSON object, got list"]),
    (b"\xff", ["not UTF-8"]),
    (None, ["is a directory"]),
])
def test_bad_generation_config(tmp_path, content, words):
    write(tmp_path, flat())
    gen = tmp_path / "generation_config.json"
    if content is None:
        gen.mkdir()
    elif isinstance(content, bytes):
        gen.write_bytes(content)
    else:
        gen.write_text(content)
    with pytest.raises(ConfigError) as e:
        load_target_config(tmp_path)
    assert str(e.value).startswith(f"{gen}: "), e.value
    for w in words:
        assert w in str(e.value), e.value


def test_generate_reports_a_malformed_config_without_a_traceback(tiny_hf, tmp_path, capsys):
    from jaxspec.generate import main as generate
    model = tmp_path / "model"
    shutil.copytree(tiny_hf[0], model)
    (model / "config.json").write_text(json.dumps({**json.loads((model / "config.json").read_text()),
                                                   "hidden_size": "abc"}))
    with pytest.raises(SystemExit) as e:
        generate(["--model", str(model), "--prompt", "x"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"--model {model}: {model / 'config.json'}: field 'hidden_size' must be an integer" in err, err
    assert "Traceback" not in err
