"""Lossless chain speculation through the one engine: greedy output token-identical to AR with every
acceptance length occurring; sampled output distributed as AR's."""

import numpy as np
import pytest

from conftest import make_causal_lm
from convert.hf import load_target
from jaxspec.engine import Engine
from jaxspec.sampling import Sampling
from oracle import OracleChain, OracleTree, reference


@pytest.fixture(scope="module")
def target(tiny_hf):
    return load_target(tiny_hf[0], dtype="float32")


@pytest.mark.parametrize("block", [2, 5, 16])
def test_greedy_chain_is_token_identical_to_ar(target, block):
    rs = np.random.RandomState(block)
    prompts = [rs.randint(0, 512, size=n).tolist() for n in (3, 29, 70, 41, 9, 17, 55, 33)]
    n_new = 8 * block + 8   # enough rounds that every acceptance length occurs
    ar = Engine(target).generate(prompts, n_new)
    ref = reference(prompts, ar.tokens, block)
    spec = Engine(target, OracleChain(block, 512, ref=ref))
    out = spec.generate(prompts, n_new, seed=block, rounds_per_call=7)
    assert out.tokens == ar.tokens
    # Every acceptance length 1..block occurred (histogram over tokens emitted per round).
    assert (out.hist[1:] > 0).all(), out.hist
    assert out.tau > 1.0


def _chi2_exceeds(x, y, vocab):
    """Two-sample chi-square on the joint of the first three tokens (equal sample sizes, cells with
    fewer than 10 counts pooled); True when it exceeds the 99.9% quantile."""
    code = lambda toks: np.array([(t[0] * vocab + t[1]) * vocab + t[2] for t in toks])
    a = np.bincount(code(x), minlength=vocab ** 3)
    b = np.bincount(code(y), minlength=vocab ** 3)
    keep = (a + b) >= 10
    a = np.append(a[keep], a[~keep].sum())
    b = np.append(b[keep], b[~keep].sum())
    nz = (a + b) > 0
    a, b = a[nz], b[nz]
    chi2 = (((a - b) ** 2) / (a + b)).sum()
    dof = len(a) - 1
    z = 3.09  # Wilson-Hilferty approximation of the chi-square quantile
    return chi2 > dof * (1 - 2 / (9 * dof) + z * np.sqrt(2 / (9 * dof))) ** 3


def test_sampled_chain_matches_ar_distribution(tmp_path):
    """Spec with rejection sampling against a random draft distribution vs plain AR sampling, on a
    vocabulary of 6; fixed seeds make the test deterministic."""
    vocab, rows = 6, 3000
    make_causal_lm(tmp_path, seed=5, vocab_size=vocab)
    model = load_target(tmp_path, dtype="float32")
    # Sharpen the random model's near-uniform next-token distributions so that differences show.
    model.lm_head.kernel.set_value(model.lm_head.kernel[...] * 12.0)
    s = Sampling(temperature=1.3, top_k=5, top_p=0.95)
    prompts = [[1, 2, 3, 4]] * rows
    ar = Engine(model, sampling=s).generate(prompts, 3, seed=0).tokens
    sp = Engine(model, OracleChain(4, vocab), sampling=s).generate(prompts, 3, seed=1)
    assert not _chi2_exceeds(ar, sp.tokens, vocab)
    assert sp.tau > 1.2    # drafts were accepted, so both the accept and the residual paths ran
    # The test has power: a different temperature is detected.
    other = Engine(model, sampling=Sampling(temperature=0.7, top_k=5, top_p=0.95)).generate(prompts, 3, seed=2)
    assert _chi2_exceeds(ar, other.tokens, vocab)


@pytest.mark.parametrize("budget,depth", [(1, 4), (6, 3), (24, 7)])
def test_greedy_tree_is_token_identical_to_ar(target, budget, depth):
    """DDTree trees through the same engine: token-identical to AR, with sibling branches accepted."""
    rs = np.random.RandomState(100 + budget)
    prompts = [rs.randint(0, 512, size=n).tolist() for n in (3, 29, 70, 41, 9, 17)]
    n_new = 48
    ar = Engine(target).generate(prompts, n_new)
    ref = reference(prompts, ar.tokens, depth + 1)
    out = Engine(target, OracleTree(depth, budget, 512, ref)).generate(prompts, n_new, seed=budget, rounds_per_call=5)
    assert out.tokens == ar.tokens
    off_spine = int(np.asarray(out.final.draft["off_spine"]).sum())
    if budget == 1:
        assert off_spine == 0           # a one-node tree is the spine
    else:
        assert off_spine > 0, "no sibling branch was ever accepted"
    assert out.tau > 1.0 and out.hist[1:depth + 2].sum() == out.hist.sum()
