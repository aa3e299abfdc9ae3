"""The library API refuses bad arguments with a clear error at construction or generate() time, instead of
silently producing other output or failing deep in JAX: prompt ids, counts, prefill chunks, stop ids,
speculators built for another target, drafters trained for another target depth, sampling parameters and
integer drafter weights."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import save_file

from convert.drafter import drafter_layout, load_drafter
from convert.hf import CheckpointError, load_target
from jaxspec.config import ConfigError, load_target_config
from jaxspec.dflash import DFlash
from jaxspec.drafter import Drafter
from jaxspec.drafter_config import check_pair, drafter_config_from_hf, load_drafter_config
from jaxspec.engine import AR, Engine, default_max_len
from jaxspec.export import drafter_hf_config
from jaxspec.mtp import MTP, MTPHead
from jaxspec.sampling import Sampling
from test_dflash import drafter_config

DEMO = Path(__file__).resolve().parents[1] / "jaxspec" / "demo"
P = [[1, 2, 3, 4, 5]]


@pytest.fixture(scope="module")
def target(tiny_hf):
    return load_target(tiny_hf[0], dtype="float32")      # vocab 512, 4 layers


def test_prompt_ids_outside_the_vocabulary_are_refused(target):
    """The model clips ids into range: 512 decoded as 511 and -1 as 0, 3.7 as 3, without a word."""
    engine = Engine(target)
    for prompt, words in (([1, 2, 512], "prompt 0, position 2: token id 512 is outside the vocabulary [0, 512)"),
                          ([1, 2, -1], "position 2: token id -1 is outside"),
                          ([1, 2, 10**30], f"token id {10**30} is outside"),
                          ([1, 2, 3.7], "position 2: token id 3.7 is not an integer"),
                          (np.array([1.0, 2.0]), "position 0: token id 1.0 is not an integer")):
        with pytest.raises(ValueError) as e:
            engine.generate([[7, 8], prompt], 5)
        assert "prompt 1," in str(e.value) and words.replace("prompt 0, ", "") in str(e.value), str(e.value)
    with pytest.raises(ValueError, match=r"prompt 0, position 1: token id 512 is outside the vocabulary"):
        engine.prefill([[3, 512]], 64)


def test_prompts_must_be_a_non_empty_list_of_lists(target):
    engine = Engine(target)
    for prompts in ([], [1, 2, 3], "hello", ["hello"], 5):
        with pytest.raises(ValueError, match="prompts: a non-empty list of token-id lists"):
            engine.generate(prompts, 5)
    with pytest.raises(ValueError, match="at least one token; prompt 1 is empty"):
        engine.generate([[1], []], 5)


def test_numpy_integers_are_counts_floats_are_not(target):
    assert default_max_len(np.int64(40)) == default_max_len(40) == 48
    engine = Engine(target)
    assert engine.generate(P, np.int64(4), max_len=np.int32(32), rounds_per_call=np.int64(1 << 30)).tokens == \
        engine.generate(P, 4, max_len=32).tokens
    for kw in ({"max_new_tokens": 2.5}, {"max_new_tokens": 4.0}, {"max_new_tokens": None}, {"max_len": 32.5},
               {"rounds_per_call": 1.5}, {"seed": 1.5}, {"seed": "3"}):
        args = {"max_new_tokens": 4, **kw}
        with pytest.raises(ValueError, match=f"{next(iter(kw))} must be an integer, got"):
            engine.generate(P, args.pop("max_new_tokens"), **args)
    for seed in (2**63, -2**63 - 1, 2**70):     # jax.random.key takes an int64: it raised OverflowError
        with pytest.raises(ValueError, match=f"seed must be a 64-bit integer .*, got {seed}"):
            engine.generate(P, 4, seed=seed)
    assert engine.generate(P, 4, seed=np.int64(2**63 - 1)).tokens == engine.generate(P, 4, seed=2**63 - 1).tokens
    drafter = Drafter(drafter_config(), rngs=nnx.Rngs(3))
    spec = DFlash(drafter, target.cfg, block_size=np.int64(4), budget=np.int64(8))
    assert (spec.block_size, spec.budget, spec.tree_size) == (4, 8, 9) and type(spec.budget) is int
    for kw, name in (({"budget": 2.5}, "--budget"), ({"block_size": 2.5}, "--block-size")):
        with pytest.raises(ValueError, match=f"{name} must be an integer, got 2.5"):
            DFlash(drafter, target.cfg, **kw)
    with pytest.raises(ValueError, match="prefill_chunk must be an integer, got 2.5"):
        Engine(target, prefill_chunk=2.5)
    with pytest.raises(ValueError, match="AR rows must be an integer"):
        AR(2.5)


@pytest.mark.parametrize("chunk", [0, -4])
def test_prefill_chunk_must_be_positive(target, chunk):
    with pytest.raises(ValueError, match=f"prefill_chunk must be >= 1, got {chunk}"):
        Engine(target, prefill_chunk=chunk)


def test_drafter_for_another_target_depth_is_refused(target):
    cfg = drafter_config()                               # taps (0, 2) are layers of the 4-layer tiny target
    assert cfg.num_target_layers is None
    check_pair(cfg, target.cfg)                          # unknown depth: nothing to compare
    check_pair(cfg.replace(num_target_layers=4), target.cfg)
    with pytest.raises(ConfigError, match="drafter was trained for a 6-layer target; this target has 4"):
        check_pair(cfg.replace(num_target_layers=6), target.cfg)
    with pytest.raises(ConfigError, match="6-layer target"):
        DFlash(Drafter(cfg.replace(num_target_layers=6), rngs=nnx.Rngs(3)), target.cfg)
    # Read from config.json; metadata only, so a config built in code still equals the one read back.
    hf = drafter_hf_config(cfg, num_target_layers=6)
    read = drafter_config_from_hf(hf)
    assert read.num_target_layers == 6 and read == cfg
    del hf["num_target_layers"]
    assert drafter_config_from_hf(hf).num_target_layers is None
    with pytest.raises(ConfigError, match="num_target_layers must be positive"):
        drafter_config_from_hf({**hf, "num_target_layers": 0})
    # The shipped demo pair still fits.
    demo = load_drafter_config(DEMO / "drafter")
    check_pair(demo, load_target_config(DEMO / "target"))
    assert demo.num_target_layers == 8


def test_engine_checks_the_speculator_against_its_model(target):
    cfg = target.cfg
    Engine(target, DFlash(Drafter(drafter_config(), rngs=nnx.Rngs(3)), cfg))       # the right target: fine
    other_vocab = cfg.replace(vocab_size=1000)
    spec = DFlash(Drafter(drafter_config(vocab_size=1000), rngs=nnx.Rngs(3)), other_vocab)
    with pytest.raises(ConfigError, match="dflash speculator was built for another target.*vocab_size 1000 vs 512"):
        Engine(target, spec)
    deeper = cfg.replace(layer_types=cfg.layer_types * 2)
    with pytest.raises(ConfigError, match="num_layers 8 vs 4"):
        Engine(target, DFlash(Drafter(drafter_config(), rngs=nnx.Rngs(3)), deeper))
    with pytest.raises(ConfigError, match="mtp speculator was built for another target.*num_layers 8 vs 4"):
        Engine(target, MTP(MTPHead(deeper, rngs=nnx.Rngs(0)), deeper, 2))


def test_sampling_needs_a_finite_temperature_and_an_integer_top_k():
    for kw, words in (({"temperature": float("inf")}, "--temperature must be >= 0 and finite, got inf"),
                      ({"temperature": float("inf"), "top_k": 5}, "--temperature"),
                      ({"temperature": "0.5"}, "--temperature must be a number"),
                      ({"temperature": 1.0, "top_k": 2.5}, "--top-k must be an integer, got 2.5"),
                      ({"temperature": 1.0, "top_k": True}, "--top-k must be an integer"),
                      # logits / 1e-39 overflowed float32: NaN log-probs, and token 0 drawn every time
                      ({"temperature": 1e-39}, r"--temperature must be 0 \(greedy\) or >= 0.0001, got 1e-39"),
                      ({"temperature": 5e-5, "top_p": 0.9}, "--temperature must be 0"),
                      # a string was a bare comparison TypeError, True was taken as 1.0
                      ({"temperature": 1.0, "top_p": "0.9"}, "--top-p must be a number, got '0.9'"),
                      ({"temperature": 1.0, "top_p": True}, "--top-p must be a number, got True")):
        with pytest.raises(ValueError, match=words):
            Sampling(**kw)
    s = Sampling(temperature=np.float32(0.7), top_k=np.int64(5))
    assert type(s.top_k) is int and s.top_k == 5
    assert Sampling(temperature=1e-4).temperature == 1e-4


def test_stop_ids_outside_the_vocabulary_are_refused(target):
    for stop in ([10**6], [3, -1], [512]):
        with pytest.raises(ValueError, match=r"stop_tokens \[-?\d+\] are outside the vocabulary \[0, 512\)"):
            Engine(target, stop_tokens=stop)
    with pytest.raises(ValueError, match="stop_tokens: token id must be an integer, got 3.5"):
        Engine(target, stop_tokens=[3.5])
    assert Engine(target, stop_tokens=np.array([7, 511])).stop.tolist() == [7, 511]
    assert Engine(target, stop_tokens=None).stop.tolist() == [-1]      # the docstring's "None by default"
    for stop in (5, "5"):     # a bare id (a TypeError), or a string of digits (its characters)
        with pytest.raises(ValueError, match=f"stop_tokens must be a collection of token ids, got {stop!r}"):
            Engine(target, stop_tokens=stop)


def test_stop_tokens_default_to_none(target):
    """Documented: the model's EOS ids stop nothing unless passed as stop_tokens (the default is unchanged)."""
    doc = " ".join(Engine.__doc__.split())
    assert "EOS ids" in doc and "are not used unless passed" in doc
    assert Engine(target).stop.tolist() == [-1] and Engine(target, stop_tokens=(5,)).stop.tolist() == [5]


def test_integer_and_fp8_drafter_tensors_are_refused(tmp_path):
    cfg = drafter_config()
    (tmp_path / "config.json").write_text(json.dumps(drafter_hf_config(cfg, num_target_layers=4)))
    rs = np.random.RandomState(0)
    tensors = {k: rs.randn(*shape).astype(np.float32) for k, (_, shape, _) in drafter_layout(cfg).items()}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    assert load_drafter(tmp_path).cfg == cfg
    tensors["norm.weight"] = tensors["norm.weight"].astype(np.int32)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"model\.safetensors: tensor 'norm\.weight' is stored as I32; "
                                              r"only floating-point"):
        load_drafter(tmp_path)
    # A quantized (FP8) drafter: refused from the header, before numpy is asked for a type it does not have.
    import ml_dtypes
    tensors["norm.weight"] = tensors["norm.weight"].astype(ml_dtypes.float8_e4m3fn)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"model\.safetensors: tensor 'norm\.weight' is stored as F8_E4M3; "
                                              r"only floating-point .* must be dequantized first"):
        load_drafter(tmp_path)


def test_requests_beyond_max_position_embeddings_are_refused(target, tiny_hf, tmp_path):
    """config.json's max_position_embeddings bounds prompt + new tokens (positions past it were never trained);
    the cache's extra slots for the tree may lie past it."""
    import shutil
    model_dir = tmp_path / "m"
    shutil.copytree(tiny_hf[0], model_dir)
    hf = json.loads((model_dir / "config.json").read_text())
    hf["max_position_embeddings"] = 12
    (model_dir / "config.json").write_text(json.dumps(hf))
    short = load_target(model_dir, dtype="float32")
    assert short.cfg.max_position_embeddings == 12 and short.cfg == target.cfg
    engine = Engine(short)
    assert engine.generate(P, 7).tokens == Engine(target).generate(P, 7).tokens   # 5 + 7 = 12: allowed
    with pytest.raises(ValueError, match=r"prompt \(5 tokens\) \+ max_new_tokens \(8\) exceeds the model's "
                                         r"context limit \(max_position_embeddings 12 in its config.json\)"):
        engine.generate([[1, 2], P[0]], 8)
    hf["max_position_embeddings"] = -3
    (model_dir / "config.json").write_text(json.dumps(hf))
    with pytest.raises(ConfigError, match=r"config.json: max_position_embeddings must be >= 0 \(0: no limit\), got -3"):
        load_target_config(model_dir)


def test_drafter_configs_and_blocks_out_of_range_are_refused(tiny_hf):
    """A mask token outside the vocabulary drafted non-finite logits; block_size 1 failed later, naming a flag the
    user never passed; a block longer than the drafter's lost the rows past its cache without a word."""
    import jax.numpy as jnp
    from jaxspec.drafter import init_cache
    with pytest.raises(ConfigError, match=r"mask_token_id 512 is outside the vocabulary \[0, 512\)"):
        drafter_config(mask_token_id=512)
    with pytest.raises(ConfigError, match="block_size must be at least 2 .anchor \\+ one draft., got 1"):
        drafter_config(block_size=1)
    drafter = Drafter(drafter_config(), rngs=nnx.Rngs(0))                  # block_size 6
    embed, head = jnp.ones((512, 64)), jnp.ones((64, 512))
    cache, anchor = init_cache(drafter.cfg, 1, 16), jnp.array([3])
    assert drafter.draft(cache, anchor, embed, head, 6)[0].shape == (1, 5, 512)
    for bs in (7, 1, 0):
        with pytest.raises(ValueError, match=rf"draft: block_size {bs} must be in \[2, 6\]"):
            drafter.draft(cache, anchor, embed, head, bs)


def test_drafter_config_json_errors_name_the_file_once():
    hf = drafter_hf_config(drafter_config(), num_target_layers=4)
    for key, value, words in (("rms_norm_eps", None, "field 'rms_norm_eps' must be a finite number"),
                              ("head_dim", None, "field 'head_dim' must be an integer"),
                              ("hidden_size", "64", "field 'hidden_size' must be an integer")):
        with pytest.raises(ConfigError) as e:
            drafter_config_from_hf({**hf, key: value}, source="d.json")
        assert str(e.value).startswith(f"d.json: {words}"), str(e.value)
    derived = {k: v for k, v in hf.items() if k != "dflash_config"} | {
        "dflash_config": {k: v for k, v in hf["dflash_config"].items() if k != "target_layer_ids"},
        "num_target_layers": 2}
    with pytest.raises(ConfigError, match=r"d.json: no field 'target_layer_ids', and the default taps of 2 draft "
                                          r"layers over num_target_layers = 2 are not layers \(\[1, -1\]\)"):
        drafter_config_from_hf(derived, source="d.json")
    with pytest.raises(ValueError, match="dtype argument 'bf16' is not one of float32, bfloat16, float16"):
        drafter_config_from_hf(hf, dtype="bf16", source="d.json")


def test_top_k_past_the_row_and_broken_trees_are_refused(monkeypatch):
    import jax.numpy as jnp
    from jaxspec import ddtree, tree
    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 5)), jnp.float32)
    for method in ("sort", "count"):
        monkeypatch.setenv("JAXSPEC_DDTREE_TOP_K", method)
        assert ddtree.vocab_top_k(x, 5)[1].shape == (2, 5)
        with pytest.raises(ValueError, match=r"vocab_top_k: k = 7 must be in \[0, 5\]"):
            ddtree.vocab_top_k(x, 7)
    assert tree.from_parents(np.array([[-1, 0, 0, 1]])).depth.tolist() == [[0, 1, 1, 2]]
    for parent, where in (([[-1, 2, 0]], "row 0, node 1 has parent 2"), ([[-1, 5, 0]], "row 0, node 1 has parent 5"),
                          ([[0, 0, 1]], "row 0, node 0 has parent 0"),
                          ([[-1, 0], [-1, -3]], "row 1, node 1 has parent -3")):
        with pytest.raises(ValueError, match=f"from_parents: parents .B, N. must each be -1 or an earlier node: "
                                             f"{where}$"):
            tree.from_parents(np.array(parent))
