"""jaxspec/export.py (and jaxspec/files.py as the export uses it) beyond the round trips of tests/test_train.py
(jaxspec writing, jaxspec reading back): what those cannot see, found by a mutation review, and the export dir's
life on disk. Where it can, the oracle is
transformers itself: what it reads from an exported dir, and what its own save_pretrained writes for that model."""

from __future__ import annotations

import json
import os
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors import safe_open

from jaxspec import export, files
from jaxspec.config import FULL, LINEAR, load_target_config
from jaxspec.drafter import Drafter
from jaxspec.model import Qwen35
from jaxspec.tree import chain
from test_train import assert_same_bits, tiny_drafter, tiny_target


def _safetensors(d: Path) -> dict[str, tuple[str, tuple, dict]]:
    """key -> (stored dtype, shape, file metadata) over every *.safetensors file of `d`."""
    out = {}
    for f in sorted(d.glob("*.safetensors")):
        with safe_open(str(f), framework="numpy") as h:
            for k in h.keys():
                sl = h.get_slice(k)
                out[k] = (str(sl.get_dtype()), tuple(sl.get_shape()), h.metadata())
    return out


@pytest.mark.parametrize("tie", [True, False])
def test_transformers_runs_an_exported_target_as_jaxspec_does_and_saves_the_same_keys(tmp_path, tie):
    """Tied embeddings (no lm_head.weight; config says so) and a rotary dim other than head_dim / 4: transformers
    computes jaxspec's logits, and its own save_pretrained of what it loaded writes the keys (lm_head.weight at the
    top level, not under model.), dtypes and {"format": "pt"} metadata that the export wrote."""
    import torch
    from transformers import AutoModelForCausalLM
    cfg = tiny_target().cfg.replace(tie_word_embeddings=tie, rotary_dim=8)
    model = Qwen35(cfg, rngs=nnx.Rngs(3))
    export.export_target(model, tmp_path / "x")
    assert json.loads((tmp_path / "x" / "config.json").read_text())["tie_word_embeddings"] is tie
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "x", dtype=torch.float32).eval()
    tokens = np.random.default_rng(3).integers(0, cfg.vocab_size, (2, 9))
    with torch.no_grad():
        want = hf(torch.tensor(tokens)).logits.numpy()
    got = np.asarray(model(jnp.asarray(tokens, jnp.int32), model.init_state(2, 16), chain(2, 9))[0])
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    hf.save_pretrained(tmp_path / "ref")
    ours, ref = _safetensors(tmp_path / "x"), _safetensors(tmp_path / "ref")
    assert ours.keys() == ref.keys()
    assert ("lm_head.weight" in ours) is not tie
    assert ours == ref


def test_export_stores_the_models_dtype(tmp_path):
    """A bfloat16 target and drafter are stored as BF16, not widened (the round trips cast back to the config's
    dtype, so they cannot tell; the files would be twice the size)."""
    export.export_target(tiny_target(dtype="bfloat16"), tmp_path / "t")
    export.export_drafter(tiny_drafter(dtype="bfloat16"), tmp_path / "d", num_target_layers=4)
    for d in ("t", "d"):
        dtypes = {dt for dt, _, _ in _safetensors(tmp_path / d).values()}
        assert dtypes == {"BF16"}, (d, dtypes)


def test_every_stop_token_reaches_generation_config(tmp_path):
    """config.json holds one eos_token_id; generation_config.json must hold them all, for transformers' generate
    and for jaxspec's reader alike."""
    from transformers import GenerationConfig
    cfg = tiny_target().cfg.replace(eos_token_ids=(0, 7, 3))
    export.export_target(Qwen35(cfg, rngs=nnx.Rngs(0)), tmp_path)
    assert GenerationConfig.from_pretrained(tmp_path).eos_token_id == [0, 7, 3]
    assert load_target_config(tmp_path).eos_token_ids == (0, 7, 3)


def test_save_shards_fills_each_shard_up_to_the_limit_and_names_and_indexes_them_as_hf(tmp_path):
    """A tensor over the limit gets a shard alone (no empty shard before it), a shard takes tensors while their
    bytes stay <= the limit (equal included), names count from 1 as HF's model-00001-of-0000n, and total_size is
    in bytes."""
    a = np.arange(75, dtype=np.float32)                       # 300 bytes: over the limit
    b, c, d = (np.full(25, i, np.float32) for i in range(3))   # 100 bytes each
    export.save_shards({"d": d, "c": c, "b": b, "a": a}, tmp_path, 200)
    names = [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names + [export.INDEX_NAME])
    index = json.loads((tmp_path / export.INDEX_NAME).read_text())
    assert index["weight_map"] == {"a": names[0], "b": names[1], "c": names[1], "d": names[2]}
    assert index["metadata"]["total_size"] == 600
    for name in names:
        with safe_open(str(tmp_path / name), framework="numpy") as h:
            assert h.metadata() == {"format": "pt"}
            for k in h.keys():
                np.testing.assert_array_equal(h.get_tensor(k), {"a": a, "b": b, "c": c, "d": d}[k])


def test_a_small_target_is_one_shard_by_default(tmp_path):
    """The default limit is 10 MiB: the tiny target (~100 KB) is written as a single shard."""
    export.export_target(tiny_target(), tmp_path)
    assert sorted(p.name for p in tmp_path.glob("*.safetensors")) == ["model-00001-of-00001.safetensors"]


def test_a_drafter_of_exactly_max_shard_bytes_stays_one_file(tmp_path):
    """Only a drafter larger than max_shard_bytes is sharded: one of exactly that size is one model.safetensors."""
    from convert.drafter import WEIGHTS, load_drafter
    model = tiny_drafter()
    total = sum(int(np.asarray(v.get_value()).nbytes) for _, v in nnx.to_flat_state(nnx.state(model)))
    export.export_drafter(model, tmp_path / "eq", num_target_layers=4, max_shard_bytes=total)
    assert sorted(p.name for p in (tmp_path / "eq").iterdir()) == ["config.json", WEIGHTS]
    export.export_drafter(model, tmp_path / "less", num_target_layers=4, max_shard_bytes=total - 1)
    assert (tmp_path / "less" / export.INDEX_NAME).is_file() and not (tmp_path / "less" / WEIGHTS).exists()
    assert_same_bits(model, load_drafter(tmp_path / "eq"))


@pytest.mark.parametrize("causal", [True, False])
def test_a_drafters_is_causal_override_is_exported(tmp_path, causal):
    """is_causal overrides every layer's own masking (full layers bidirectional, sliding causal): dropped from
    config.json, the drafter read back would mask otherwise."""
    from convert.drafter import load_drafter
    model = Drafter(tiny_drafter().cfg.replace(is_causal=causal), rngs=nnx.Rngs(1))
    export.export_drafter(model, tmp_path, num_target_layers=4)
    assert json.loads((tmp_path / "config.json").read_text())["is_causal"] is causal
    back = load_drafter(tmp_path)
    assert back.cfg == model.cfg and back.cfg.is_causal is causal


def test_staged_dir_keeps_old_files_and_dirs_but_not_over_new_ones(tmp_path):
    """Entries the keep predicate accepts are carried over (folders too), unless written anew: the new one wins."""
    out = tmp_path / "out"
    (out / "original").mkdir(parents=True)
    (out / "original" / "params.json").write_text("{}")
    (out / "tokenizer.json").write_text("old")
    (out / "README.md").write_text("notes")
    with export.staged_dir(out, keep=lambda p: True) as tmp:
        (tmp / "tokenizer.json").write_text("new")
    assert (out / "tokenizer.json").read_text() == "new"
    assert (out / "README.md").read_text() == "notes" and (out / "original" / "params.json").read_text() == "{}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_failed_rename_into_place_puts_the_previous_export_back(tmp_path, monkeypatch):
    """replace_dir moves the old export aside before renaming the new one in: if that rename fails, the old one is
    put back under its name (not left hidden as .d.old-*), and nothing else is left behind."""
    from convert.drafter import load_drafter
    old, new = tiny_drafter((FULL,), block=4), tiny_drafter((FULL,), block=4, seed=2)
    export.export_drafter(old, tmp_path / "d", num_target_layers=4)
    rename = os.rename

    def fails_into_place(src, dst):
        if Path(src).name.startswith(".d.tmp-"):
            raise OSError(28, "No space left on device")
        return rename(src, dst)
    with monkeypatch.context() as m:
        m.setattr(files.os, "rename", fails_into_place)
        with pytest.raises(OSError, match="No space"):
            export.export_drafter(new, tmp_path / "d", num_target_layers=4)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]
    assert_same_bits(old, load_drafter(tmp_path / "d"))


def test_a_dangling_params_link_is_refused_as_a_converted_dir(tmp_path):
    """A converted dir whose params/ is a link to storage that is gone still holds a converted checkpoint: refused,
    naming the dir and params, rather than written over."""
    out = tmp_path / "conv"
    out.mkdir()
    (out / "params").symlink_to(tmp_path / "unmounted" / "params")
    with pytest.raises(FileExistsError, match=r"holds a converted checkpoint \(params\)") as e:
        export.check_export_dir(out)
    assert str(out) in str(e.value)


@pytest.mark.parametrize("tp", [4, 2])
def test_unsharded_gives_back_the_models_own_config_and_arrays(tp):
    """`unsharded` (public) of a tensor-parallel target: the config and arrays of the model it was sharded from,
    vocabulary pad dropped from both (not only from the files export_target writes)."""
    from jaxspec import sharding as S
    from test_train import _bits, _tp_shape
    model = _tp_shape()
    cfg, flat = export.unsharded(S.shard_target(model, S.make_mesh(tp, 1)))
    assert cfg == model.cfg and cfg.padded_vocab == 0
    want = _bits(model)
    assert flat.keys() == want.keys()
    for k in want:
        assert flat[k].shape == want[k].shape and np.array_equal(flat[k], want[k]), k


@pytest.mark.parametrize("layer_types, interval", [
    ((LINEAR, FULL, LINEAR, FULL), 2), ((LINEAR, LINEAR, LINEAR, FULL), 4), ((FULL,) * 4, 1),
    ((FULL, LINEAR, LINEAR, LINEAR), None), ((LINEAR, FULL, FULL, LINEAR), None), ((LINEAR,) * 4, None)])
def test_full_attention_interval_is_written_only_where_the_layer_types_have_that_period(tmp_path, layer_types,
                                                                                        interval):
    """config.json's full_attention_interval must not contradict its layer_types (a reader that takes only the
    interval would build another model): written where every k-th layer and only those is full attention, as
    transformers lays them out from it; left out otherwise. Both transformers and jaxspec read the types back."""
    from transformers import AutoConfig
    cfg = tiny_target().cfg.replace(layer_types=layer_types)
    hf = export.target_hf_config(cfg)
    assert hf.get("full_attention_interval") == interval and hf["layer_types"] == list(layer_types)
    (tmp_path / "config.json").write_text(json.dumps(hf))
    assert tuple(AutoConfig.from_pretrained(tmp_path).layer_types) == layer_types
    assert load_target_config(tmp_path).layer_types == layer_types
    if interval is not None:       # the interval alone gives the same types
        del hf["layer_types"]
        (tmp_path / "config.json").write_text(json.dumps(hf))
        assert tuple(AutoConfig.from_pretrained(tmp_path).layer_types) == layer_types


def test_an_export_dir_that_links_to_a_dir_writes_that_dir(tmp_path):
    """out a link to a dir (on another disk, say): the export replaces the linked dir and the link stays, reading
    the new weights; not a new dir in the link's place with the linked one left as it was."""
    from convert.drafter import load_drafter
    old, new = tiny_drafter((FULL,), block=4), tiny_drafter((FULL,), block=4, seed=2)
    (tmp_path / "disk").mkdir()
    export.export_drafter(old, tmp_path / "disk" / "d", num_target_layers=4)
    (tmp_path / "d").symlink_to(tmp_path / "disk" / "d")
    export.export_drafter(new, tmp_path / "d", num_target_layers=4)
    assert (tmp_path / "d").is_symlink() and sorted(p.name for p in (tmp_path / "disk").iterdir()) == ["d"]
    assert_same_bits(new, load_drafter(tmp_path / "disk" / "d"))


def _dead_pid() -> int:
    import subprocess
    import sys
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True).stdout)


def test_what_a_killed_export_left_is_cleared_by_the_next(tmp_path, capsys, monkeypatch):
    """An export killed outright (SIGKILL, a power cut) leaves its temp dir .d.tmp-PID-XXXX; killed between
    replace_dir's two renames it also leaves no d, the previous export hidden as .d.old-PID-XXXX. The next export
    removes a dead process's temp dir, puts the previous export back under its name before writing (so a failing
    export leaves it there), and leaves a running process's dirs alone."""
    from convert.drafter import load_drafter
    old, new = tiny_drafter((FULL,), block=4), tiny_drafter((FULL,), block=4, seed=2)
    dead = _dead_pid()
    aside = export.export_drafter(old, tmp_path / f".d.old-{dead}-0123456789ab", num_target_layers=4)
    temp = tmp_path / f".d.tmp-{dead}-0123456789ab"
    live = tmp_path / f".d.tmp-{os.getpid()}-0123456789ab"
    for t in (temp, live):
        t.mkdir()
        (t / "model.safetensors").write_bytes(b"partial")
    def full_disk(*a, **kw):
        raise OSError(28, "No space left on device")
    with monkeypatch.context() as m, pytest.raises(OSError, match="No space"):   # a failing export: the
        m.setattr(export, "save_file", full_disk)                                # previous one is back, whole
        export.export_drafter(new, tmp_path / "d", num_target_layers=4)
    err = capsys.readouterr().err
    assert f"export: put {aside} back as {tmp_path / 'd'}" in err
    assert f"export: removed {temp}, left behind by an interrupted write of {tmp_path / 'd'}" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["d", live.name])
    assert_same_bits(old, load_drafter(tmp_path / "d"))
    export.export_drafter(new, tmp_path / "d", num_target_layers=4)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["d", live.name])
    assert_same_bits(new, load_drafter(tmp_path / "d"))


def test_leftovers_of_nested_and_older_writes_belong_to_their_dir(tmp_path):
    """jaxspec.train exports into its own staged dir, so a kill there leaves `..NAME.tmp-A-X.tmp-B-Y` (and `.old-`
    beside it): the next write of NAME removes those, as it does exports' names before session 70
    (`.NAME.new-XXXXXXXX`); a running process's nested dir, another dir's and a live moved-aside NAME (OUT missing
    while its writer runs) are left alone, and pack never ships any of them."""
    from jaxspec import train
    dead, live = _dead_pid(), os.getpid()
    out = tmp_path / "target"
    gone = [f"..target.tmp-{dead}-0123456789ab.tmp-{dead}-0123456789ab",
            f"..target.tmp-{dead}-0123456789ab.old-{dead}-0123456789ab", ".target.new-0123abcd"]
    kept = [f"..target.tmp-{live}-0123456789ab.tmp-{dead}-0123456789ab", f".target.old-{live}-0123456789ab",
            f"..other.tmp-{dead}-0123456789ab.tmp-{dead}-0123456789ab"]
    for name in gone + kept:
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_bytes(b"weights")
    assert all(files.is_leftover(n) for n in gone + kept)
    files.clear_leftovers(out, "export")
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == sorted(kept)
    pair = tmp_path / "pair"
    (pair / "target").mkdir(parents=True)
    (pair / "target" / "config.json").write_text("{}")
    for name in gone:
        (pair / name).mkdir()
    (tmp_path / "parts").mkdir()
    parts = train.pack(pair, tmp_path / "parts", 1 << 20)
    import io
    import tarfile
    with tarfile.open(fileobj=io.BytesIO(b"".join(p.read_bytes() for p in parts))) as tf:
        assert tf.getnames() == ["demo", "demo/target", "demo/target/config.json"]
