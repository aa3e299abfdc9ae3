"""The DFlash drafter's Orbax path: HF -> Flax -> Orbax -> Flax, `load_draft`, `python -m convert drafter`.

The tiny drafter checkpoints are z-lab's reference model with random weights (test_drafter.make_reference),
written in the real single-file flat-key layout.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import nnx

from conftest import make_causal_lm, text_config
from convert.__main__ import main as cli_main
from convert.drafter import load_draft, load_drafter, restore_drafter, save_drafter
from convert.hf import CheckpointError, load_target
from convert.store import load_model, restore_converted, save_converted
from jaxspec.config import ConfigError
from jaxspec.drafter_config import drafter_config_from_hf
from test_drafter import D, N_TAPS, V, make_reference, tiny_hf

REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------------
# Fixtures and helpers


class _Drafters(dict):
    """layout name (test_drafter.LAYOUTS) -> HF drafter dir, each written on first use."""

    def __init__(self, factory):
        super().__init__()
        self.factory = factory

    def __missing__(self, layout):
        path = self.factory.mktemp(f"hf_drafter_{layout}")
        make_reference(path, tiny_hf(layout))
        self[layout] = path
        return path


@pytest.fixture(scope="module")
def drafters(tmp_path_factory):
    return _Drafters(tmp_path_factory)


@pytest.fixture
def hf_copy(drafters, tmp_path):
    """A private copy of the qwen36-layout drafter, to break or delete."""
    dst = tmp_path / "hf"
    shutil.copytree(drafters["qwen36"], dst)
    return dst


def flat_params(model):
    return {p: v.get_value() for p, v in nnx.to_flat_state(nnx.state(model))}


def assert_bit_identical(a, b):
    assert a.cfg == b.cfg
    fa, fb = flat_params(a), flat_params(b)
    assert fa.keys() == fb.keys()
    for k in fa:
        x, y = np.asarray(fa[k]), np.asarray(fb[k])
        assert x.dtype == y.dtype and x.shape == y.shape, k
        # The bits, not the values: -0.0 vs 0.0 or a changed NaN payload is a difference too.
        assert np.array_equal(x.view(f"u{x.itemsize}"), y.view(f"u{y.itemsize}")), k


@nnx.jit
def _context_then_draft(drafter, taps, n_new, anchor, embed, lm):
    cache = drafter.add_context(drafter.init_cache(taps.shape[0], 32), taps, n_new)
    return drafter.draft(cache, anchor, embed, lm)[0]


def draft_logits(drafter) -> np.ndarray:
    """Draft logits [2, block_size - 1, V] for a fixed context of unequal lengths and fixed target weights."""
    rng = np.random.default_rng(7)
    taps = rng.standard_normal((2, 12, N_TAPS * D)).astype(np.float32)
    embed = rng.standard_normal((V, D)).astype(np.float32)
    lm = (rng.standard_normal((D, V)) / D ** 0.5).astype(np.float32)
    dt = drafter.cfg.jnp_dtype
    out = _context_then_draft(drafter, jnp.asarray(taps, dt), jnp.array([12, 7]), jnp.array([5, 77]),
                              jnp.asarray(embed, dt), jnp.asarray(lm, dt))
    return np.asarray(out)


def listing(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir())


# ------------------------------------------------------------------------------------------------
# Round trips


@pytest.mark.parametrize("layout", ["qwen36", "causal"])
def test_round_trip_is_bit_exact(drafters, tmp_path, layout):
    src = tmp_path / "hf"
    shutil.copytree(drafters[layout], src)
    direct = load_drafter(src)
    assert direct.cfg.dtype == "float32"  # the tiny checkpoints are fp32: nothing is rounded on the way
    want = draft_logits(direct)

    out = save_drafter(direct, tmp_path / "out", src)
    assert out == tmp_path / "out"
    assert listing(out) == ["config.json", "jaxspec.json", "params"]
    assert (out / "config.json").read_bytes() == (src / "config.json").read_bytes()
    meta = json.loads((out / "jaxspec.json").read_text())
    assert meta["format"] == "jaxspec-drafter" and meta["dtype"] == "float32" and meta["source"] == str(src)
    assert listing(tmp_path) == ["hf", "out"]  # no temp dir left next to it

    # The converted dir stands alone: the source is gone before it is read.
    shutil.rmtree(src)
    for restored in (restore_drafter(out), load_draft(out)):
        assert_bit_identical(restored, direct)
        np.testing.assert_array_equal(draft_logits(restored), want)


def test_load_draft_takes_the_hf_dir_too(drafters):
    path = drafters["qwen36"]
    assert_bit_identical(load_draft(path), load_drafter(path))
    assert_bit_identical(load_draft(path, dtype="bfloat16"), load_drafter(path, dtype="bfloat16"))


def test_bfloat16_restore_equals_direct_bfloat16_load(drafters, tmp_path, monkeypatch):
    path = drafters["qwen36"]
    out = save_drafter(load_drafter(path), tmp_path / "out", path)  # saved in fp32

    # Orbax must be asked for bf16 arrays, not for fp32 ones cast afterwards (twice the memory).
    asked = []
    real_restore = ocp.StandardCheckpointer.restore

    def spy(self, directory, target=None, *a, **kw):
        asked.extend(x.dtype for x in jax.tree.leaves(target))
        return real_restore(self, directory, target, *a, **kw)

    monkeypatch.setattr(ocp.StandardCheckpointer, "restore", spy)
    restored = load_draft(out, dtype="bfloat16")
    assert asked and set(asked) == {jnp.dtype(jnp.bfloat16)}
    assert restored.cfg.dtype == "bfloat16"
    assert all(v.dtype == jnp.bfloat16 for v in flat_params(restored).values())

    direct = load_drafter(path, dtype="bfloat16")
    assert_bit_identical(restored, direct)
    np.testing.assert_array_equal(draft_logits(restored), draft_logits(direct))


def test_default_dtype_is_the_saved_one(drafters, tmp_path):
    path = drafters["qwen36"]
    b16 = load_drafter(path, dtype="bfloat16")
    out = save_drafter(b16, tmp_path / "out", path)
    assert json.loads((out / "jaxspec.json").read_text())["dtype"] == "bfloat16"
    assert_bit_identical(load_draft(out), b16)
    # Widening is exact: fp32 from the bf16 save holds the bf16 values.
    f32 = load_draft(out, dtype="float32")
    assert f32.cfg.dtype == "float32"
    for k, v in flat_params(f32).items():
        assert v.dtype == jnp.float32, k
        np.testing.assert_array_equal(np.asarray(v), np.asarray(flat_params(b16)[k], np.float32), err_msg=str(k))


# ------------------------------------------------------------------------------------------------
# Refusals: the wrong kind of dir, a config that does not fit, a damaged dir


@pytest.fixture(scope="module")
def converted_target(tmp_path_factory):
    src = tmp_path_factory.mktemp("hf_target")
    make_causal_lm(src, vocab_size=256)
    out = tmp_path_factory.mktemp("conv") / "target"
    return save_converted(load_target(src, dtype="float32"), out, src)


def test_a_converted_target_is_not_a_drafter_and_vice_versa(converted_target, drafters, tmp_path):
    with pytest.raises(CheckpointError, match=r"'jaxspec-target'.*expected 'jaxspec-drafter'") as e:
        load_draft(converted_target)
    assert str(converted_target / "jaxspec.json") in str(e.value) and "not a converted drafter" in str(e.value)

    path = drafters["qwen36"]
    out = save_drafter(load_drafter(path), tmp_path / "out", path)
    with pytest.raises(CheckpointError, match=r"'jaxspec-drafter'.*expected 'jaxspec-target'") as e:
        load_model(out)
    assert "not a converted target" in str(e.value)


def test_save_refuses_a_drafter_the_config_does_not_describe(drafters, tmp_path):
    other = tmp_path / "other"
    make_reference(other, {**tiny_hf("qwen36"), "intermediate_size": 80})
    with pytest.raises(CheckpointError, match="does not describe this model") as e:
        save_drafter(load_drafter(other), tmp_path / "out", drafters["qwen36"])
    assert str(drafters["qwen36"] / "config.json") in str(e.value)
    assert listing(tmp_path) == ["other"]


def test_save_refuses_to_replace_its_source(hf_copy):
    before = listing(hf_copy)
    with pytest.raises(CheckpointError, match="source checkpoint dir itself"):
        save_drafter(load_drafter(hf_copy), hf_copy, hf_copy, overwrite=True)
    assert listing(hf_copy) == before


def test_restore_checks_the_config_against_the_params(drafters, tmp_path):
    path = drafters["qwen36"]
    out = save_drafter(load_drafter(path), tmp_path / "out", path)
    cfg = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**cfg, "intermediate_size": 80}))
    with pytest.raises(CheckpointError, match=r"'layers.0.mlp.down_proj.kernel' has shape \[96, 64\].*\[80, 64\]") \
            as e:
        load_draft(out)
    assert str(out / "params") in str(e.value)
    (out / "config.json").write_text(json.dumps(cfg))
    (out / "jaxspec.json").unlink()
    with pytest.raises(CheckpointError, match=r"jaxspec\.json: missing.*save_drafter") as e:
        load_draft(out)
    assert str(out) in str(e.value)


def test_restore_names_a_bad_dtype_in_jaxspec_json(drafters, tmp_path):
    path = drafters["qwen36"]
    out = save_drafter(load_drafter(path), tmp_path / "out", path)
    meta = json.loads((out / "jaxspec.json").read_text())
    (out / "jaxspec.json").write_text(json.dumps({**meta, "dtype": "int4"}))
    with pytest.raises(CheckpointError, match="dtype 'int4' is not one of float32, bfloat16, float16") as e:
        load_draft(out)
    assert str(e.value).startswith(f"{out / 'jaxspec.json'}: ")


def test_a_target_checkpoint_is_not_a_drafter(tmp_path, capsys):
    target = target_dir(tmp_path / "target")
    assert cli_main(["drafter", str(target), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {target / 'config.json'}: describes a target checkpoint (model_type "
                          "'qwen3_5_text'), not a DFlash drafter"), err
    nested = {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5", "text_config": {}}
    with pytest.raises(ConfigError, match=r"target checkpoint \(model_type 'qwen3_5'\)"):
        drafter_config_from_hf(nested)
    with pytest.raises(ConfigError, match=r"target checkpoint \(architectures \['LlamaForCausalLM'\]\)"):
        drafter_config_from_hf({"architectures": ["LlamaForCausalLM"], "model_type": "llama"})
    # A drafter is one whatever its architectures say, as long as it has its DFlash keys.
    hf = tiny_hf("qwen36")
    assert drafter_config_from_hf({**hf, "architectures": ["Qwen3ForCausalLM"]}) == drafter_config_from_hf(hf)
    top = {k: v for k, v in hf.items() if k != "dflash_config"}
    top.update(hf["dflash_config"], architectures=["Qwen3ForCausalLM"])
    assert drafter_config_from_hf(top) == drafter_config_from_hf(hf)


# ------------------------------------------------------------------------------------------------
# Atomic saves


def test_save_refuses_to_overwrite(drafters, tmp_path):
    path = drafters["qwen36"]
    drafter = load_drafter(path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="overwrite") as e:
        save_drafter(drafter, out, path)
    assert str(out) in str(e.value)
    assert listing(out) == ["keep.txt"] and listing(tmp_path) == ["out"]

    with pytest.raises(FileExistsError, match=r"not replaced: it holds files \(keep.txt\) but no jaxspec.json") as e:
        save_drafter(drafter, out, path, overwrite=True)  # --overwrite never wipes a dir of other files
    assert str(out) in str(e.value) and listing(out) == ["keep.txt"]
    (out / "keep.txt").unlink()
    save_drafter(drafter, out, path, overwrite=True)      # an empty dir is replaced
    save_drafter(drafter, out, path, overwrite=True)      # and so is an earlier conversion
    assert listing(out) == ["config.json", "jaxspec.json", "params"]
    assert listing(tmp_path) == ["out"]  # neither the temp dir nor the old one is left
    assert_bit_identical(load_draft(out), drafter)


def test_overwrite_refuses_another_kinds_conversion(converted_target, drafters, tmp_path):
    out = tmp_path / "target"
    shutil.copytree(converted_target, out)
    before = listing(out)
    with pytest.raises(FileExistsError, match=r"not replaced: it holds format 'jaxspec-target'.*not a converted "
                                              r"drafter") as e:
        save_drafter(load_drafter(drafters["qwen36"]), out, drafters["qwen36"], overwrite=True)
    assert str(out) in str(e.value)
    assert listing(out) == before and listing(tmp_path) == ["target"]


@pytest.mark.parametrize("existing,exc", [(False, OSError("No space left on device")),
                                          (True, OSError("No space left on device")),
                                          (True, KeyboardInterrupt())])
def test_failed_save_leaves_nothing_behind(drafters, tmp_path, monkeypatch, existing, exc):
    path = drafters["qwen36"]
    drafter = load_drafter(path)
    work = tmp_path / "work"
    work.mkdir()
    out = work / "out"
    if existing:  # an earlier conversion, which overwrite=True may replace
        out.mkdir()
        (out / "keep.txt").write_text("mine")
        (out / "jaxspec.json").write_text('{"format": "jaxspec-drafter"}')
    real_save = ocp.Checkpointer.save
    saved = []

    def save_then_fail(self, directory, *a, **kw):  # the failure hits after the params are on disk
        real_save(self, directory, *a, **kw)
        saved.append(any(Path(directory).iterdir()))
        raise exc

    monkeypatch.setattr(ocp.Checkpointer, "save", save_then_fail)
    with pytest.raises(type(exc)):
        save_drafter(drafter, out, path, overwrite=existing)
    assert saved == [True]
    assert listing(work) == (["out"] if existing else [])
    if existing:
        assert listing(out) == ["jaxspec.json", "keep.txt"] and (out / "keep.txt").read_text() == "mine"


def test_failed_final_rename_keeps_the_old_dir(drafters, tmp_path, monkeypatch):
    """The last step, moving the finished temp dir into place, fails after the old dir was moved aside:
    the old dir must come back, not be lost."""
    path = drafters["qwen36"]
    drafter = load_drafter(path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    (out / "jaxspec.json").write_text('{"format": "jaxspec-drafter"}')
    real_rename = os.rename
    calls = []

    def rename(src, dst, *a, **kw):
        calls.append(Path(src).name)
        if Path(src).name.startswith(".out.tmp-"):  # only our final move, not Orbax's own renames
            raise OSError("Input/output error")
        return real_rename(src, dst, *a, **kw)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(OSError, match="Input/output"):
        save_drafter(drafter, out, path, overwrite=True)
    assert any(c == "out" for c in calls)  # the old dir had been moved aside when the failure hit
    assert listing(tmp_path) == ["out"] and listing(out) == ["jaxspec.json", "keep.txt"]


# ------------------------------------------------------------------------------------------------
# The command line


def target_dir(path: Path, **overrides) -> Path:
    """A target dir with only a config.json (all that --target reads): by default one the tiny qwen36
    drafter fits (hidden 64, vocab 256, 6 layers for target_layer_ids [1, 3, 4])."""
    path.mkdir()
    kw = {"vocab_size": V, "num_hidden_layers": 6, **overrides}
    (path / "config.json").write_text(json.dumps(text_config(**kw).to_dict()))
    return path


def test_python_m_convert_help():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for args, words in ((["--help"], ["target", "drafter"]),
                        (["drafter", "--help"], ["HF_DRAFT_DIR", "--overwrite", "--target", "--dtype",
                                                 "model.safetensors.index.json",  # sharded drafters load too
                                                 "Without --target no fit check against the target happens"])):
        r = subprocess.run([sys.executable, "-m", "convert", *args], cwd=REPO, env=env, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        text = " ".join(r.stdout.split())  # argparse wraps lines
        for w in words:
            assert w in text, (args, w)
        assert "one model.safetensors" not in text
    # The parser alone, with the drafter subcommand in it, must not pull in jax.
    code = ("import sys; import convert.__main__ as m; m.build_parser(); "
            "print(sorted(k for k in sys.modules if k.split('.')[0] in ('jax', 'flax', 'orbax')))")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "[]", (r.stdout, r.stderr)


def test_cli_converts(drafters, tmp_path, capsys):
    path = drafters["qwen36"]
    out = tmp_path / "out"
    target = target_dir(tmp_path / "target")
    assert cli_main(["drafter", str(path), str(out), "--dtype", "float32", "--target", str(target)]) == 0
    assert "wrote" in capsys.readouterr().err
    assert_bit_identical(load_draft(out), load_drafter(path))

    before = (out / "jaxspec.json").read_bytes()
    assert cli_main(["drafter", str(path), str(out)]) == 2  # exists, no --overwrite
    err = capsys.readouterr().err
    assert err.startswith("error:") and "already exists" in err and "--overwrite" in err
    assert (out / "jaxspec.json").read_bytes() == before

    assert cli_main(["drafter", str(path), str(out), "--overwrite"]) == 0  # without --target: no check
    capsys.readouterr()
    restored = load_draft(out)
    assert restored.cfg.dtype == "bfloat16"  # the default --dtype
    assert_bit_identical(restored, load_drafter(path, dtype="bfloat16"))
    assert listing(tmp_path) == ["out", "target"]


@pytest.mark.parametrize("overrides,words", [
    ({"hidden_size": 96}, ["hidden_size 64 != target hidden_size 96"]),
    ({"vocab_size": 512}, ["vocab_size 256 != target vocab_size 512"]),
    ({"num_hidden_layers": 4}, ["target_layer_ids [1, 3, 4]", "ids [4]", "4-layer target"]),
])
def test_cli_refuses_a_target_that_does_not_fit(drafters, tmp_path, capsys, overrides, words):
    path = drafters["qwen36"]
    target = target_dir(tmp_path / "target", **overrides)
    assert cli_main(["drafter", str(path), str(tmp_path / "out"), "--target", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "Traceback" not in err
    assert str(path) in err and str(target) in err
    for w in words:
        assert w in err, err
    assert listing(tmp_path) == ["target"]


def test_cli_target_without_a_config(drafters, tmp_path, capsys):
    assert cli_main(["drafter", str(drafters["qwen36"]), str(tmp_path / "out"), "--target",
                     str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --target") and f"{tmp_path / 'nowhere'}: no such directory" in err
    (tmp_path / "empty").mkdir()  # a dir, but not a model dir
    assert cli_main(["drafter", str(drafters["qwen36"]), str(tmp_path / "out"), "--target",
                     str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and f"{tmp_path / 'empty' / 'config.json'}: no such file" in err
    assert listing(tmp_path) == ["empty"]


def test_cli_target_with_a_malformed_config(drafters, tmp_path, capsys):
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text("[]")
    path = drafters["qwen36"]
    capsys.readouterr()  # what writing the fixture printed
    assert cli_main(["drafter", str(path), str(tmp_path / "out"), "--target", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {target / 'config.json'}: expected a JSON object, got list"), err
    assert listing(tmp_path) == ["target"]


def test_cli_refuses_to_write_over_the_target_or_a_folder_above_it(drafters, tmp_path, capsys, monkeypatch):
    import convert.drafter
    monkeypatch.setattr(convert.drafter, "load_drafter", lambda *a, **kw: pytest.fail("loaded before the check"))
    anc = tmp_path / "anc"
    anc.mkdir()
    target = target_dir(anc / "target")
    path = drafters["qwen36"]
    capsys.readouterr()  # what writing the fixture printed
    for out in (target, anc, tmp_path):
        args = ["drafter", str(path), str(out), "--target", str(target), "--overwrite"]
        assert cli_main(args) == 2
        err = capsys.readouterr().err
        want = "is the --target dir itself" if out == target else f"is a folder above the --target dir {target}"
        assert err.startswith(f"error: {out}: {want}"), err
    assert listing(target) == ["config.json"]


def test_cli_bad_checkpoint_leaves_nothing_behind(hf_copy, tmp_path, capsys):
    from safetensors.numpy import load_file, save_file
    tensors = load_file(str(hf_copy / "model.safetensors"))
    del tensors["layers.2.mlp.up_proj.weight"]
    save_file(tensors, str(hf_copy / "model.safetensors"))
    assert cli_main(["drafter", str(hf_copy), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "layers.2.mlp.up_proj.weight" in err and "Traceback" not in err
    assert listing(tmp_path) == ["hf"]


# ------------------------------------------------------------------------------------------------
# jaxspec.generate --draft takes the converted dir


def test_generate_with_a_converted_draft(tmp_path, capsys):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from jaxspec.generate import main as generate

    model_dir = tmp_path / "model"
    make_causal_lm(model_dir, vocab_size=256)
    # A byte-level tokenizer small enough for the tiny vocabulary (as in test_generate_cli).
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(["def f(x):\n    return x\n"] * 5, trainers.BpeTrainer(
        vocab_size=256, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<eos>"]))
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>").save_pretrained(model_dir)

    hf = tiny_hf("qwen36")
    hf["dflash_config"]["target_layer_ids"] = [0, 1, 2]  # taps of the 4-layer target
    hf["num_target_layers"] = 4                          # trained for it (check_pair compares the depth)
    make_reference(tmp_path / "draft_hf", hf)
    assert cli_main(["drafter", str(tmp_path / "draft_hf"), str(tmp_path / "draft"), "--dtype", "float32",
                     "--target", str(model_dir)]) == 0
    shutil.rmtree(tmp_path / "draft_hf")  # what generate reads must be the converted dir
    capsys.readouterr()

    args = ["--model", str(model_dir), "--prompt", "def f(x):", "--max-new-tokens", "10", "--ignore-eos"]
    assert generate(args) == 0
    ar = capsys.readouterr()
    assert generate(args + ["--method", "dflash", "--draft", str(tmp_path / "draft"), "--block-size", "4"]) == 0
    dflash = capsys.readouterr()
    assert dflash.out == ar.out  # greedy DFlash is lossless
    assert "acceptance histogram" in dflash.err and "10 tokens" in dflash.err


# ------------------------------------------------------------------------------------------------
# The shared machinery, target side


def test_target_save_keeps_generation_config_stop_tokens(tmp_path):
    """The saved model is checked against the config its loader builds, stop tokens from
    generation_config.json included (Qwen3.6 lists <|im_end|> there only); comparing with config.json
    alone refused every such checkpoint."""
    src = tmp_path / "hf"
    make_causal_lm(src)
    gen = json.loads((src / "generation_config.json").read_text())
    gen["eos_token_id"] = [7, 9]
    (src / "generation_config.json").write_text(json.dumps(gen))
    model = load_target(src, dtype="float32")
    assert {7, 9} <= set(model.cfg.eos_token_ids)
    restored = restore_converted(save_converted(model, tmp_path / "out", src))
    assert restored.cfg == model.cfg


# ------------------------------------------------------------------------------------------------
# Inputs that are ambiguous or already converted, unwritable outputs: as for the target


def test_a_single_file_beside_an_index_that_does_not_list_it_is_refused(hf_copy):
    """The target's loader refuses such a dir (transformers would load model.safetensors, the index names other
    files); the drafter's must agree, not pick model.safetensors on its own."""
    from safetensors.numpy import load_file, save_file
    tensors = load_file(str(hf_copy / "model.safetensors"))
    save_file(tensors, str(hf_copy / "model-00001-of-00001.safetensors"))
    index = {"weight_map": {k: "model-00001-of-00001.safetensors" for k in tensors}}
    (hf_copy / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError) as e:
        load_drafter(hf_copy)
    msg = str(e.value)
    assert msg.startswith(f"{hf_copy}: ") and "model.safetensors and model.safetensors.index.json" in msg, msg
    # An index that lists model.safetensors is no conflict.
    (hf_copy / "model-00001-of-00001.safetensors").unlink()
    index = {"weight_map": {k: "model.safetensors" for k in tensors}}
    (hf_copy / "model.safetensors.index.json").write_text(json.dumps(index))
    load_drafter(hf_copy)


def test_a_converted_dir_as_input_says_it_is_converted(drafters, tmp_path, capsys):
    path = drafters["qwen36"]
    out = save_drafter(load_drafter(path), tmp_path / "out", path)
    with pytest.raises(CheckpointError, match="already converted") as e:
        load_drafter(out)
    msg = str(e.value)
    assert msg.startswith(f"{out}: ") and "'jaxspec-drafter'" in msg and "convert.load_draft(" in msg, msg
    assert "--draft" in msg and "no model.safetensors" not in msg, msg
    capsys.readouterr()
    assert cli_main(["drafter", str(out), str(tmp_path / "again")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {out}: already converted") and "Traceback" not in err, err
    assert listing(tmp_path) == ["out"]


def test_cli_refuses_an_unwritable_out_dir_before_loading(drafters, tmp_path, capsys, monkeypatch):
    import convert.drafter
    if not Path("/proc/self").is_dir():
        pytest.skip("needs /proc, where no directory can be made, even by root")
    out = Path(f"/proc/jaxspec-test-{os.getpid()}/out")  # root cannot make it either
    monkeypatch.setattr(convert.drafter, "load_drafter", lambda *a, **kw: pytest.fail("loaded before the check"))
    path = drafters["qwen36"]
    capsys.readouterr()  # what writing the fixture printed
    assert cli_main(["drafter", str(path), str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {out}: cannot be written: no dir can be made in /proc (") and "Traceback" not in err
