"""The target converter: HF safetensors -> Flax -> Orbax -> Flax, and every way a checkpoint can be bad."""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp
import pytest
import torch
from flax import nnx
from safetensors import safe_open
from safetensors.numpy import save_file

import convert.hf as hf
from conftest import make_causal_lm, make_conditional
from convert.__main__ import main as cli_main
from convert.hf import CheckpointError, load_mtp_tensors, load_target
from convert.keys import target_layout, transform
from convert.store import load_model, restore_converted, save_converted
from jaxspec.config import ConfigError
from jaxspec.model import split_params
from jaxspec.tree import chain

REPO = Path(__file__).resolve().parents[1]
TOKENS = np.random.RandomState(0).randint(0, 512, (2, 12)).astype(np.int32)   # random ids of the tiny vocabulary


# ------------------------------------------------------------------------------------------------
# Checkpoint fixtures and helpers


def read_file(path):
    with safe_open(str(path), framework="numpy") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()


def rewrite(path, edit):
    """Apply edit(dict) -> dict to the tensors of one safetensors file, keeping its metadata."""
    tensors, meta = read_file(path)
    save_file(edit(tensors), str(path), metadata=meta)


def fake_mtp(hidden=64, heads=4, kv=2, head_dim=32, inter=128, seed=0):
    """Tensors named like the real MTP head (reference/qwen36.md section 5), mixed dtypes."""
    rng = np.random.default_rng(seed)
    shapes = {
        "mtp.fc.weight": (hidden, 2 * hidden), "mtp.pre_fc_norm_embedding.weight": (hidden,),
        "mtp.pre_fc_norm_hidden.weight": (hidden,), "mtp.norm.weight": (hidden,),
        "mtp.layers.0.input_layernorm.weight": (hidden,), "mtp.layers.0.post_attention_layernorm.weight": (hidden,),
        "mtp.layers.0.self_attn.q_proj.weight": (2 * heads * head_dim, hidden),
        "mtp.layers.0.self_attn.k_proj.weight": (kv * head_dim, hidden),
        "mtp.layers.0.self_attn.v_proj.weight": (kv * head_dim, hidden),
        "mtp.layers.0.self_attn.o_proj.weight": (hidden, heads * head_dim),
        "mtp.layers.0.self_attn.q_norm.weight": (head_dim,), "mtp.layers.0.self_attn.k_norm.weight": (head_dim,),
        "mtp.layers.0.mlp.gate_proj.weight": (inter, hidden), "mtp.layers.0.mlp.up_proj.weight": (inter, hidden),
        "mtp.layers.0.mlp.down_proj.weight": (hidden, inter),
    }
    out = {}
    for i, (k, s) in enumerate(shapes.items()):
        dt = ml_dtypes.bfloat16 if i % 2 else np.float32
        out[k] = rng.standard_normal(s).astype(dt)
    return out


def add_mtp(path: Path, mtp):
    """Add `mtp` the way the real checkpoint has it: inside the single file, or as an indexed shard."""
    index = path / "model.safetensors.index.json"
    if index.exists():
        save_file(mtp, str(path / "model-mtp.safetensors"), metadata={"format": "pt"})
        data = json.loads(index.read_text())
        data["weight_map"].update({k: "model-mtp.safetensors" for k in mtp})
        index.write_text(json.dumps(data))
    else:
        rewrite(path / "model.safetensors", lambda t: {**t, **mtp})


LAYOUTS = {"causal": (make_causal_lm, None), "causal_sharded": (make_causal_lm, "50KB"),
           "cond": (make_conditional, None), "cond_sharded": (make_conditional, "50KB")}


class _Checkpoints(dict):
    """name -> (path, torch model, mtp tensors or None), each written on first use."""

    def __init__(self, factory):
        super().__init__()
        self.factory = factory

    def __missing__(self, name):
        make, shard = LAYOUTS[name]
        path = self.factory.mktemp(name)
        model = make(path, max_shard_size=shard)
        mtp = None
        if name.startswith("cond"):  # the multimodal layout: visual keys from HF, mtp keys added
            mtp = fake_mtp()
            add_mtp(path, mtp)
        self[name] = (path, model, mtp)
        return self[name]


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """Flat causal LM and multimodal (visual + mtp keys) checkpoints, each single-file and sharded."""
    return _Checkpoints(tmp_path_factory)


@pytest.fixture
def bad(ckpts, tmp_path):
    """A private copy of one checkpoint, to break."""
    def copy(name="causal"):
        dst = tmp_path / f"bad_{name}"
        shutil.copytree(ckpts[name][0], dst)
        return dst
    return copy


def flat_params(model):
    return {p: v.get_value() for p, v in nnx.to_flat_state(nnx.state(model))}


def checkpoint_params(model):
    """The params in the checkpoint's layout: the model's fused kernels split into the checkpoint's."""
    return split_params(model.cfg, flat_params(model))


@nnx.jit  # one compile for all tests (same config); eager dispatch of the forward takes ~10 s on CPU
def _prefill_logits(model, tokens):
    b, n = tokens.shape
    return model(tokens, model.init_state(b, 16), chain(b, n))[0]


def logits(model, tokens=TOKENS):
    return np.asarray(_prefill_logits(model, jnp.asarray(tokens)))


def assert_bit_identical(a, b):
    fa, fb = flat_params(a), flat_params(b)
    assert fa.keys() == fb.keys()
    for k in fa:
        x, y = np.asarray(fa[k]), np.asarray(fb[k])
        assert x.dtype == y.dtype and x.shape == y.shape, k
        # Compare the bits, so that -0.0 vs 0.0 or a NaN payload would count as a difference.
        assert np.array_equal(x.view(f"u{x.itemsize}"), y.view(f"u{y.itemsize}")), k


# ------------------------------------------------------------------------------------------------
# Round trips


@pytest.mark.parametrize("name", ["causal", "causal_sharded", "cond", "cond_sharded"])
def test_round_trip_is_exact(ckpts, tmp_path, name):
    path, torch_model, _ = ckpts[name]
    direct = load_target(path, dtype="float32")

    # Every converted param is the file's tensor, transposed where the layout says so, bit for bit.
    layout = target_layout(direct.cfg)
    params = checkpoint_params(direct)
    files = [path / "model.safetensors"] if (path / "model.safetensors").exists() else sorted(path.glob("model-0*"))
    seen = set()
    for f in files:
        tensors, _ = read_file(f)
        for key, value in tensors.items():
            name_ = key.removeprefix("model.language_model.").removeprefix("model.")
            if key.startswith(("model.visual.", "mtp.")):
                continue
            p, _, kind = layout[name_]
            np.testing.assert_array_equal(np.asarray(params[p]), np.asarray(transform(value, kind)), err_msg=key)
            seen.add(p)
    assert seen == set(params)

    with torch.no_grad():
        ref = torch_model(torch.tensor(TOKENS.astype(np.int64))).logits.numpy()
    got = logits(direct)
    assert np.abs(got - ref).max() <= 1e-4 * np.abs(ref).max()

    out = save_converted(direct, tmp_path / "out", path)
    restored = restore_converted(out)
    assert restored.cfg == direct.cfg
    assert_bit_identical(direct, restored)
    np.testing.assert_array_equal(logits(restored), got)
    assert_bit_identical(load_model(out), direct)
    assert_bit_identical(load_model(path, dtype="float32"), direct)


def test_restore_casts_to_requested_dtype_like_direct_load(ckpts, tmp_path):
    path = ckpts["causal"][0]
    out = save_converted(load_target(path, dtype="float32"), tmp_path / "out", path)
    restored = restore_converted(out, dtype="bfloat16")
    assert restored.cfg.dtype == "bfloat16"
    assert all(v.dtype == jnp.bfloat16 for v in flat_params(restored).values())
    assert_bit_identical(restored, load_target(path, dtype="bfloat16"))


def test_default_dtype_is_the_saved_one(ckpts, tmp_path):
    path = ckpts["causal"][0]
    out = save_converted(load_target(path, dtype="bfloat16"), tmp_path / "out", path)
    assert json.loads((out / "jaxspec.json").read_text())["dtype"] == "bfloat16"
    assert all(v.dtype == jnp.bfloat16 for v in flat_params(restore_converted(out)).values())


@pytest.mark.parametrize("how", ["one", "per_param"])
def test_sharding_is_applied_on_load_and_restore(ckpts, tmp_path, how):
    path = ckpts["causal_sharded"][0]
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("x",))
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    split = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x"))
    calls = []

    def per_param(p, shape):
        calls.append(p)
        return split if len(shape) == 2 else replicated

    spec = replicated if how == "one" else per_param
    want = (lambda p, v: replicated) if how == "one" else (lambda p, v: split if v.ndim == 2 else replicated)
    direct = load_target(path, dtype="float32", sharding=spec)
    for p, v in flat_params(direct).items():
        assert v.sharding == want(p, v), p
    out = save_converted(direct, tmp_path / "out", path)
    restored = restore_converted(out, sharding=spec)
    for p, v in flat_params(restored).items():
        assert v.sharding == want(p, v), p
    assert_bit_identical(direct, restored)
    if how == "per_param":
        # Each checkpoint tensor is placed as it is read, then each fused kernel once it is complete.
        assert set(calls) == set(flat_params(direct)) | set(checkpoint_params(direct))


def test_visual_and_mtp_tensors_are_never_read(ckpts, monkeypatch):
    path = ckpts["cond_sharded"][0]
    read = []
    real = hf._read
    monkeypatch.setattr(hf, "_read", lambda info, handles: read.append(info.key) or real(info, handles))
    model = load_target(path, dtype="float32")
    assert len(read) == len(set(read)) == len(checkpoint_params(model))
    assert not [k for k in read if k.startswith(("model.visual.", "mtp."))]


# ------------------------------------------------------------------------------------------------
# MTP tensors


@pytest.mark.parametrize("name", ["cond", "cond_sharded"])
def test_mtp_tensors_are_returned_raw(ckpts, tmp_path, name):
    path, _, mtp = ckpts[name]
    got = load_mtp_tensors(path)
    assert got.keys() == mtp.keys()
    for k in mtp:
        assert got[k].dtype == mtp[k].dtype and got[k].shape == mtp[k].shape, k
        np.testing.assert_array_equal(got[k].view(np.uint8), mtp[k].view(np.uint8), err_msg=k)
    # The converted dir keeps them for a later MTP drafter.
    out = save_converted(load_target(path, dtype="float32"), tmp_path / "out", path)
    again = load_mtp_tensors(out)
    assert again.keys() == mtp.keys()
    for k in mtp:
        np.testing.assert_array_equal(again[k].view(np.uint8), mtp[k].view(np.uint8), err_msg=k)


def test_no_mtp_tensors_is_a_clear_error(ckpts, tmp_path):
    path = ckpts["causal"][0]
    with pytest.raises(CheckpointError, match="no mtp") as e:
        load_mtp_tensors(path)
    assert str(path) in str(e.value)
    out = save_converted(load_target(path, dtype="float32"), tmp_path / "out", path)
    assert not (out / "mtp.safetensors").exists()
    with pytest.raises(CheckpointError, match="no mtp") as e:
        load_mtp_tensors(out)
    assert str(out) in str(e.value)


# ------------------------------------------------------------------------------------------------
# Bad checkpoints: each error names the file and the key


def test_missing_tensor(bad):
    path = bad()
    key = "model.layers.1.mlp.down_proj.weight"
    rewrite(path / "model.safetensors", lambda t: {k: v for k, v in t.items() if k != key})
    with pytest.raises(CheckpointError, match="missing 1 tensor") as e:
        load_target(path)
    assert key in str(e.value) and str(path) in str(e.value)


def test_missing_tensor_sharded(bad):
    path = bad("causal_sharded")
    index = path / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    key = "model.layers.2.linear_attn.out_proj.weight"
    shard = path / data["weight_map"].pop(key)
    rewrite(shard, lambda t: {k: v for k, v in t.items() if k != key})
    index.write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match="missing 1 tensor") as e:
        load_target(path)
    assert key in str(e.value) and str(index) in str(e.value)


def test_missing_lm_head_says_why_it_is_needed(bad):
    path = bad()
    rewrite(path / "model.safetensors", lambda t: {k: v for k, v in t.items() if k != "lm_head.weight"})
    with pytest.raises(CheckpointError, match="tie_word_embeddings=false") as e:
        load_target(path)
    assert "'lm_head.weight'" in str(e.value)


def test_tied_embeddings_convert_and_say_lm_head_is_not_separate(tmp_path):
    """tie_word_embeddings=true: transformers saves no lm_head.weight and its logits come from the embedding; an
    lm_head.weight in such a checkpoint is refused with that reason, and without the tie it is required."""
    path = tmp_path / "tied"
    torch_model = make_causal_lm(path, tie_word_embeddings=True)
    tensors, _ = read_file(path / "model.safetensors")
    assert "lm_head.weight" not in tensors and json.loads((path / "config.json").read_text())["tie_word_embeddings"]
    model = load_target(path, dtype="float32")
    assert model.cfg.tie_word_embeddings
    with torch.no_grad():
        ref = torch_model(torch.tensor(TOKENS.astype(np.int64))).logits.numpy()
    got = logits(model)
    assert np.abs(got - ref).max() <= 1e-4 * np.abs(ref).max()

    rewrite(path / "model.safetensors", lambda t: {**t, "lm_head.weight": np.zeros((512, 64), np.float32)})
    with pytest.raises(CheckpointError, match="unexpected tensor 'lm_head.weight'") as e:
        load_target(path)
    msg = str(e.value)
    assert f"({path / 'config.json'} has tie_word_embeddings=true, so there is no separate lm_head)" in msg, msg
    assert msg.startswith(f"{path / 'model.safetensors'}: "), msg

    rewrite(path / "model.safetensors", lambda t: {k: v for k, v in t.items() if k != "lm_head.weight"})
    edit_config(path, lambda c: c.update(tie_word_embeddings=False))
    with pytest.raises(CheckpointError, match="missing 1 tensor") as e:
        load_target(path)
    msg = str(e.value)
    assert "'lm_head.weight'" in msg and "tie_word_embeddings=false, so lm_head.weight is required" in msg, msg
    assert "tie_word_embeddings=true" not in msg, msg


def test_index_lists_a_key_its_shard_lacks(bad):
    path = bad("causal_sharded")
    index = path / "model.safetensors.index.json"
    key = "model.layers.0.mlp.up_proj.weight"
    shard = path / json.loads(index.read_text())["weight_map"][key]
    rewrite(shard, lambda t: {k: v for k, v in t.items() if k != key})
    with pytest.raises(CheckpointError, match="does not contain it") as e:
        load_target(path)
    assert key in str(e.value) and shard.name in str(e.value) and str(index) in str(e.value)


@pytest.mark.parametrize("key", ["model.layers.0.mlp.extra_proj.weight", "model.layers.0.self_attn.q_proj.weight",
                                 "foo.bar.weight"])
def test_unexpected_tensor(bad, key):
    path = bad()
    rewrite(path / "model.safetensors", lambda t: {**t, key: np.zeros((4, 4), np.float32)})
    with pytest.raises(CheckpointError) as e:
        load_target(path)
    msg = str(e.value)
    assert key in msg and str(path / "model.safetensors") in msg
    if "self_attn" in key:  # a full-attention weight in a GDN layer points at layer_types
        assert "layer_types[0]" in msg
    else:
        assert "unexpected tensor" in msg


def test_duplicate_tensor_in_two_files(bad):
    path = bad()  # no index: every *.safetensors in the dir is part of the checkpoint
    key = "model.norm.weight"
    save_file({key: np.ones((64,), np.float32)}, str(path / "model-extra.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="stored twice") as e:
        load_target(path)
    assert key in str(e.value) and "model-extra.safetensors" in str(e.value) and "model.safetensors" in str(e.value)


@pytest.mark.parametrize("name,other", [("causal", "model.language_model.norm.weight"),
                                        ("cond", "model.norm.weight")])
def test_a_checkpoint_mixing_two_key_layouts_is_refused(bad, name, other):
    """The flat `model.X` and the multimodal `model.language_model.X` spelling of one weight: which one is the
    model's is ambiguous, so neither is picked."""
    path = bad(name)
    rewrite(path / "model.safetensors", lambda t: {**t, other: np.ones((64,), np.float32)})
    with pytest.raises(CheckpointError, match="mixes two key layouts") as e:
        load_target(path, dtype="float32")
    msg = str(e.value)
    assert "'model.norm.weight'" in msg and "'model.language_model.norm.weight'" in msg, msg
    assert msg.startswith(f"{path / 'model.safetensors'}: tensor "), msg


def test_shard_holds_a_key_the_index_puts_elsewhere(bad):
    path = bad("causal_sharded")
    index = path / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    key = "model.norm.weight"
    home = data["weight_map"][key]
    other = next(f for f in sorted(set(data["weight_map"].values())) if f != home)
    moved = read_file(path / home)[0][key]
    rewrite(path / home, lambda t: {k: v for k, v in t.items() if k != key})
    rewrite(path / other, lambda t: {**t, key: moved})
    with pytest.raises(CheckpointError, match=f"lists it in {home}") as e:
        load_target(path)
    assert key in str(e.value) and str(path / other) in str(e.value)
    # A shard the index does not list is not part of the checkpoint, even with a valid name.
    data["weight_map"][key] = other
    index.write_text(json.dumps(data))
    save_file({key: np.ones((3,), np.float32)}, str(path / "model-stray.safetensors"), metadata={"format": "pt"})
    load_target(path, dtype="float32")


@pytest.mark.parametrize("key,shape,want,hint", [
    ("model.layers.0.linear_attn.in_proj_z.weight", (97, 64), "[96, 64]", "linear_num_value_heads=6"),
    ("model.layers.3.self_attn.q_norm.weight", (16,), "[32]", "head_dim=32"),
    ("model.layers.1.linear_attn.norm.weight", (64,), "[16]", "linear_value_head_dim=16"),
    ("model.layers.2.linear_attn.conv1d.weight", (160, 1, 3), "[160, 1, 4]", "linear_conv_kernel_dim=4"),
    ("model.layers.3.mlp.up_proj.weight", (64, 128), "[128, 64]", "intermediate_size=128"),
    ("model.norm.weight", (63,), "[64]", "hidden_size=64"),
    ("lm_head.weight", (64, 512), "[512, 64]", "vocab_size=512"),
])
def test_misshaped_tensor(bad, key, shape, want, hint):
    path = bad()
    rewrite(path / "model.safetensors", lambda t: {**t, key: np.zeros(shape, np.float32)})
    with pytest.raises(CheckpointError, match=re.escape(f"has shape {list(shape)}")) as e:
        load_target(path)
    msg = str(e.value)
    assert f"tensor {key!r}" in msg and str(path / "model.safetensors") in msg and f"implies {want}" in msg
    assert hint in msg, msg


def test_non_float_tensor(bad):
    path = bad()
    key = "model.layers.3.self_attn.q_norm.weight"
    rewrite(path / "model.safetensors", lambda t: {**t, key: np.zeros((32,), np.int8)})
    with pytest.raises(CheckpointError, match="stored as I8") as e:
        load_target(path)
    assert key in str(e.value) and str(path / "model.safetensors") in str(e.value)


def edit_config(path, edit):
    cfg = json.loads((path / "config.json").read_text())
    edit(cfg)
    (path / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("field,value,words", [
    ("hidden_size", 96, ["hidden_size=96", "'model.embed_tokens.weight'", "[512, 64]", "hidden_size 64"]),
    ("vocab_size", 600, ["vocab_size=600", "'model.embed_tokens.weight'", "[512, 64]", "vocab_size 512"]),
    ("intermediate_size", 100, ["intermediate_size=100", "'model.layers.0.mlp.down_proj.weight'", "[64, 128]",
                                 "[64, 100]"]),
])
def test_config_does_not_match_weights(bad, field, value, words):
    path = bad()
    edit_config(path, lambda c: c.update({field: value}))
    with pytest.raises(CheckpointError) as e:
        load_target(path)
    msg = str(e.value)
    assert "config.json" in msg and "model.safetensors" in msg
    for w in words:
        assert w in msg


def test_config_has_fewer_layers_than_weights(bad):
    path = bad()
    edit_config(path, lambda c: c.update(num_hidden_layers=3, layer_types=c["layer_types"][:3]))
    with pytest.raises(CheckpointError, match="num_hidden_layers=3") as e:
        load_target(path)
    assert "model.layers.3." in str(e.value) and str(path / "config.json") in str(e.value)


def test_config_has_more_layers_than_weights(bad):
    path = bad()
    edit_config(path, lambda c: c.update(num_hidden_layers=8, layer_types=c["layer_types"] * 2))
    with pytest.raises(CheckpointError, match=r"num_hidden_layers=8 .* only decoder layers 0\.\.3") as e:
        load_target(path)
    assert str(path / "config.json") in str(e.value)


def test_config_layer_types_do_not_match_weights(bad):
    path = bad()
    edit_config(path, lambda c: c.update(layer_types=["full_attention"] + c["layer_types"][1:]))
    with pytest.raises(CheckpointError, match=r"layer_types\[0\]='full_attention'") as e:
        load_target(path)
    assert "model.layers.0.linear_attn." in str(e.value) and "model.safetensors" in str(e.value)


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
@pytest.mark.parametrize("name", ["causal", "causal_sharded"])
def test_corrupt_safetensors(bad, name, damage):
    path = bad(name)
    f = path / "model.safetensors" if name == "causal" else sorted(path.glob("model-0*"))[2]
    data = f.read_bytes()
    f.write_bytes({"truncated": data[:-100], "garbage": b"not a safetensors file" * 10, "empty": b""}[damage])
    with pytest.raises(CheckpointError, match="corrupt or truncated") as e:
        load_target(path)
    assert str(f) in str(e.value)


def test_index_lists_a_missing_shard(bad):
    path = bad("causal_sharded")
    shard = sorted(path.glob("model-0*"))[3]
    shard.unlink()
    with pytest.raises(CheckpointError, match="missing") as e:
        load_target(path)
    msg = str(e.value)
    assert shard.name in msg and str(path / "model.safetensors.index.json") in msg


@pytest.mark.parametrize("content", ["{not json", json.dumps({"metadata": {}}), json.dumps({"weight_map": []})])
def test_index_is_not_an_index(bad, content):
    path = bad("causal_sharded")
    (path / "model.safetensors.index.json").write_text(content)
    with pytest.raises(CheckpointError, match="not a valid safetensors index") as e:
        load_target(path)
    assert str(path / "model.safetensors.index.json") in str(e.value)


def test_index_cannot_point_outside_the_dir(bad):
    path = bad("causal_sharded")
    index = path / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    key = next(iter(data["weight_map"]))
    shutil.copy(path / data["weight_map"][key], path.parent / "outside.safetensors")
    data["weight_map"][key] = "../outside.safetensors"
    index.write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match="not a file name") as e:
        load_target(path)
    assert key in str(e.value) and str(index) in str(e.value)


class _Payload:
    """Unpickling this creates a marker file: proof that a loader ran pickle code."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def _pickle_dir(tmp_path, ckpts, name):
    path = tmp_path / "pickled"
    path.mkdir()
    shutil.copy(ckpts["causal"][0] / "config.json", path)
    marker = tmp_path / "PICKLE_RAN"
    (path / name).write_bytes(pickle.dumps(_Payload(marker)))
    return path, marker


@pytest.mark.parametrize("name", ["pytorch_model.bin", "model.pt", "model.pth"])
def test_pickle_checkpoints_are_refused_unread(ckpts, tmp_path, name):
    path, marker = _pickle_dir(tmp_path, ckpts, name)
    for target in (path, path / name):
        with pytest.raises(CheckpointError, match="pickle") as e:
            load_target(target)
        assert name in str(e.value) and "arbitrary code" in str(e.value)
        with pytest.raises(CheckpointError, match="pickle"):
            load_model(target)
    assert not marker.exists()


def test_pickle_index_is_refused(ckpts, tmp_path):
    path, marker = _pickle_dir(tmp_path, ckpts, "pytorch_model-00001-of-00001.bin")
    (path / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"lm_head.weight": "pytorch_model-00001-of-00001.bin"}}))
    with pytest.raises(CheckpointError, match="pickle") as e:
        load_target(path)
    assert "pytorch_model-00001-of-00001.bin" in str(e.value)
    assert not marker.exists()


def test_safetensors_win_over_a_pickle_next_to_them(bad, tmp_path):
    path = bad()
    marker = tmp_path / "PICKLE_RAN"
    (path / "pytorch_model.bin").write_bytes(pickle.dumps(_Payload(marker)))
    load_target(path, dtype="float32")
    assert not marker.exists()


def test_not_a_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="no such checkpoint directory"):
        load_model(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no \\*.safetensors") as e:
        load_target(tmp_path / "empty")
    assert str(tmp_path / "empty") in str(e.value)


def test_missing_config_is_a_config_error(bad):
    path = bad()
    (path / "config.json").unlink()
    with pytest.raises(ConfigError, match="no such file") as e:
        load_target(path)
    assert str(path / "config.json") in str(e.value)


# ------------------------------------------------------------------------------------------------
# Saving: atomic, no overwrite by accident, config and tokenizer files travel along


TOKENIZER = {"tokenizer.json": '{"model": {}}', "tokenizer_config.json": '{"eos_token": "<|im_end|>"}',
             "vocab.json": "{}", "merges.txt": "#version: 0.2\n", "special_tokens_map.json": "{}",
             "chat_template.jinja": "{{ messages }}"}


def test_save_copies_config_and_tokenizer_files(bad, tmp_path):
    path = bad()
    for name, text in TOKENIZER.items():
        (path / name).write_text(text)
    (path / "unrelated.txt").write_text("not copied")
    out = save_converted(load_target(path, dtype="float32"), tmp_path / "out", path)
    assert (out / "config.json").read_bytes() == (path / "config.json").read_bytes()
    for name in [*TOKENIZER, "generation_config.json"]:
        assert (out / name).read_bytes() == (path / name).read_bytes(), name
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [*TOKENIZER, "generation_config.json", "config.json", "jaxspec.json", "params"])


def test_save_refuses_to_overwrite(ckpts, tmp_path):
    path = ckpts["causal"][0]
    model = load_target(path, dtype="float32")
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="overwrite") as e:
        save_converted(model, out, path)
    assert str(out) in str(e.value)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]

    # --overwrite never wipes a dir of other files: only an empty dir or an earlier conversion.
    with pytest.raises(FileExistsError, match=r"not replaced: it holds files \(keep.txt\) but no jaxspec.json") as e:
        save_converted(model, out, path, overwrite=True)
    assert str(out) in str(e.value)
    assert [p.name for p in out.iterdir()] == ["keep.txt"] and (out / "keep.txt").read_text() == "mine"
    (out / "keep.txt").unlink()
    save_converted(model, out, path, overwrite=True)  # an empty dir
    (out / "keep.txt").write_text("mine")             # an earlier conversion, whatever else it holds
    save_converted(model, out, path, overwrite=True)
    assert not (out / "keep.txt").exists()
    assert_bit_identical(restore_converted(out), model)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # neither temp nor old dir left

    (tmp_path / "file").write_text("mine")
    with pytest.raises(FileExistsError, match="it is a file"):
        save_converted(model, tmp_path / "file", path, overwrite=True)
    assert (tmp_path / "file").read_text() == "mine"


@pytest.mark.parametrize("existing", [False, True])
def test_failed_save_leaves_nothing_behind(ckpts, tmp_path, monkeypatch, existing):
    path = ckpts["cond"][0]
    model = load_target(path, dtype="float32")
    out = tmp_path / "out"
    if existing:  # an earlier conversion, which --overwrite may replace
        out.mkdir()
        (out / "keep.txt").write_text("mine")
        (out / "jaxspec.json").write_text('{"format": "jaxspec-target"}')
    real_save = ocp.Checkpointer.save
    saved = []

    def save_then_fail(self, path, *a, **kw):  # the params are on disk when the failure hits
        real_save(self, path, *a, **kw)
        saved.append((Path(path) / "manifest.ocdbt").exists())
        raise OSError("No space left on device")

    monkeypatch.setattr(ocp.Checkpointer, "save", save_then_fail)
    with pytest.raises(OSError, match="No space left"):
        save_converted(model, out, path, overwrite=existing)
    assert saved == [True]  # the params had been written when the failure hit
    assert sorted(p.name for p in tmp_path.iterdir()) == (["out"] if existing else [])
    if existing:
        assert sorted(p.name for p in out.iterdir()) == ["jaxspec.json", "keep.txt"]


def test_an_out_dir_that_appears_during_the_write_is_not_replaced(ckpts, tmp_path, monkeypatch):
    """OUT_DIR is checked again just before the final rename: a dir made there during the (minutes-long) write, by
    the user or a second conversion, is refused as it would have been before the load, and keeps its files."""
    from convert import store
    src = ckpts["causal"][0]
    model = load_target(src, dtype="float32")
    out = tmp_path / "out"
    real = store.write_tree

    def write_then_appear(values, path):
        real(values, path)
        out.mkdir()
        (out / "precious.txt").write_text("mine")

    monkeypatch.setattr(store, "write_tree", write_then_appear)
    for overwrite, words in [(False, "already exists"), (True, "it holds files (precious.txt) but no jaxspec.json")]:
        with pytest.raises(FileExistsError, match=re.escape(words)) as e:
            save_converted(model, out, src, overwrite=overwrite)
        assert str(e.value).startswith(f"{out}: ") and not isinstance(e.value, store.OutDirError)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
        assert [p.name for p in out.iterdir()] == ["precious.txt"] and (out / "precious.txt").read_text() == "mine"
        shutil.rmtree(out)


def test_save_refuses_a_param_whose_dtype_or_shape_the_config_does_not_imply(ckpts, tmp_path):
    """A restore reads every param in jaxspec.json's dtype and the config's shape: a param that differs would come
    back rounded (or not at all), so the save refuses it, naming it; nothing is written."""
    from convert import store
    src = ckpts["causal"][0]
    for change, words in [(lambda x: x.astype(jnp.float32), "is float32[512, 64], but"),
                          (lambda x: x[:-1], "is bfloat16[511, 64], but")]:
        model = load_target(src, dtype="bfloat16")
        model.embed_tokens.set_value(change(model.embed_tokens.get_value()))
        with pytest.raises(CheckpointError, match=re.escape(f"param 'embed_tokens' {words}")) as e:
            store.save_converted(model, tmp_path / "out", src)
        assert "implies bfloat16[512, 64]; not saved" in str(e.value)
        assert list(tmp_path.iterdir()) == []


def test_restore_refuses_params_stored_in_another_dtype_than_jaxspec_json_says(ckpts, tmp_path):
    src = ckpts["causal"][0]
    out = save_converted(load_target(src, dtype="float32"), tmp_path / "out", src)
    meta = out / "jaxspec.json"
    meta.write_text(meta.read_text().replace('"float32"', '"bfloat16"'))
    for dtype in (None, "float32"):
        with pytest.raises(CheckpointError, match=r"params: param '[\w.]+' is stored as float32, but .*jaxspec.json "
                                                  "says bfloat16"):
            restore_converted(out, dtype=dtype)
    with pytest.raises(ValueError, match="^dtype 'bf16' is not one of float32, bfloat16, float16$"):
        restore_converted(out, dtype="bf16")


def test_a_write_error_of_tensorstore_names_out_dir(ckpts, tmp_path, monkeypatch, capsys):
    """A full disk or a quota hit while Orbax writes: TensorStore raises a ValueError, not an OSError. It is an
    OutDirError naming OUT_DIR and the cause, as for an OSError; nothing is left behind."""
    from convert import store
    src = ckpts["causal"][0]
    model = load_target(src, dtype="float32")

    def full(values, path):
        path.mkdir()
        raise ValueError(f'RESOURCE_EXHAUSTED: Error writing "embed_tokens/0.0" in OCDBT database at local file '
                         f'"{path}/d/x": No space left on device')

    monkeypatch.setattr(store, "write_tree", full)
    out = tmp_path / "out"
    with pytest.raises(store.OutDirError) as e:
        save_converted(model, out, src)
    assert str(e.value).startswith(f"{out}: cannot be written: writing the params failed (ValueError: "
                                   "RESOURCE_EXHAUSTED: Error writing"), e.value
    assert list(tmp_path.iterdir()) == []
    capsys.readouterr()
    assert cli_main(["target", str(src), str(out), "--dtype", "float32"]) == 2      # one line, no traceback
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]     # after the load's progress lines
    assert last.startswith(f"error: {out}: cannot be written: writing the params") and "Traceback" not in err, err
    assert list(tmp_path.iterdir()) == []


def test_an_incomplete_orbax_checkpoint_is_not_reported_as_saved(ckpts, tmp_path, monkeypatch):
    """What Orbax wrote is read back before the rename: a checkpoint without every param's metadata (as Orbax
    leaves one in a path it globs wrongly) fails the save, not a later restore."""
    from convert import store
    src = ckpts["causal"][0]
    model = load_target(src, dtype="float32")
    real = store.write_tree
    monkeypatch.setattr(store, "write_tree", lambda values, path: real(dict(list(values.items())[1:]), path))
    out = tmp_path / "out"
    with pytest.raises(store.OutDirError, match=re.escape(f"{out}: cannot be written: Orbax wrote an incomplete "
                                                          "checkpoint (params missing)")):
        save_converted(model, out, src)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["a[1]", "back\\slash"])
def test_a_path_that_orbax_globs_is_refused_before_loading(bad, tmp_path, capsys, monkeypatch, name):
    """Orbax's writer globs the temp dir's path: under `a[1]` it writes no params, under a backslash it writes them
    elsewhere, and reports success both times. Such an OUT_DIR is refused before the load."""
    src = bad()
    capsys.readouterr()  # what writing the fixture printed
    monkeypatch.setattr(hf, "load_target", lambda *a, **kw: pytest.fail("loaded the model before checking OUT_DIR"))
    out = tmp_path / name / "out"
    assert cli_main(["target", str(src), str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {out}: has ") and "which Orbax's writer takes as a glob pattern" in err, err
    assert not (tmp_path / name).exists()


def _dead_pid() -> str:
    """The id of a process that has exited."""
    return subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()


def test_what_a_killed_overwrite_moved_aside_is_removed_by_the_next_save(ckpts, tmp_path):
    """A save with overwrite moves the previous OUT_DIR aside as .NAME.old-PID-XXXX before its rename, and removes
    it after; killed outright after the rename, it leaves that dir (a whole conversion's size) beside the new
    OUT_DIR. The next save removes it, but never a running process's."""
    src = ckpts["causal"][0]
    model = load_target(src, dtype="float32")
    out = save_converted(model, tmp_path / "out", src)
    stale = tmp_path / f".out.old-{_dead_pid()}-0123456789ab"
    live = tmp_path / f".out.old-{os.getpid()}-0123456789ab"
    for d in (stale, live):
        d.mkdir()
        (d / "jaxspec.json").write_text('{"format": "jaxspec-target"}')
    save_converted(model, out, src, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == [live.name, "out"]


def test_a_conversion_that_a_killed_overwrite_moved_aside_is_put_back(ckpts, tmp_path, capsys):
    """Killed between replace_dir's two renames, a save with overwrite leaves no OUT_DIR, its previous content
    hidden as .NAME.old-PID-XXXX. The next save puts it back first, so that one without overwrite refuses it as any
    existing conversion (and it restores bit for bit), and one with overwrite replaces it."""
    src = ckpts["causal"][0]
    model = load_target(src, dtype="float32")
    aside = tmp_path / f".out.old-{_dead_pid()}-0123456789ab"
    os.rename(save_converted(model, tmp_path / "out", src), aside)
    with pytest.raises(FileExistsError, match="already exists"):
        save_converted(model, tmp_path / "out", src)
    assert f"convert: put {aside} back as {tmp_path / 'out'}" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert_bit_identical(restore_converted(tmp_path / "out"), model)
    save_converted(model, tmp_path / "out", src, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_an_out_dir_that_links_to_a_dir_writes_that_dir(ckpts, tmp_path):
    """OUT_DIR a link to a dir (on another disk, say): the save replaces the linked dir, the link stays and reads
    the new conversion; the link itself is not replaced by a dir."""
    src = ckpts["causal"][0]
    model = load_target(src, dtype="float32")
    (tmp_path / "disk").mkdir()
    real = save_converted(model, tmp_path / "disk" / "conv", src)
    link = tmp_path / "out"
    link.symlink_to(real)
    assert save_converted(model, link, src, overwrite=True) == real
    assert link.is_symlink() and link.resolve() == real
    assert sorted(p.name for p in (tmp_path / "disk").iterdir()) == ["conv"]
    assert_bit_identical(restore_converted(link), model)


@pytest.fixture
def default_sigint():
    """Python's own Ctrl-C handler, as an interactive run has: a job that a shell put in the background starts with
    SIGINT ignored, and the save leaves an ignored SIGINT alone."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_during_the_replace_waits_for_it(ckpts, tmp_path, monkeypatch, default_sigint):
    """Ctrl-C while an earlier conversion is being replaced is raised once the new one is in place and the old one
    removed: never a missing OUT_DIR, nor an old dir left beside it."""
    from convert import store
    src = ckpts["causal"][0]
    model = load_target(src, dtype="float32")
    out = save_converted(model, tmp_path / "out", src)
    real = shutil.rmtree

    def interrupted(path, *a, **kw):    # Ctrl-C as the replaced conversion's removal starts
        if ".old-" in Path(path).name:
            signal.raise_signal(signal.SIGINT)
        real(path, *a, **kw)

    monkeypatch.setattr(shutil, "rmtree", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save_converted(model, out, src, overwrite=True)
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    assert_bit_identical(restore_converted(out), model)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_write_error_in_an_out_dir_inside_the_source_names_out_dir(ckpts, tmp_path, monkeypatch):
    """OUT_DIR may lie inside the source dir (`convert target ckpt ckpt/jax`): an error writing its temp dir is
    still OUT_DIR's, not the source's."""
    import errno
    from convert import store
    src = tmp_path / "ckpt"
    shutil.copytree(ckpts["causal"][0], src)
    model = load_target(src, dtype="float32")

    def full(values, path):
        raise OSError(errno.ENOSPC, "No space left on device", str(path / "d" / "x"))

    monkeypatch.setattr(store, "write_tree", full)
    out = src / "jax"
    with pytest.raises(store.OutDirError, match=re.escape(f"{out}: cannot be written: No space left on device")):
        save_converted(model, out, src)
    assert not any(p.name.startswith(".jax") or p.name == "jax" for p in src.iterdir())


def test_save_refuses_a_model_the_config_does_not_describe(ckpts, tmp_path):
    other = tmp_path / "other"
    make_causal_lm(other, intermediate_size=96)
    with pytest.raises(CheckpointError, match="does not describe this model") as e:
        save_converted(load_target(other, dtype="float32"), tmp_path / "out", ckpts["causal"][0])
    assert str(ckpts["causal"][0] / "config.json") in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other"]


def test_restore_checks_the_config_against_the_params(ckpts, tmp_path, capsys):
    path = ckpts["causal"][0]
    out = save_converted(load_target(path, dtype="float32"), tmp_path / "out", path)
    cfg = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**cfg, "intermediate_size": 96}))
    capsys.readouterr()
    with pytest.raises(CheckpointError, match=r"'layers.0.mlp.down_proj.kernel' has shape \[128, 64\].*\[96, 64\]") \
            as e:
        restore_converted(out, progress=True)
    assert str(out / "params") in str(e.value) and "mlp" in str(e.value)
    assert capsys.readouterr().err == ""        # no progress line before a refusal: the error is the only line
    (out / "config.json").write_text(json.dumps(cfg))
    (out / "jaxspec.json").unlink()
    with pytest.raises(CheckpointError, match="jaxspec.json") as e:
        restore_converted(out)
    assert str(out) in str(e.value)


# When one array read fails, Orbax closes its event loop while TensorStore still completes the other
# reads; their callbacks then hit the closed loop in a background thread (noise, not our error).
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("victim,match", [("_METADATA", "no readable Orbax metadata"),
                                          ("ocdbt.process_0/d/*", "cannot restore the Orbax checkpoint")])
def test_restore_of_a_damaged_params_dir(ckpts, tmp_path, victim, match):
    path = ckpts["causal"][0]
    out = save_converted(load_target(path, dtype="float32"), tmp_path / "out", path)
    files = list((out / "params").glob(victim))
    assert files
    for f in files:
        with open(f, "r+b") as fh:
            fh.truncate(10)
    with pytest.raises(CheckpointError, match=match) as e:
        restore_converted(out)
    assert str(out / "params") in str(e.value)


def test_save_refuses_to_replace_its_source(bad):
    path = bad()
    before = sorted(p.name for p in path.iterdir())
    with pytest.raises(CheckpointError, match="source checkpoint dir itself"):
        save_converted(load_target(path, dtype="float32"), path, path, overwrite=True)
    assert sorted(p.name for p in path.iterdir()) == before


def test_save_refuses_a_folder_above_its_source(bad, tmp_path):
    """OUT_DIR above the source would be replaced, and the source with it."""
    anc = tmp_path / "anc"
    anc.mkdir()
    src = bad().rename(anc / "hf")
    model = load_target(src, dtype="float32")
    for out in (anc, tmp_path):
        with pytest.raises(CheckpointError, match="is a folder above the source checkpoint dir") as e:
            save_converted(model, out, src, overwrite=True)
        assert str(out) in str(e.value) and str(src) in str(e.value)
    assert (src / "model.safetensors").is_file() and sorted(p.name for p in tmp_path.iterdir()) == ["anc"]


def test_save_removes_temp_dirs_a_killed_save_left(ckpts, tmp_path, capsys):
    path = ckpts["causal"][0]
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()       # a process id that has exited
    stales = [tmp_path / ".out.tmp-0123456789ab", tmp_path / f".out.tmp-{gone}-0123456789ab"]   # older saves' name
    for stale in stales:
        (stale / "params").mkdir(parents=True)
    # another dir's; not our name; a save still running (this test's parent process stands in for it)
    keep = [tmp_path / ".other.tmp-0123456789ab", tmp_path / ".out.tmp-mine",
            tmp_path / f".out.tmp-{os.getppid()}-0123456789ab"]
    for k in keep:
        k.mkdir()
    handler = signal.getsignal(signal.SIGTERM)
    save_converted(load_target(path, dtype="float32"), tmp_path / "out", path)
    assert signal.getsignal(signal.SIGTERM) == handler  # the save's SIGTERM handler is gone again
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["out", *(k.name for k in keep)])
    err = capsys.readouterr().err
    assert all(f"removed {stale}, left behind by an interrupted write of {tmp_path / 'out'}" in err
               for stale in stales), err


# A save killed by SIGTERM; `save` is given a model and kind that need no checkpoint, and the params writer
# sends the signal (during the write, or just before the final rename).
_SIGTERM_SCRIPT = """
import os, signal, sys, time
from pathlib import Path
from types import SimpleNamespace
from convert import store

out, src, when = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
cfg = SimpleNamespace(dtype="float32")
replace = store.replace_dir

def write_params(model, path):
    path.mkdir()
    (path / "half").write_text("written")
    if when == "write":
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(60)

def replace_after_sigterm(tmp, out_dir):
    os.kill(os.getpid(), signal.SIGTERM)
    replace(tmp, out_dir)

store._write_params, store.replace_dir = write_params, replace_after_sigterm
store._check_params = lambda kind, model, config_path: None     # a fake model: no params to check
store.save(store.Kind("fake", "jaxspec-fake", 1, lambda path, dtype: cfg, None), SimpleNamespace(cfg=cfg), out, src)
"""


@pytest.mark.parametrize("when", ["write", "replace"])
def test_sigterm_during_save_leaves_nothing_behind(tmp_path, when):
    src, work = tmp_path / "src", tmp_path / "work"
    src.mkdir()
    work.mkdir()
    (src / "config.json").write_text("{}")
    r = subprocess.run([sys.executable, "-c", _SIGTERM_SCRIPT, str(work / "out"), str(src), when], cwd=REPO,
                       env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=120)
    assert r.returncode == 128 + signal.SIGTERM, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr
    if when == "write":  # killed while writing: the temp dir is gone, nothing else was written
        assert os.listdir(work) == []
    else:  # a SIGTERM just before the final rename waits for it: the complete result, and no temp dir
        assert os.listdir(work) == ["out"]
        assert sorted(os.listdir(work / "out")) == ["config.json", "jaxspec.json", "params"]


def test_an_interrupt_waits_for_the_writer_threads_before_removing_the_temp_dir(tmp_path, monkeypatch):
    """Ctrl-C reaches the main thread only, while Orbax's writer threads go on writing files into the temp dir for a
    moment: the dir is removed after they end, not under them (which left it behind, refilled, and printed their
    tracebacks). A failure (Orbax raised it, its threads done) removes the dir without waiting on other threads."""
    import threading
    import time
    from types import SimpleNamespace
    from convert import store
    src, work = tmp_path / "src", tmp_path / "work"
    src.mkdir()
    work.mkdir()
    (src / "config.json").write_text("{}")
    cfg = SimpleNamespace(dtype="float32")

    def write_params(model, path):
        def writer():           # an Orbax thread: its files land for a while after the main thread stopped waiting
            for i in range(8):
                time.sleep(0.05)
                path.mkdir(parents=True, exist_ok=True)
                (path / f"chunk-{i}").write_bytes(b"x" * 64)
        threads.append(threading.Thread(target=writer, name="serialize_shardings"))
        threads[-1].start()
        raise KeyboardInterrupt

    threads = []

    monkeypatch.setattr(store, "_write_params", write_params)
    monkeypatch.setattr(store, "_check_params", lambda kind, model, config_path: None)
    kind = store.Kind("fake", "jaxspec-fake", 1, lambda path, dtype: cfg, None)
    with pytest.raises(KeyboardInterrupt):
        store.save(kind, SimpleNamespace(cfg=cfg), work / "out", src)
    threads[0].join()
    assert os.listdir(work) == []

    def fail_with_a_thread_alive(model, path):     # a failure, not an interrupt: an unrelated thread is not waited on
        threads.append(threading.Thread(target=time.sleep, args=(5,), daemon=True))
        threads[-1].start()
        path.mkdir()
        raise OSError(28, "no space left")

    monkeypatch.setattr(store, "_write_params", fail_with_a_thread_alive)
    begun = time.monotonic()
    with pytest.raises(OSError, match="no space left"):
        store.save(kind, SimpleNamespace(cfg=cfg), work / "out", src)
    assert time.monotonic() - begun < 2.0 and threads[-1].is_alive() and os.listdir(work) == []


# ------------------------------------------------------------------------------------------------
# Progress and the command line


def test_progress_line_per_shard(ckpts, capsys):
    path = ckpts["causal_sharded"][0]
    n = len(list(path.glob("model-0*.safetensors")))
    load_target(path, dtype="float32", progress=True)
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("convert: [")]
    done = [ln for ln in lines if ": done," in ln]
    assert len(done) == n and done[-1].startswith(f"convert: [{n}/{n}]")
    load_target(path, dtype="float32", progress=False)
    assert capsys.readouterr().err == ""


def test_progress_lines_around_a_restore(ckpts, tmp_path, capsys):
    """A converted target's restore: one line before Orbax's read (which takes minutes at 27B) and one after; none
    by default under 1 GB."""
    out = tmp_path / "out"
    save_converted(load_target(ckpts["causal_sharded"][0], dtype="float32"), out, ckpts["causal_sharded"][0])
    capsys.readouterr()
    load_model(out, progress=True)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and re.fullmatch(rf"convert: restoring {out / 'params'} \([0-9.]+ MB on disk\) as "
                                            r"float32", lines[0]), lines
    n = len(flat_params(load_model(out)))
    assert re.fullmatch(rf"convert: restored {n} params in [0-9.]+s", lines[1]), lines
    assert capsys.readouterr().err == ""        # the default, for a tiny target: quiet


def test_cli_converts(ckpts, tmp_path, capsys):
    path = ckpts["cond_sharded"][0]
    out = tmp_path / "out"
    assert cli_main(["target", str(path), str(out), "--dtype", "float32"]) == 0
    assert "wrote" in capsys.readouterr().err
    assert_bit_identical(load_model(out), load_target(path, dtype="float32"))
    assert (out / "mtp.safetensors").exists()

    assert cli_main(["target", str(path), str(out)]) == 2  # exists, no --overwrite
    err = capsys.readouterr().err
    assert err.startswith("error:") and "already exists" in err
    assert cli_main(["target", str(path), str(out), "--overwrite"]) == 0
    assert all(v.dtype == jnp.bfloat16 for v in flat_params(load_model(out)).values())  # default dtype


def test_cli_reports_bad_checkpoints_without_a_traceback(bad, tmp_path, capsys):
    path = bad()
    edit_config(path, lambda c: c.update(hidden_size=96))
    assert cli_main(["target", str(path), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "hidden_size=96" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_cli_refuses_an_out_dir_above_the_source_before_loading(bad, tmp_path, capsys, monkeypatch):
    anc = tmp_path / "anc"
    anc.mkdir()
    src = bad().rename(anc / "hf")
    capsys.readouterr()  # what writing the fixture printed
    monkeypatch.setattr(hf, "load_target", lambda *a, **kw: pytest.fail("loaded the model before checking OUT_DIR"))
    assert cli_main(["target", str(src), str(anc), "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {anc}: is a folder above the source checkpoint dir {src}")
    assert (src / "config.json").is_file()


def test_cli_refuses_an_out_dir_under_a_file_before_loading(bad, tmp_path, capsys, monkeypatch):
    src = bad()
    capsys.readouterr()  # what writing the fixture printed
    (tmp_path / "afile").write_text("mine")
    monkeypatch.setattr(hf, "load_target", lambda *a, **kw: pytest.fail("loaded the model before checking OUT_DIR"))
    for out in (tmp_path / "afile" / "out", tmp_path / "afile" / "sub" / "out"):
        assert cli_main(["target", str(src), str(out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {out}: cannot be created: {tmp_path / 'afile'} is not a directory"), err
    assert (tmp_path / "afile").read_text() == "mine"


def test_cli_ctrl_c_says_interrupted_and_leaves_nothing_behind(ckpts, tmp_path, capsys, monkeypatch):
    def interrupted(self, *a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(ocp.Checkpointer, "save", interrupted)
    src = ckpts["causal"][0]
    capsys.readouterr()  # what writing the fixture printed
    try:
        rc = cli_main(["target", str(src), str(tmp_path / "out"), "--dtype", "float32"])
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C escaped main() as a KeyboardInterrupt, i.e. a traceback")
    assert rc == 130
    err = capsys.readouterr().err
    assert err.strip().endswith("interrupted") and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name,content,words", [
    ("config.json", b'{"model_type": "qwen3_5_text", "note": "\xff"}', ["not UTF-8"]),
    ("config.json", b"[1, 2]", ["expected a JSON object, got list"]),
    ("config.json", {"hidden_size": "abc"}, ["'hidden_size' must be an integer, got 'abc'"]),
    ("config.json", {"num_hidden_layers": None}, ["'num_hidden_layers' must be an integer, got None"]),
    ("config.json", {"rope_parameters": "default"}, ["'rope_parameters' must be an object"]),
    ("config.json", None, ["is a directory"]),
    ("generation_config.json", {"eos_token_id": "abc"}, ["'eos_token_id' must be an integer or a list"]),
    ("generation_config.json", b"[0]", ["expected a JSON object, got list"]),
])
def test_cli_reports_a_malformed_config_without_a_traceback(bad, tmp_path, capsys, name, content, words):
    path = bad()
    target = path / name
    if content is None:
        target.unlink()
        target.mkdir()
    elif isinstance(content, dict):
        target.write_text(json.dumps({**json.loads(target.read_text()), **content}))
    else:
        target.write_bytes(content)
    capsys.readouterr()  # what writing the fixture printed
    assert cli_main(["target", str(path), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {target}: ") and "Traceback" not in err, err
    for w in words:
        assert w in err, err
    assert not (tmp_path / "out").exists()


def test_python_m_convert_help():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for args, want in ((["--help"], "target"), (["target", "--help"], "--overwrite")):
        r = subprocess.run([sys.executable, "-m", "convert", *args], cwd=REPO, env=env, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert want in r.stdout
    r = subprocess.run([sys.executable, "-m", "convert"], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "COMMAND" in r.stderr


def test_save_of_a_tensor_parallel_model_says_to_save_the_unsharded_one(tmp_path):
    """A model loaded with mesh= is in sharding.py's tp layout (here the vocabulary of 509 padded to 510): save
    says so in a line, not with a dump of both configs, and writes nothing."""
    from jaxspec import sharding as S
    src = tmp_path / "v509"
    make_causal_lm(src, vocab_size=509)
    model = load_target(src, dtype="float32", mesh=S.make_mesh(2, 1))
    with pytest.raises(CheckpointError, match=r"2-way tensor-parallel layout .*padded_vocab.*: save the unsharded "
                                              r"model \(loaded without mesh=\)") as e:
        save_converted(model, tmp_path / "out", src)
    msg = str(e.value)
    assert str(src / "config.json") in msg and "TargetConfig(" not in msg and len(msg) < 400, msg
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v509"]


def test_a_config_mismatch_names_only_the_fields_that_differ(tmp_path, ckpts):
    other = tmp_path / "other"
    make_causal_lm(other, intermediate_size=96)
    with pytest.raises(CheckpointError, match="does not describe this model") as e:
        save_converted(load_target(other, dtype="float32"), tmp_path / "out", ckpts["causal"][0])
    msg = str(e.value)
    assert "intermediate_size 128 (config.json) vs 96 (model)" in msg, msg
    assert "TargetConfig(" not in msg and "hidden_size" not in msg and len(msg) < 300, msg


# See test_restore_of_a_damaged_params_dir.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_damaged_array_is_named_by_its_param(ckpts, tmp_path):
    """Orbax's own error names only an array index and the TensorStore spec (`<bound method ...>`); the param's
    key is in the error it was raised from: the CheckpointError names the param and the cause."""
    path = ckpts["causal"][0]
    model = load_target(path, dtype="float32")
    out = save_converted(model, tmp_path / "out", path)
    for f in (out / "params").glob("ocdbt.process_0/d/*"):
        with open(f, "r+b") as fh:
            fh.truncate(10)
    with pytest.raises(CheckpointError, match=r"cannot restore the Orbax checkpoint, it is damaged: param '[\w.]+' "
                                              r"\(") as e:
        restore_converted(out)
    msg = str(e.value)
    name = re.search(r"param '([\w.]+)'", msg).group(1)
    assert name in {".".join(map(str, p)) for p in flat_params(model)}, msg
    assert str(out / "params") in msg and "bound method" not in msg and "\n" not in msg, msg


# ------------------------------------------------------------------------------------------------
# Inputs that transformers reads differently, or that are not HF checkpoints, and unwritable outputs


def test_missing_partial_rotary_factor_gives_transformers_logits(bad):
    """Without partial_rotary_factor transformers' Qwen3_5TextConfig rotates a quarter of the head (0.25), not all
    of it: the logits must still match its."""
    from transformers import AutoModelForCausalLM
    path = bad()

    def drop(c):
        c.pop("partial_rotary_factor", None)
        c["rope_parameters"].pop("partial_rotary_factor")
    edit_config(path, drop)
    ref_model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    assert ref_model.config.rope_parameters["partial_rotary_factor"] == 0.25
    with torch.no_grad():
        ref = ref_model(torch.tensor(TOKENS.astype(np.int64))).logits.numpy()
    model = load_target(path, dtype="float32")
    assert model.cfg.rotary_dim == 8
    got = logits(model)
    assert np.abs(got - ref).max() <= 1e-4 * np.abs(ref).max()


def test_multimodal_checkpoint_without_a_dtype_argument_keeps_its_dtype(ckpts):
    """transformers 5 writes a Qwen3_5ForConditionalGeneration's dtype at the top level of config.json only."""
    path = ckpts["cond"][0]
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["dtype"] == "float32" and "dtype" not in cfg["text_config"]  # the layout this test is about
    model = load_target(path)
    assert model.cfg.dtype == "float32"
    assert all(v.dtype == jnp.float32 for v in flat_params(model).values())


def test_a_single_file_beside_an_index_that_does_not_list_it_is_refused(bad, ckpts):
    """transformers loads model.safetensors and ignores the index: loading the index's shards would give another
    model from the same dir. Where the index lists model.safetensors itself, nothing is ambiguous."""
    path = bad("causal_sharded")
    shutil.copyfile(ckpts["causal"][0] / "model.safetensors", path / "model.safetensors")
    with pytest.raises(CheckpointError) as e:
        load_target(path, dtype="float32")
    msg = str(e.value)
    assert msg.startswith(f"{path}: ") and "model.safetensors and model.safetensors.index.json" in msg, msg

    single = bad("causal")
    keys = read_file(single / "model.safetensors")[0]
    (single / hf.INDEX_NAME).write_text(json.dumps({"weight_map": {k: "model.safetensors" for k in keys}}))
    assert_bit_identical(load_target(single, dtype="float32"), load_target(ckpts["causal"][0], dtype="float32"))


def _quantize_fp8(path):
    """The layout of block-quantized FP8 releases (Qwen/Qwen3.6-27B-FP8): projection weights as F8_E4M3, each with
    a `weight_scale_inv` beside it."""
    def edit(t):
        out = {}
        for k, v in t.items():
            if v.ndim == 2 and "proj" in k and "in_proj_a" not in k and "in_proj_b" not in k:
                out[k] = v.astype(ml_dtypes.float8_e4m3fn)
                out[k + "_scale_inv"] = np.ones((1, 1), np.float32)
            else:
                out[k] = v
        return out
    rewrite(path / "model.safetensors", edit)


@pytest.mark.parametrize("with_config", [True, False])
def test_quantized_checkpoint_is_refused_as_quantized(bad, tmp_path, capsys, with_config):
    path = bad()
    _quantize_fp8(path)
    if with_config:
        edit_config(path, lambda c: c.update(quantization_config={"quant_method": "fp8", "fmt": "e4m3",
                                                                  "weight_block_size": [128, 128]}))
    with pytest.raises(CheckpointError, match="quantized checkpoint") as e:
        load_target(path)
    msg = str(e.value)
    if with_config:
        assert msg.startswith(f"{path / 'config.json'}: ") and "quant_method 'fp8'" in msg, msg
    else:
        assert msg.startswith(f"{path / 'model.safetensors'}: tensor ") and "_scale_inv'" in msg, msg
    assert "unexpected tensor" not in msg, msg
    capsys.readouterr()  # what writing the fixture printed
    assert cli_main(["target", str(path), str(tmp_path / "out")]) == 2
    assert "quantized checkpoint" in capsys.readouterr().err


@pytest.mark.parametrize("where", ["top", "text_config"])
def test_quantization_config_alone_is_refused_as_quantized(bad, where):
    """A multimodal config.json may give quantization_config at its top level or under text_config; either is
    refused by config.json's name even where no tensor has a quantized dtype or a scale beside it."""
    path = bad("cond")
    q = {"quant_method": "awq", "bits": 4}
    edit_config(path, lambda c: (c if where == "top" else c["text_config"]).update(quantization_config=q))
    with pytest.raises(CheckpointError, match="quantized checkpoint") as e:
        load_target(path)
    msg = str(e.value)
    assert msg.startswith(f"{path / 'config.json'}: a quantized checkpoint ") and "quant_method 'awq'" in msg, msg


def test_a_converted_dir_as_input_says_it_is_converted(ckpts, tmp_path, capsys):
    """A dir written by convert (it has jaxspec.json) given as HF_DIR: not `missing 56 tensors`, but that it is
    converted already and how to load it."""
    path = ckpts["cond"][0]
    out = save_converted(load_target(path, dtype="float32"), tmp_path / "out", path)
    for load in (load_target, hf.scan):
        with pytest.raises(CheckpointError, match="already converted") as e:
            load(out)
        msg = str(e.value)
        assert msg.startswith(f"{out}: ") and "jaxspec.json" in msg and "convert.load_model(" in msg, msg
        assert "--model" in msg and "missing" not in msg, msg
    capsys.readouterr()
    assert cli_main(["target", str(out), str(tmp_path / "again")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {out}: already converted") and "Traceback" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_converted_dir_without_its_params_says_it_is_incomplete(ckpts, tmp_path, capsys):
    """A converted dir whose params/ did not arrive (jaxspec.json sorts before it in a copy): load_model and the CLI
    say it is incomplete, not that it is converted already (the advice to load it would fail the same way)."""
    from convert.store import load_model
    path = ckpts["cond"][0]
    out = save_converted(load_target(path, dtype="float32"), tmp_path / "out", path)
    shutil.rmtree(out / "params")
    for load in (load_model, load_target):
        with pytest.raises(CheckpointError, match="incomplete converted checkpoint") as e:
            load(out)
        assert str(e.value).startswith(f"{out}: ") and "no params/" in str(e.value), e.value
    capsys.readouterr()
    assert cli_main(["target", str(out), str(tmp_path / "again")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {out}: an incomplete converted checkpoint") and "Traceback" not in err, err


def _unwritable(tmp_path) -> Path:
    """An OUT_DIR that no one can create, root included: /proc takes no new entries."""
    if not Path("/proc/self").is_dir():
        pytest.skip("needs /proc, where no directory can be made, even by root")
    return Path(f"/proc/jaxspec-test-{os.getpid()}/out")


def test_cli_refuses_an_unwritable_out_dir_before_loading(bad, tmp_path, capsys, monkeypatch):
    src = bad()
    out = _unwritable(tmp_path)
    capsys.readouterr()  # what writing the fixture printed
    monkeypatch.setattr(hf, "load_target", lambda *a, **kw: pytest.fail("loaded the model before checking OUT_DIR"))
    assert cli_main(["target", str(src), str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {out}: cannot be written: no dir can be made in /proc (") and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad_causal"]


def test_cli_reports_a_full_disk_and_leaves_nothing_behind(ckpts, tmp_path, capsys, monkeypatch):
    import errno

    def full(self, directory, *a, **kw):
        raise OSError(errno.ENOSPC, "No space left on device", str(directory))

    monkeypatch.setattr(ocp.Checkpointer, "save", full)
    src = ckpts["causal"][0]
    capsys.readouterr()  # what writing the fixture printed
    out = tmp_path / "out"
    assert cli_main(["target", str(src), str(out), "--dtype", "float32"]) == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]  # after the progress lines
    assert last.startswith(f"error: {out}: cannot be written: No space left on device: ") and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def unreadable_config(src):
    """shutil.copyfile, except that copying `src`'s config.json fails as a file we may not read would."""
    import errno
    copy = shutil.copyfile

    def copyfile(a, b, *rest, **kw):
        if Path(a).name == "config.json" and Path(a).parent == src:
            raise PermissionError(errno.EACCES, "Permission denied", str(a))
        return copy(a, b, *rest, **kw)
    return copyfile


def test_a_source_file_that_cannot_be_read_is_not_blamed_on_out_dir(ckpts, tmp_path, monkeypatch):
    """The save also copies files from the source (config, tokenizer): an error reading one names that file and is
    not reported as OUT_DIR being unwritable; nothing is left behind."""
    from convert import store
    src = ckpts["causal"][0]
    model = load_target(src, dtype="float32")
    monkeypatch.setattr(shutil, "copyfile", unreadable_config(src))
    with pytest.raises(PermissionError) as e:
        save_converted(model, tmp_path / "out", src)
    assert not isinstance(e.value, store.OutDirError) and e.value.filename == str(src / "config.json")
    assert list(tmp_path.iterdir()) == []


def test_cli_names_a_source_file_that_cannot_be_read(ckpts, tmp_path, monkeypatch, capsys):
    src = ckpts["causal"][0]
    monkeypatch.setattr(shutil, "copyfile", unreadable_config(src))
    capsys.readouterr()  # what writing the fixture printed
    assert cli_main(["target", str(src), str(tmp_path / "out"), "--dtype", "float32"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == f"error: {src / 'config.json'}: Permission denied" and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_too_little_free_space_is_refused_before_writing(ckpts, tmp_path, monkeypatch):
    """The params' bytes against the free space beside OUT_DIR, checked before the params' write starts: an
    OutDirError naming OUT_DIR and both sizes, nothing left behind."""
    from convert import store
    src = ckpts["causal"][0]
    model = load_target(src, dtype="float32")
    need = sum(x.nbytes for x in jax.tree.leaves(nnx.state(model)))
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=need - 1))
    monkeypatch.setattr(ocp.Checkpointer, "save", lambda *a, **kw: pytest.fail("started writing"))
    out = tmp_path / "out"
    with pytest.raises(store.OutDirError) as e:
        save_converted(model, out, src)
    msg = str(e.value)
    assert msg.startswith(f"{out}: cannot be written: no space left: the params take ") and str(tmp_path) in msg, msg
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=need))
    assert save_converted(model, out, src) == out        # exactly enough is not refused
