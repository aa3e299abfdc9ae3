"""The whole engine with the Pallas kernels switched on (tree attention, chain attention's split (the prefix kernel
merged with the block's own attention), the tree delta rule and its chain form for a prefill of more than 64 tokens,
verification, the fused GDN decode step, the GDN tree inputs, the GDN output gate, the commit's GDN state update,
the fused residual add + RMSNorm, the skinny matmul): greedy AR, AR's step run as a tile of rows (`AR(rows)`), DFlash
chains and DDTree trees stay token-identical to plain greedy AR without kernels, with
oracle drafters so that every acceptance length and sibling branches occur.

CPU: the kernels in interpret mode. GPU (`-m gpu`): the compiled Triton kernels, fp32 tiny target
(`JAX_PLATFORMS=cuda python -m pytest tests/test_kernels_engine.py -m gpu`); cuDNN takes no fp32, so there chains go
through the tree kernel, and a bf16 target checks the chain op's GPU path in the prefill.
"""

import numpy as np
import pytest

from convert.hf import load_target
from jaxspec.engine import AR, Engine
from kernel_tests import on_gpu
from oracle import OracleChain, OracleTree, reference
from pallas_kernels.add_rms_norm import pallas_triton as add_norm_kernel
from pallas_kernels.chain_attention import api as chain_api
from pallas_kernels.conv_commit import pallas_triton as conv_commit_kernel
from pallas_kernels.gdn_commit import pallas_triton as gdn_commit_kernel
from pallas_kernels.gdn_decode import pallas_triton as gdn_decode_kernel
from pallas_kernels.gdn_tree_inputs import pallas_triton as gdn_inputs_kernel
from pallas_kernels.skinny_matmul import pallas_triton as matmul_kernel
from pallas_kernels.tree_attention import pallas_triton as attention_kernel
from pallas_kernels.tree_delta_rule import pallas_triton as delta_rule_kernel
from pallas_kernels.verify import pallas_triton as verify_kernel

FLAGS = ("JAXSPEC_TREE_ATTENTION", "JAXSPEC_CHAIN_ATTENTION", "JAXSPEC_VERIFY", "JAXSPEC_TREE_DELTA_RULE",
         "JAXSPEC_GDN_DECODE", "JAXSPEC_GDN_TREE_INPUTS", "JAXSPEC_ADD_RMS_NORM", "JAXSPEC_SKINNY_MATMUL",
         "JAXSPEC_GDN_COMMIT", "JAXSPEC_CONV_COMMIT")


@pytest.fixture(scope="module")
def baseline(tiny_hf):
    """Greedy AR with every op on its jnp reference (on a GPU too, where some kernels are the default)."""
    target = load_target(tiny_hf[0], dtype="float32")
    rs = np.random.RandomState(7)
    # 90 tokens: the prefill's piece of 128 runs the chain delta rule (more than one block of 64)
    prompts = [rs.randint(0, 512, size=n).tolist() for n in (3, 29, 17, 90)]
    n_new = 22
    with pytest.MonkeyPatch.context() as mp:
        for flag in FLAGS:
            mp.setenv(flag, "reference")
        return target, prompts, n_new, Engine(target).generate(prompts, n_new).tokens


def _count_traces(monkeypatch):
    """Counts, per kernel, how often the engine traced it (so a silent fallback to jnp would fail)."""
    traced = {}
    for module, name in ((attention_kernel, "tree_attention"), (attention_kernel, "prefix_partials"),
                         (delta_rule_kernel, "tree_delta_rule"),
                         (delta_rule_kernel, "state_pass"),
                         (verify_kernel, "gumbel_partial"), (gdn_decode_kernel, "gdn_decode"),
                         (gdn_inputs_kernel, "gdn_tree_inputs"),
                         (add_norm_kernel, "add_rms_norm"),
                         (matmul_kernel, "matmul"), (gdn_commit_kernel, "gdn_commit"),
                         (conv_commit_kernel, "conv_commit")):
        def counting(*a, _fn=getattr(module, name), _name=name, **kw):
            traced[_name] = traced.get(_name, 0) + 1
            return _fn(*a, **kw)
        monkeypatch.setattr(module, name, counting)
    return traced


def _set_flags(monkeypatch, implementation):
    """Every op's flag to `implementation` (read when the engine's round is traced); chain attention's compiled
    path is cuDNN, which takes no fp32: on a GPU chains then go through the tree op (its kernel)."""
    for flag in FLAGS:
        monkeypatch.setenv(flag, implementation)
    if implementation == "pallas_triton":
        monkeypatch.setenv(chain_api.ENV_VAR, "tree")


def _check(baseline, monkeypatch, implementation):
    target, prompts, n_new, ar = baseline
    _set_flags(monkeypatch, implementation)
    traced = _count_traces(monkeypatch)
    assert Engine(target).generate(prompts, n_new).tokens == ar
    assert Engine(target, AR(5)).generate(prompts, n_new).tokens == ar      # the step as a tile: a forest of roots
    block = 5
    chain = Engine(target, OracleChain(block, 512, ref=reference(prompts, ar, block)))
    out = chain.generate(prompts, n_new, seed=1, rounds_per_call=4)
    assert out.tokens == ar
    assert (out.hist[1:] > 0).sum() >= 3, out.hist          # several acceptance lengths, not only 1
    depth, budget = 3, 6
    tree = Engine(target, OracleTree(depth, budget, 512, reference(prompts, ar, depth + 1)))
    out = tree.generate(prompts, n_new, seed=2, rounds_per_call=4)
    assert out.tokens == ar
    assert int(np.asarray(out.final.draft["off_spine"]).sum()) > 0, "no sibling branch was accepted"
    split = {"prefix_partials"} if implementation == "pallas_interpret" else set()
    assert set(traced) == {"tree_attention", "tree_delta_rule", "state_pass", "gumbel_partial", "gdn_decode",
                           "gdn_tree_inputs", "add_rms_norm", "matmul", "gdn_commit", "conv_commit"} | split, traced


@pytest.mark.slow
def test_interpreted_kernels_keep_the_engine_lossless(baseline, monkeypatch):
    _check(baseline, monkeypatch, "pallas_interpret")


@on_gpu
def test_gpu_kernels_keep_the_engine_lossless(baseline, monkeypatch):
    _check(baseline, monkeypatch, "pallas_triton")


def test_interpreted_kernels_keep_speculative_rounds_lossless(tiny_hf, monkeypatch):
    """The fast check of the slow test above: one prompt, greedy AR, a DFlash-shaped oracle chain and an oracle
    DDTree tree (accepted drafts, sibling branches) through every kernel in interpret mode, token-identical to
    greedy AR with every op on its jnp reference."""
    target = load_target(tiny_hf[0], dtype="float32")
    prompts, n_new = [np.random.RandomState(8).randint(0, 512, size=11).tolist()], 12
    for flag in FLAGS:
        monkeypatch.setenv(flag, "reference")
    ar = Engine(target).generate(prompts, n_new).tokens
    _set_flags(monkeypatch, "pallas_interpret")      # chains (AR's step, the DFlash blocks) through the split
    traced = _count_traces(monkeypatch)
    assert Engine(target).generate(prompts, n_new).tokens == ar            # AR's step: the fused GDN decode
    block = 4
    out = Engine(target, OracleChain(block, 512, ref=reference(prompts, ar, block))).generate(prompts, n_new, seed=1)
    assert out.tokens == ar
    assert out.hist[2:].sum() > 0, out.hist                 # drafted tokens were accepted
    depth, budget = 3, 6
    tree = Engine(target, OracleTree(depth, budget, 512, reference(prompts, ar, depth + 1)))
    out = tree.generate(prompts, n_new, seed=2)
    assert out.tokens == ar
    assert int(np.asarray(out.final.draft["off_spine"]).sum()) > 0, "no sibling branch was accepted"
    assert set(traced) == {"tree_attention", "prefix_partials", "tree_delta_rule", "gumbel_partial", "gdn_decode",
                           "gdn_tree_inputs", "add_rms_norm", "matmul", "gdn_commit", "conv_commit"}, traced


def _prefill_past_the_cache_end(tiny_hf, monkeypatch, implementation):
    """A 70-token prompt in a cache of 80 slots: its prefill is one piece of 128 (engine.prefill_pieces), 48 padded
    tokens past the cache's end, whose writes must be dropped. Greedy AR through every kernel, token-identical to
    every op on its jnp reference in a cache with room for the whole piece."""
    from jaxspec.engine import PREFILL_CHUNK, prefill_pieces
    assert prefill_pieces(70, PREFILL_CHUNK) == [128]
    target = load_target(tiny_hf[0], dtype="float32")
    prompts, n_new = [np.random.RandomState(9).randint(0, 512, size=70).tolist()], 8
    for flag in FLAGS:
        monkeypatch.setenv(flag, "reference")
    ar = Engine(target).generate(prompts, n_new, max_len=256).tokens
    _set_flags(monkeypatch, implementation)
    traced = _count_traces(monkeypatch)
    assert Engine(target).generate(prompts, n_new, max_len=80).tokens == ar
    # the piece's attention: chain attention's split (the prefix kernel) interpreted, the tree kernel compiled
    attention = "prefix_partials" if implementation == "pallas_interpret" else "tree_attention"
    assert {attention, "state_pass", "gdn_tree_inputs"} <= set(traced), traced


def test_interpreted_kernels_prefill_past_the_cache_end(tiny_hf, monkeypatch):
    _prefill_past_the_cache_end(tiny_hf, monkeypatch, "pallas_interpret")


@on_gpu
def test_gpu_kernels_prefill_past_the_cache_end(tiny_hf, monkeypatch):
    _prefill_past_the_cache_end(tiny_hf, monkeypatch, "pallas_triton")


@on_gpu
def test_gpu_chain_attention_in_a_bf16_prefill(tiny_hf, monkeypatch):
    """A bf16 target's prefill in pieces of 128 (the second and third over a prefix) through the chain op's default
    GPU path, cuDNN's causal attention merged with the prefix kernel, against the same prefill through the tree op:
    the committed caches and GDN states within bf16's bound, and the engine lossless on top of it (AR against an
    oracle DFlash chain)."""
    import jax

    target = load_target(tiny_hf[0], dtype="bfloat16")
    rs = np.random.RandomState(9)
    prompts = [rs.randint(0, 512, size=n).tolist() for n in (300, 150)]
    states = {}
    for impl in ("tree", None):
        if impl:
            monkeypatch.setenv(chain_api.ENV_VAR, impl)
        else:
            monkeypatch.delenv(chain_api.ENV_VAR, raising=False)
        traced = _count_traces(monkeypatch)
        states[impl] = Engine(target, prefill_chunk=128).prefill(prompts, 512)[1]
        assert ("prefix_partials" in traced) == (impl is None), traced
    for a, b in zip(jax.tree.leaves(states[None]), jax.tree.leaves(states["tree"])):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        assert np.abs(a - b).max() <= 1e-2 * max(np.abs(b).max(), 1e-6)
    ar = Engine(target, prefill_chunk=128).generate(prompts, 12).tokens
    block = 5
    out = Engine(target, OracleChain(block, 512, ref=reference(prompts, ar, block)), prefill_chunk=128).generate(
        prompts, 12, seed=1)
    assert out.tokens == ar
