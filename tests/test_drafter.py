"""DFlash drafter: config parsing, converter, and parity with z-lab's reference `dflash.model.DFlashDraftModel`.

The reference is built from the same config.json dict that jaxspec parses, its weights are saved in the
checkpoint's flat single-file layout, and jaxspec loads them through `convert.drafter.load_drafter`.
"""

from __future__ import annotations

import copy
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from convert.drafter import load_drafter
from convert.hf import CheckpointError
from jaxspec.config import ConfigError, qwen36_27b
from jaxspec.drafter_config import (DrafterConfig, check_pair, drafter_config_from_hf, load_drafter_config,
                                    qwen36_27b_dflash)

FULL, SWA = "full_attention", "sliding_attention"
V, D, N_TAPS = 256, 64, 3
MASK = V - 7

# The literal z-lab/Qwen3.6-27B-DFlash config.json (reference/dflash.md section 3).
REAL = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3",
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"}, "block_size": 16,
        "dflash_config": {"mask_token_id": 248070, "target_layer_ids": [1, 16, 31, 46, 61]},
        "head_dim": 128, "hidden_size": 5120, "intermediate_size": 17408, "initializer_range": 0.02,
        "layer_types": [SWA, SWA, SWA, SWA, FULL], "num_attention_heads": 32, "num_hidden_layers": 5,
        "num_key_value_heads": 8, "num_target_layers": 64, "rms_norm_eps": 1e-06, "rope_theta": 10000000,
        "sliding_window": 2048, "use_sliding_window": True, "vocab_size": 248320}

# name -> (layer_types, sliding_window, is_causal, block_size)
LAYOUTS = {
    "qwen35": ([FULL] * 4, None, None, 6),             # all full, bidirectional
    "qwen36": ([SWA] * 4 + [FULL], 8, None, 6),        # causal sliding + one bidirectional full layer
    "causal": ([SWA, FULL, SWA], 8, True, 6),          # explicit is_causal=true: full layer causal too
    "bidir_swa": ([SWA, FULL, SWA], 3, False, 6),      # explicit false, window shorter than the block
}


def tiny_hf(layout: str) -> dict:
    types, window, causal, bs = LAYOUTS[layout]
    cfg = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": bs,
           "dflash_config": {"mask_token_id": MASK, "target_layer_ids": [1, 3, 4]},
           "head_dim": 16, "hidden_size": D, "intermediate_size": 96, "num_attention_heads": 4,
           "num_key_value_heads": 2, "num_hidden_layers": len(types), "layer_types": types,
           "num_target_layers": 6, "rms_norm_eps": 1e-6, "rope_theta": 1e4, "vocab_size": V,
           "use_sliding_window": window is not None, "sliding_window": window, "dtype": "float32"}
    if causal is not None:
        cfg["is_causal"] = causal
    return cfg


def make_reference(path, hf: dict, seed: int = 0):
    """DFlashDraftModel (fp32) with O(1) random weights; writes config.json + flat model.safetensors."""
    import torch
    from dflash.model import DFlashDraftModel
    from safetensors.torch import save_file
    from transformers import Qwen3Config

    torch.manual_seed(seed)
    model = DFlashDraftModel(Qwen3Config(**copy.deepcopy(hf))).float().eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        # The default 0.02 init leaves every layer's contribution tiny next to the residual, which would
        # hide mask or position errors; norms move off 1 so that a (1 + w) slip shows.
        for name, p in model.named_parameters():
            if p.ndim == 2:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
            else:
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))
    path.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.named_parameters()}, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(hf))
    return model


_REF: dict = {}
_PATH: dict = {}


@pytest.fixture
def ref(tmp_path_factory, request):
    """(torch reference, jaxspec drafter loaded by the converter, embed [V,D], lm_head kernel [D,V])."""
    layout = request.param
    if layout not in _REF:
        path = tmp_path_factory.mktemp(f"drafter_{layout}")
        model = make_reference(path, tiny_hf(layout))
        rng = np.random.default_rng(1)
        embed = rng.standard_normal((V, D)).astype(np.float32)
        lm = (rng.standard_normal((D, V)) / D ** 0.5).astype(np.float32)
        _REF[layout] = (model, load_drafter(path), embed, lm)
        _PATH[layout] = path
    return _REF[layout]


def ref_logits(model, ctx, start, anchor, embed, lm, *, block_size, cache=None):
    """The reference's drafter call inside `dflash_generate`: context rows at start - T .. start - 1,
    block [anchor, MASK...] at start .. start + block_size - 1; logits of slots 1..block_size-1."""
    import torch
    t = ctx.shape[0]
    block = torch.tensor([[anchor] + [MASK] * (block_size - 1)])
    with torch.no_grad():
        h = model(target_hidden=torch.from_numpy(ctx)[None], noise_embedding=torch.from_numpy(embed)[block],
                  position_ids=torch.arange(start - t, start + block_size)[None], past_key_values=cache,
                  use_cache=cache is not None)
        return (h[0, 1 - block_size:] @ torch.from_numpy(lm)).numpy()


def pad_rows(rows: list[np.ndarray], t: int) -> np.ndarray:
    """[B, t, n_taps*D]; the padding is large garbage, which must not reach the cache."""
    out = np.full((len(rows), t, N_TAPS * D), 1e3, np.float32)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
    return out


@nnx.jit
def add_context(drafter, cache, taps, n_new):
    return drafter.add_context(cache, taps, n_new)


@functools.partial(nnx.jit, static_argnames="block_size")
def draft(drafter, cache, anchor, embed, lm, block_size=None):
    return drafter.draft(cache, anchor, embed, lm, block_size)[0]


def assert_close(got, want):
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- parity


@pytest.mark.parametrize("ref", list(LAYOUTS), indirect=True)
def test_single_round_parity(ref):
    """One context of a different length per sequence (longer than the window), then one draft; the
    same context added in uneven chunks (the first longer than the ring) gives the same logits."""
    model, drafter, embed, lm = ref
    bs = drafter.cfg.block_size
    rng = np.random.default_rng(2)
    lens, anchors = [21, 13], np.array([5, 77])
    ctx = [rng.standard_normal((n, N_TAPS * D)).astype(np.float32) for n in lens]
    want = [ref_logits(model, c, n, a, embed, lm, block_size=bs) for c, n, a in zip(ctx, lens, anchors)]

    cache = add_context(drafter, drafter.init_cache(2, 40), jnp.asarray(pad_rows(ctx, 24)), jnp.array(lens))
    got = draft(drafter, cache, jnp.asarray(anchors), jnp.asarray(embed), jnp.asarray(lm))
    assert got.shape == (2, bs - 1, V) and got.dtype == jnp.float32
    for b in range(2):
        assert_close(got[b], want[b])

    # Chunks of 13/10 rows then 8/3 rows (padded to the same shape: one compile).
    cache = drafter.init_cache(2, 40)
    cache = add_context(drafter, cache, jnp.asarray(pad_rows([ctx[0][:13], ctx[1][:10]], 24)), jnp.array([13, 10]))
    cache = add_context(drafter, cache, jnp.asarray(pad_rows([ctx[0][13:], ctx[1][10:]], 24)), jnp.array([8, 3]))
    np.testing.assert_array_equal(np.asarray(cache.length), lens)
    got = draft(drafter, cache, jnp.asarray(anchors), jnp.asarray(embed), jnp.asarray(lm))
    for b in range(2):
        assert_close(got[b], want[b])

    # A shorter block than the config's (block_size is a draft-time argument).
    want3 = ref_logits(model, ctx[1], lens[1], anchors[1], embed, lm, block_size=3)
    got3 = draft(drafter, cache, jnp.asarray(anchors), jnp.asarray(embed), jnp.asarray(lm), block_size=3)
    assert_close(got3[1], want3)


@pytest.mark.parametrize("ref", ["qwen36", "qwen35", "bidir_swa"], indirect=True)
def test_multi_round_parity_with_reference_cache(ref):
    """Rounds of (new context rows, draft) under jit against the reference's own DynamicCache, cropped
    to `start` after each draft as `dflash_generate` does. The sliding rings wrap several times. The cache
    each draft returns is the next round's (as in the engine): its block rows past the context, fewer of
    which the next context overwrites than the draft wrote, must stay invisible."""
    from dflash.model import _crop_to, _make_cache
    model, drafter, embed, lm = ref
    bs = drafter.cfg.block_size
    rng = np.random.default_rng(3)
    schedule = [[6, 3]] + [list(rng.integers(1, bs + 1, size=2)) for _ in range(8)]

    @nnx.jit
    def step(drafter, cache, taps, n_new, anchor, embed, lm):
        cache = drafter.add_context(cache, taps, n_new)
        logits, cache = drafter.draft(cache, anchor, embed, lm)
        return cache, logits

    caches = [_make_cache(model.config) for _ in range(2)]
    cache = drafter.init_cache(2, 64)
    start = [0, 0]
    for r, n_new in enumerate(schedule):
        rows = [rng.standard_normal((n, N_TAPS * D)).astype(np.float32) for n in n_new]
        anchors = rng.integers(0, V, size=2)
        cache, got = step(drafter, cache, jnp.asarray(pad_rows(rows, bs)),
                          jnp.array(n_new, jnp.int32), jnp.asarray(anchors), jnp.asarray(embed), jnp.asarray(lm))
        for b in range(2):
            start[b] += int(n_new[b])
            want = ref_logits(model, rows[b], start[b], int(anchors[b]), embed, lm, block_size=bs, cache=caches[b])
            _crop_to(caches[b], start[b])
            assert_close(got[b], want)
    np.testing.assert_array_equal(np.asarray(cache.length), start)
    assert max(start) > 3 * 8   # past the window several times over


@pytest.mark.parametrize("ref", ["qwen36", "causal"], indirect=True)
def test_full_layers_on_the_tree_attention_kernel(ref, monkeypatch):
    """The full layers run the block over their cache through the Pallas tree-attention kernel (interpreted
    here; the GPU default): z-lab's logits, for a bidirectional and a causal full layer, at contexts of
    different lengths, and again a round later over the first draft's scratch rows."""
    from pallas_kernels.tree_attention import api as attention_api
    from pallas_kernels.tree_attention import pallas_triton
    monkeypatch.setenv(attention_api.ENV_VAR, "pallas_interpret")
    model, drafter, embed, lm = ref
    bs = drafter.cfg.block_size
    cache = drafter.init_cache(2, 40)
    full = [i for i, w in enumerate(drafter.cfg.windows) if w is None]
    assert full and attention_api.resolve() == "pallas_interpret"
    assert pallas_triton.supports((2, bs, drafter.cfg.num_heads, drafter.cfg.head_dim), cache.keys[full[0]].shape)

    @nnx.jit
    def step(drafter, cache, taps, n_new, anchor, embed, lm):      # traced here, under the variable
        logits, cache = drafter.draft(drafter.add_context(cache, taps, n_new), anchor, embed, lm)
        return logits, cache

    rng = np.random.default_rng(8)
    ctx = [rng.standard_normal((n, N_TAPS * D)).astype(np.float32) for n in (21, 13)]
    more = [rng.standard_normal((n, N_TAPS * D)).astype(np.float32) for n in (2, 5)]   # fewer than a block
    for rows, seen in ((ctx, ctx), (more, [np.concatenate(p) for p in zip(ctx, more)])):
        anchors = rng.integers(0, V, size=2)
        logits, cache = step(drafter, cache, jnp.asarray(pad_rows(rows, 24)), jnp.array([len(r) for r in rows]),
                             jnp.asarray(anchors), jnp.asarray(embed), jnp.asarray(lm))
        for b in range(2):
            assert_close(logits[b], ref_logits(model, seen[b], len(seen[b]), int(anchors[b]), embed, lm,
                                               block_size=bs))


@pytest.mark.parametrize("ref", ["qwen36"], indirect=True)
def test_zero_new_rows_leave_the_cache_alone(ref):
    """A sequence with n_new = 0 (e.g. finished, riding along in the batch) keeps its context."""
    _, drafter, embed, lm = ref
    rng = np.random.default_rng(4)
    rows = [rng.standard_normal((n, N_TAPS * D)).astype(np.float32) for n in (11, 11)]
    cache = add_context(drafter, drafter.init_cache(2, 32), jnp.asarray(pad_rows(rows, 11)), jnp.array([11, 11]))
    before = draft(drafter, cache, jnp.array([3, 3]), jnp.asarray(embed), jnp.asarray(lm))
    more = rng.standard_normal((2, 6, N_TAPS, D)).astype(np.float32)   # taps as the target returns them
    cache = add_context(drafter, cache, jnp.asarray(more), jnp.array([0, 6]))
    np.testing.assert_array_equal(np.asarray(cache.length), [11, 17])
    after = draft(drafter, cache, jnp.array([3, 3]), jnp.asarray(embed), jnp.asarray(lm))
    np.testing.assert_array_equal(np.asarray(after[0]), np.asarray(before[0]))
    assert not np.allclose(np.asarray(after[1]), np.asarray(before[1]))


@pytest.mark.parametrize("ref", ["qwen36"], indirect=True)
def test_ring_of_max_len_below_the_window(ref):
    """A cache of max_len 6 under a window of 8: the sliding layers' rings hold 6 rows, and a context of all 6 (in one
    chunk, or 4 + 2) must keep position 0 visible, as the reference's unwindowed-at-this-length attention does."""
    model, drafter, embed, lm = ref
    assert drafter.cfg.sliding_window == 8
    rng = np.random.default_rng(6)
    ctx = rng.standard_normal((6, N_TAPS * D)).astype(np.float32)
    want = ref_logits(model, ctx, 6, 31, embed, lm, block_size=drafter.cfg.block_size)
    one = add_context(drafter, drafter.init_cache(1, 6), jnp.asarray(ctx[None]), jnp.array([6]))
    two = drafter.init_cache(1, 6)
    for part in (ctx[:4], ctx[4:]):
        two = add_context(drafter, two, jnp.asarray(pad_rows([part], 4)), jnp.array([len(part)]))
    for cache in (one, two):
        assert cache.rows[0] == 6
        assert_close(draft(drafter, cache, jnp.array([31]), jnp.asarray(embed), jnp.asarray(lm))[0], want)


@pytest.mark.parametrize("ref", ["qwen36"], indirect=True)
def test_padding_columns_of_a_sharded_vocabulary_are_never_drafted(ref):
    """An lm_head padded past the vocabulary (as a tensor-parallel layout pads it) gives -inf logits in the padding
    columns, whatever their weights, and the vocabulary's columns unchanged."""
    _, drafter, embed, lm = ref
    rng = np.random.default_rng(7)
    cache = add_context(drafter, drafter.init_cache(1, 16), jnp.asarray(rng.standard_normal((1, 9, N_TAPS * D)),
                                                                     jnp.float32), jnp.array([9]))
    padded = np.concatenate([lm, 50.0 * np.abs(rng.standard_normal((D, 8))).astype(np.float32)], 1)
    got = np.asarray(draft(drafter, cache, jnp.array([4]), jnp.asarray(embed), jnp.asarray(padded)))
    want = np.asarray(draft(drafter, cache, jnp.array([4]), jnp.asarray(embed), jnp.asarray(lm)))
    assert got.shape[-1] == V + 8 and np.all(got[..., V:] == -np.inf)
    np.testing.assert_array_equal(got[..., :V], want)


@pytest.mark.parametrize("ref", ["qwen36"], indirect=True)
def test_bfloat16_path(ref):
    """bf16 params, cache and inputs run and stay near the fp32 logits."""
    _, drafter, embed, lm = ref
    d16 = load_drafter(_PATH["qwen36"], dtype="bfloat16")
    rng = np.random.default_rng(5)
    taps = jnp.asarray(rng.standard_normal((1, 12, N_TAPS * D)).astype(np.float32))
    want = draft(drafter, add_context(drafter, drafter.init_cache(1, 16), taps, jnp.array([12])), jnp.array([9]),
                 jnp.asarray(embed), jnp.asarray(lm))
    cache = add_context(d16, d16.init_cache(1, 16), taps.astype(jnp.bfloat16), jnp.array([12]))
    assert all(k.dtype == jnp.bfloat16 for k in cache.keys)
    got = draft(d16, cache, jnp.array([9]), jnp.asarray(embed, jnp.bfloat16), jnp.asarray(lm, jnp.bfloat16))
    assert got.dtype == jnp.float32
    err = float(jnp.max(jnp.abs(got - want)))
    assert 0 < err < 3e-2 * float(jnp.max(jnp.abs(want)))        # measured 1.6e-2 (bf16 through every layer)


def test_cache_shapes():
    cfg = drafter_config_from_hf(tiny_hf("qwen36"))
    from jaxspec.drafter import init_cache
    bs = cfg.block_size   # a full layer's room for a draft's block past a context of max_len
    c = init_cache(cfg, 3, 100)
    assert c.rows == (8, 8, 8, 8, 100 + bs)
    assert c.keys[0].shape == (3, 8, 2, 16) and c.length.shape == (3,)
    assert init_cache(cfg, 1, 5).rows == (5, 5, 5, 5, 5 + bs)   # a ring never exceeds max_len
    no_window = drafter_config_from_hf({**tiny_hf("qwen36"), "use_sliding_window": False})
    assert init_cache(no_window, 1, 50).rows == (50 + bs,) * 5


# ---------------------------------------------------------------- converter


@pytest.fixture
def ckpt(tmp_path):
    """A tiny drafter checkpoint directory and its tensors (torch)."""
    model = make_reference(tmp_path, tiny_hf("qwen36"))
    return tmp_path, {k: v.detach().clone().contiguous() for k, v in model.named_parameters()}


def _rewrite(path, tensors):
    from safetensors.torch import save_file
    save_file(tensors, str(path / "model.safetensors"))


def test_loader_layout_and_dtype(ckpt):
    path, tensors = ckpt
    assert len(tensors) == 3 + 11 * 5   # the real checkpoint: 58 tensors for 5 layers
    d = load_drafter(path)
    np.testing.assert_array_equal(np.asarray(d.fc.kernel[...]), tensors["fc.weight"].numpy().T)
    np.testing.assert_array_equal(np.asarray(d.layers[4].self_attn.k_norm.weight[...]),
                                  tensors["layers.4.self_attn.k_norm.weight"].numpy())
    np.testing.assert_array_equal(np.asarray(d.layers[2].mlp.down_proj.kernel[...]),
                                  tensors["layers.2.mlp.down_proj.weight"].numpy().T)
    assert d.cfg.dtype == "float32" and d.fc.kernel.dtype == jnp.float32
    b = load_drafter(path, dtype="bfloat16")
    assert b.cfg.dtype == "bfloat16"
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(nnx.state(b)))


def test_loader_missing_tensor(ckpt):
    path, tensors = ckpt
    del tensors["layers.3.self_attn.v_proj.weight"]
    _rewrite(path, tensors)
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*missing.*layers\.3\.self_attn\.v_proj\.weight"):
        load_drafter(path)


def test_loader_unexpected_tensor(ckpt):
    import torch
    path, tensors = ckpt
    tensors["lm_head.weight"] = torch.zeros(V, D)
    _rewrite(path, tensors)
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*unexpected.*'lm_head\.weight'.*no embedding"):
        load_drafter(path)


def test_loader_misshaped_tensor(ckpt):
    import torch
    path, tensors = ckpt
    tensors["fc.weight"] = torch.zeros(D, 2 * D)   # two taps' worth, config has three
    _rewrite(path, tensors)
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*'fc\.weight'.*\(64, 128\).*\(64, 192\)"):
        load_drafter(path)


def test_loader_refuses_pickle_and_shards_without_an_index(ckpt):
    path, _ = ckpt
    (path / "model.safetensors").unlink()
    (path / "pytorch_model.bin").write_bytes(b"not really")
    with pytest.raises(CheckpointError, match=r"pickle.*pytorch_model\.bin"):
        load_drafter(path)
    (path / "pytorch_model.bin").unlink()
    (path / "model-00001-of-00002.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"expected model\.safetensors .* or shards with model\.safetensors\.index\.json"):
        load_drafter(path)


def test_loader_needs_config(ckpt):
    path, _ = ckpt
    (path / "config.json").unlink()
    with pytest.raises(ConfigError, match=r"config\.json: no such file"):
        load_drafter(path)


# ---------------------------------------------------------------- config


def test_real_config():
    cfg = drafter_config_from_hf(REAL)
    assert cfg == qwen36_27b_dflash()
    assert cfg.causal == (True,) * 4 + (False,)
    assert cfg.windows == (2048,) * 4 + (None,)
    assert cfg.n_taps == 5 and cfg.dtype == "bfloat16"
    hash(cfg)
    check_pair(cfg, qwen36_27b())
    from jaxspec.drafter import Drafter
    params = nnx.state(nnx.eval_shape(lambda: Drafter(cfg, rngs=nnx.Rngs(0))), nnx.Param)
    n = sum(x.size for x in jax.tree.leaves(params))
    per_layer = 5120 * (4096 + 2 * 1024) + 4096 * 5120 + 3 * 5120 * 17408 + 2 * 5120 + 2 * 128
    assert n == 5 * per_layer + 25600 * 5120 + 2 * 5120   # 1.73 B (reference/dflash.md section 3)
    assert 1.72e9 < n < 1.74e9


def test_config_file_and_dtype_override(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(REAL))
    assert load_drafter_config(tmp_path, dtype="float32") == qwen36_27b_dflash("float32")
    assert load_drafter_config(tmp_path / "config.json") == qwen36_27b_dflash()


def test_rope_theta_nested_or_top_level():
    nested = {k: v for k, v in REAL.items() if k != "rope_theta"}
    nested["rope_parameters"] = {"rope_type": "default", "rope_theta": 5e6}
    assert drafter_config_from_hf(nested).rope_theta == 5e6
    assert drafter_config_from_hf({**REAL, "rope_theta": 123.0}).rope_theta == 123.0
    del nested["rope_parameters"]
    with pytest.raises(ConfigError, match=r"my/config\.json: missing field 'rope_theta'"):
        drafter_config_from_hf(nested, source="my/config.json")
    with pytest.raises(ConfigError, match="rope_type 'yarn'"):
        drafter_config_from_hf({**REAL, "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e7}})
    # beside plain rope_parameters, a rope_scaling block is what transformers runs: refused, not run as plain RoPE
    with pytest.raises(ConfigError, match="rope_scaling.rope_type 'linear'"):
        drafter_config_from_hf({**REAL, "rope_parameters": {"rope_type": "default", "rope_theta": 1e7},
                                "rope_scaling": {"rope_type": "linear", "factor": 2.0}})


def test_use_sliding_window_false():
    cfg = drafter_config_from_hf({**REAL, "use_sliding_window": False})
    assert cfg.sliding_window is None and cfg.windows == (None,) * 5
    assert cfg.causal == (True,) * 4 + (False,)   # causality follows the layer type, not the window
    with pytest.raises(ConfigError, match="sliding_window must be positive, got 0"):
        drafter_config_from_hf({**REAL, "sliding_window": 0})
    with pytest.raises(ConfigError, match="'use_sliding_window' must be true or false"):
        drafter_config_from_hf({**REAL, "use_sliding_window": "yes"})


@pytest.mark.parametrize("use", [True, False])
@pytest.mark.parametrize("window", ["absent", None, 512])
@pytest.mark.parametrize("types", ["given", "derived"])
def test_window_and_layer_types_as_hf_qwen3config(use, window, types):
    """The window and layer types are what transformers' Qwen3Config (z-lab's drafter's config class) makes of
    use_sliding_window, sliding_window (absent: its default; null) and max_window_layers."""
    from transformers import Qwen3Config
    hf = {k: v for k, v in REAL.items() if k not in ("sliding_window", "layer_types")}
    hf |= {"use_sliding_window": use, "max_window_layers": 2}
    if window != "absent":
        hf["sliding_window"] = window
    if types == "given":
        hf["layer_types"] = REAL["layer_types"]
    ref = Qwen3Config(**{k: v for k, v in hf.items() if k != "dflash_config"})
    cfg = drafter_config_from_hf(hf)
    assert cfg.sliding_window == ref.sliding_window
    assert list(cfg.layer_types) == ref.layer_types
    assert cfg.windows == tuple(ref.sliding_window if t == SWA else None for t in ref.layer_types)


def test_layer_types_default_follows_hf_qwen3():
    base = {k: v for k, v in REAL.items() if k != "layer_types"}
    assert drafter_config_from_hf(base).layer_types == (FULL,) * 5    # max_window_layers defaults to 28
    cfg = drafter_config_from_hf({**base, "max_window_layers": 3})
    assert cfg.layer_types == (FULL,) * 3 + (SWA,) * 2
    cfg = drafter_config_from_hf({**base, "max_window_layers": 3, "use_sliding_window": False})
    assert cfg.layer_types == (FULL,) * 5


def test_is_causal_override():
    assert drafter_config_from_hf({**REAL, "is_causal": True}).causal == (True,) * 5
    assert drafter_config_from_hf({**REAL, "is_causal": False}).causal == (False,) * 5
    assert drafter_config_from_hf({**REAL, "is_causal": None}).causal == (True,) * 4 + (False,)
    with pytest.raises(ConfigError, match="'is_causal' must be true or false"):
        drafter_config_from_hf({**REAL, "is_causal": 1})


def test_dflash_config_precedence():
    hf = {**REAL, "mask_token_id": 7, "target_layer_ids": [2, 3], "dflash_config": {
        "mask_token_id": 248070, "target_layer_ids": [1, 16, 31, 46, 61], "block_size": 8}}
    cfg = drafter_config_from_hf(hf)
    assert cfg.mask_token_id == 248070 and cfg.target_layer_ids == (1, 16, 31, 46, 61) and cfg.block_size == 8
    top = {k: v for k, v in REAL.items() if k != "dflash_config"}
    cfg = drafter_config_from_hf({**top, "mask_token_id": 9, "target_layer_ids": [0, 2]})
    assert cfg.mask_token_id == 9 and cfg.target_layer_ids == (0, 2)
    assert drafter_config_from_hf({k: v for k, v in REAL.items() if k != "block_size"}).block_size == 16


@pytest.mark.parametrize("layers,draft", [(64, 5), (36, 5), (6, 3), (40, 1), (28, 8)])
def test_default_target_layer_ids_match_reference(layers, draft):
    from dflash.model import build_target_layer_ids
    hf = {**REAL, "num_hidden_layers": draft, "layer_types": [FULL] * draft, "num_target_layers": layers,
          "dflash_config": {"mask_token_id": 248070}}
    assert list(drafter_config_from_hf(hf).target_layer_ids) == build_target_layer_ids(layers, draft)


@pytest.mark.parametrize("field", ["hidden_size", "vocab_size", "num_attention_heads", "num_key_value_heads",
                                   "intermediate_size", "num_hidden_layers", "head_dim"])
def test_missing_field(tmp_path, field):
    (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in REAL.items() if k != field}))
    with pytest.raises(ConfigError, match=rf"{tmp_path}/config\.json: missing field '{field}'"):
        load_drafter_config(tmp_path)


def test_missing_dflash_fields():
    hf = copy.deepcopy(REAL)
    del hf["dflash_config"]["mask_token_id"]
    with pytest.raises(ConfigError, match=r"missing field 'mask_token_id' \(looked in dflash_config"):
        drafter_config_from_hf(hf)
    hf = copy.deepcopy(REAL)
    del hf["dflash_config"]["target_layer_ids"], hf["num_target_layers"]
    with pytest.raises(ConfigError, match=r"missing field 'target_layer_ids'"):
        drafter_config_from_hf(hf)


@pytest.mark.parametrize("patch,msg", [
    ({"hidden_size": "5120"}, r"'hidden_size' must be an integer"),
    ({"num_attention_heads": 30}, r"not a multiple of num_key_value_heads"),
    ({"num_key_value_heads": 0}, r"num_key_value_heads must be positive"),
    ({"layer_types": [SWA] * 4}, r"layer_types must be a list of 5 entries"),
    ({"layer_types": [SWA] * 4 + ["linear_attention"]}, r"unknown layer type 'linear_attention'"),
    ({"sliding_window": 0}, r"sliding_window must be positive"),
    ({"dflash_config": {"mask_token_id": 248320, "target_layer_ids": [1]}},
     r"'dflash_config\.mask_token_id' = 248320 is outside the vocabulary"),
    ({"dflash_config": {"mask_token_id": 1, "target_layer_ids": [1, -2]}}, r"negative layer id"),
    ({"dflash_config": {"mask_token_id": 1, "target_layer_ids": [], "block_size": 4}}, r"non-empty list"),
    ({"block_size": 1}, r"'block_size' must be at least 2"),
    ({"attention_bias": True}, r"attention_bias"),
    ({"dflash_config": {"mask_token_id": 1, "target_layer_ids": [1], "conv_kernel_size": 4}}, r"DFlash-2"),
    ({"output_multiplier": 2.0}, r"'output_multiplier' = 2.0 is not supported"),
    ({"final_logit_softcapping": 30.0}, r"final_logit_softcapping"),
    ({"dtype": "int8"}, r"dtype 'int8'"),
])
def test_bad_values(patch, msg):
    with pytest.raises(ConfigError, match=r"^cfg\.json: .*" + msg):
        drafter_config_from_hf({**REAL, **patch}, source="cfg.json")


def test_check_pair_errors():
    target, drafter = qwen36_27b(), qwen36_27b_dflash()
    with pytest.raises(ConfigError, match=r"hidden_size 4096 != target hidden_size 5120"):
        check_pair(drafter.replace(hidden_size=4096), target)
    with pytest.raises(ConfigError, match=r"vocab_size 151936 != target vocab_size 248320"):
        check_pair(drafter.replace(vocab_size=151936, mask_token_id=151935), target)
    with pytest.raises(ConfigError, match=r"ids \[46, 61\] are not layers of the 40-layer target"):
        check_pair(drafter, target.replace(layer_types=target.layer_types[:40]))
    with pytest.raises(ConfigError, match=r"mask_token_id 248320 is outside the vocabulary \[0, 248320\)"):
        drafter.replace(mask_token_id=248320)             # the drafter's own vocabulary, which check_pair equates
    assert isinstance(drafter, DrafterConfig)
