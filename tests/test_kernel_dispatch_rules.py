"""How each kernel op of pallas_kernels picks what runs, and what it refuses before running anything.

An op runs an explicit `implementation=`, else the one its JAXSPEC_* flag names (an empty flag is an unset one),
else its default: the jnp form here on the CPU. Under `dispatch.differentiable()` (the trainer's step) a kernel that
the flag or the GPU default would pick gives way to the op's own jnp form ("xla" for the tree delta rule, the tree op
for chain attention), an explicit choice does not, and the choice is back to normal once the block is left.
"pallas_triton" runs the compiled kernel, "pallas_interpret" the same kernel under the CPU interpreter, and chain
attention's "pallas_cudnn" cuDNN's causal attention for the block with the compiled prefix kernel. The compiled
kernels cannot run on this CPU: where a test asks for one, the op's kernel entry point is replaced by a stand-in
that computes the op's spec (its reference) and notes whether it was asked to interpret.

Also pinned: the tree delta rule's CPU default is the xla solver (no triangular solve); the skinny matmul counts
every leading dim of x as a row; a forced kernel at head dims it does not take is refused, not swapped; empty chain
blocks run no kernel; and arguments off an op's contract (no kv heads, a scalar x, a chain's v unlike its k, a
choice_partial without a per-slice form or with tuning for the jnp twin) are refused by name.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import dispatch
from pallas_kernels.add_rms_norm import api as add_rms_norm
from pallas_kernels.chain_attention import api as chain
from pallas_kernels.chain_attention import cudnn
from pallas_kernels.chain_attention import reference as chain_reference
from pallas_kernels.gdn_decode import api as gdn_decode
from pallas_kernels.gdn_decode import arg_specs as gdn_decode_specs
from pallas_kernels.gdn_tree_inputs import api as gdn_tree_inputs
from pallas_kernels.gdn_tree_inputs import arg_specs as tree_inputs_specs
from pallas_kernels.nucleus_mass import api as nucleus_mass
from pallas_kernels.skinny_matmul import api as skinny
from pallas_kernels.tree_attention import api as tree_attention
from pallas_kernels.tree_attention import pallas_triton as tree_attention_kernel
from pallas_kernels.tree_attention.arg_specs import Spec as AttentionSpec
from pallas_kernels.tree_attention.arg_specs import make_inputs as attention_inputs
from pallas_kernels.tree_delta_rule import api as tree_delta_rule
from pallas_kernels.tree_delta_rule import xla as delta_rule_xla
from pallas_kernels.tree_delta_rule.arg_specs import Spec as DeltaSpec
from pallas_kernels.tree_delta_rule.arg_specs import make_inputs as delta_inputs
from pallas_kernels.verify import api as verify
from pallas_kernels.verify import pallas_triton as verify_kernel

APIS = (add_rms_norm, chain, gdn_decode, gdn_tree_inputs, nucleus_mass, skinny, tree_attention, tree_delta_rule,
        verify)


@pytest.fixture
def no_flags(monkeypatch):
    """No JAXSPEC_* variable set: each test sets the ones it reads."""
    for k in dispatch.FLAGS:
        monkeypatch.delenv(k, raising=False)
    return monkeypatch


def stand_in(monkeypatch, module, name, spec):
    """Replace the kernel `module.name` by `spec` (same arguments, no kernel options); returns the list of each
    call's `interpret` (False when not passed: the compiled kernel)."""
    calls = []

    def kernel(*args, interpret=False, **kw):
        calls.append(interpret)
        return spec(*args, **kw)

    monkeypatch.setattr(module, name, kernel)
    return calls


def rel_err(x, ref):
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    return float(np.abs(x - ref).max() / np.abs(ref).max())


# ---------------------------------------------------------------------------------------------- flags and choices

def test_an_empty_flag_is_an_unset_one(no_flags):
    """`FLAG=` (set but empty, as a shell's `export FLAG=` leaves it) chooses nothing: it passes the flag check and
    every op takes its default."""
    defaults = {api.ENV_VAR: api.resolve(*_block(api)) for api in APIS}
    assert set(defaults.values()) == {"reference", "xla", "tree"}
    for flag in dispatch.CHOICE_FLAGS:
        no_flags.setenv(flag, "")
    dispatch.check_flags()
    dispatch.check_gpu_flags(backend="cpu")
    assert {api.ENV_VAR: api.resolve(*_block(api)) for api in APIS} == defaults


def _chain_shapes(n=8):
    S = jax.ShapeDtypeStruct
    return S((1, n, 4, 16), jnp.float32), S((1, 40, 2, 16), jnp.bfloat16)


def _block(api):
    """What an op's `resolve` is told of the block besides the implementation."""
    return {chain: _chain_shapes(), tree_delta_rule: (16,), gdn_tree_inputs: (16, 128, 128)}.get(api, ())


@pytest.mark.parametrize("api", APIS, ids=lambda a: a.ENV_VAR)
def test_an_unknown_implementation_is_refused_whatever_the_flag(api, no_flags):
    """An explicit name the op does not have is refused naming the argument and the op's implementations, also
    where the flag holds a name the op has."""
    for flag in (None, "reference"):
        if flag:
            no_flags.setenv(api.ENV_VAR, flag)
        with pytest.raises(ValueError, match=f"^implementation='triton': expected one of "
                                             f"{', '.join(api.IMPLEMENTATIONS)}$"):
            api.resolve(*_block(api), implementation="triton")


def test_differentiable_swaps_only_the_kernels_the_flag_or_the_default_picks(no_flags):
    """Inside `differentiable()`: the flag's kernel gives way to the op's jnp form (the tree delta rule's is the xla
    solver, chain attention's the tree op), so does a GPU default; an explicit kernel stays; a jnp flag is kept."""
    no_flags.setenv(tree_attention.ENV_VAR, "pallas_interpret")
    no_flags.setenv(tree_delta_rule.ENV_VAR, "pallas_interpret")
    no_flags.setenv(chain.ENV_VAR, "pallas_interpret")
    no_flags.setenv(verify.ENV_VAR, "xla")
    with dispatch.differentiable():
        assert tree_attention.resolve() == "reference"
        assert tree_delta_rule.resolve(16) == "xla"
        assert chain.resolve(*_chain_shapes()) == "tree"
        assert verify.resolve() == "xla"
        assert tree_attention.resolve("pallas_interpret") == "pallas_interpret"
        assert tree_attention.resolve("pallas_triton") == "pallas_triton"
        assert tree_delta_rule.resolve(16, "pallas_triton") == "pallas_triton"
        assert chain.resolve(*_chain_shapes(), implementation="pallas_interpret") == "pallas_interpret"
    for api in (tree_attention, tree_delta_rule, chain, verify):
        no_flags.delenv(api.ENV_VAR)
    no_flags.setattr(jax, "default_backend", lambda: "gpu")
    assert tree_delta_rule.resolve(16) == verify.resolve() == "pallas_triton"
    assert chain.resolve(*_chain_shapes(chain.MIN_NODES)) == "pallas_cudnn"
    with dispatch.differentiable():
        assert tree_delta_rule.resolve(16) == "xla"
        assert (verify.resolve(), nucleus_mass.resolve(), gdn_decode.resolve()) == ("reference",) * 3
        assert gdn_tree_inputs.resolve(16, 128, 128) == "reference"
        assert chain.resolve(*_chain_shapes(chain.MIN_NODES)) == "tree"


def test_differentiable_ends_with_its_block(no_flags):
    """Leaving the block, normally or by an exception, gives the flag's kernel back; nested blocks end with the
    outer one."""
    no_flags.setenv(tree_delta_rule.ENV_VAR, "pallas_interpret")
    with dispatch.differentiable():
        with dispatch.differentiable():
            assert tree_delta_rule.resolve(16) == "xla"
        assert tree_delta_rule.resolve(16) == "xla"
    assert tree_delta_rule.resolve(16) == "pallas_interpret"
    with pytest.raises(RuntimeError, match="inside"):
        with dispatch.differentiable():
            raise RuntimeError("inside")
    assert tree_delta_rule.resolve(16) == "pallas_interpret"


# ---------------------------------------------------------------------------------------------- what runs

def _tree_attention(seed, impl):
    args = attention_inputs(seed, AttentionSpec(2, 5, 20, 4, 2, 16))
    return tree_attention.tree_attention(*args, implementation=impl)


def _tree_delta_rule(seed, impl):
    args, _ = delta_inputs(seed, DeltaSpec(2, 5, 4, 16, 16, "tree", key_heads=2))
    return tree_delta_rule.tree_delta_rule(*args, implementation=impl)


def _gdn_decode(seed, impl):
    args = gdn_decode_specs.make_inputs(seed, 2, 2, 2, 16, 16, 4)
    return gdn_decode.gdn_decode(*args, eps=1e-6, implementation=impl)


def _gdn_tree_inputs(seed, impl):
    args = tree_inputs_specs.make_inputs(seed, tree_inputs_specs.random_parents(seed, 2, 5), hk=2, rep=2, dk=16,
                                         dv=16, kw=4)
    return gdn_tree_inputs.gdn_tree_inputs(*args, dk=16, dv=16, implementation=impl)


def _skinny(seed, impl):
    r = np.random.default_rng(seed)
    x, w = jnp.asarray(r.standard_normal((2, 3, 64)), jnp.float32), jnp.asarray(r.standard_normal((64, 128)),
                                                                               jnp.float32)
    return skinny.matmul(x, w, implementation=impl)


def _add_rms_norm(seed, impl):
    r = np.random.default_rng(seed)
    x, u = (jnp.asarray(r.standard_normal((3, 64)), jnp.float32) for _ in range(2))
    w = jnp.asarray(r.standard_normal(64), jnp.float32)
    return add_rms_norm.add_rms_norm(x, u, w, eps=1e-6, offset=1.0, implementation=impl)


def _nucleus(seed, impl):
    r = np.random.default_rng(seed)
    from pallas_kernels.nucleus_mass import reference
    x = jnp.asarray(r.standard_normal((2, 3, 100)), jnp.float32)
    key = reference.ordered_key(x)
    t = jnp.asarray(np.asarray(key)[..., r.integers(0, 100, 5)])
    return nucleus_mass.mass_above(key, jnp.exp(x), t, implementation=impl)


def _verify(seed, impl):
    x = 3.0 * jax.random.normal(jax.random.key(seed), (2, 3, 300))
    return verify.target_choice(None, x, 0.0, implementation=impl)


def _kernels():
    from pallas_kernels.add_rms_norm import pallas_triton as arn, reference as arn_ref
    from pallas_kernels.gdn_decode import pallas_triton as gd, reference as gd_ref
    from pallas_kernels.gdn_tree_inputs import pallas_triton as gti, reference as gti_ref
    from pallas_kernels.nucleus_mass import pallas_triton as nm, reference as nm_ref
    from pallas_kernels.skinny_matmul import pallas_triton as sm, reference as sm_ref
    from pallas_kernels.tree_attention import reference as ta_ref
    from pallas_kernels.tree_delta_rule import pallas_triton as tdr, reference as tdr_ref
    from pallas_kernels.verify import reference as ve_ref
    return {
        "tree_attention": (_tree_attention, tree_attention_kernel, "tree_attention", ta_ref.tree_attention),
        "tree_delta_rule": (_tree_delta_rule, tdr, "tree_delta_rule", tdr_ref.tree_delta_rule),
        "gdn_decode": (_gdn_decode, gd, "gdn_decode", gd_ref.gdn_decode),
        "gdn_tree_inputs": (_gdn_tree_inputs, gti, "gdn_tree_inputs", gti_ref.gdn_tree_inputs),
        "skinny_matmul": (_skinny, sm, "matmul", sm_ref.matmul),
        "add_rms_norm": (_add_rms_norm, arn, "add_rms_norm", arn_ref.add_rms_norm),
        "nucleus_mass": (_nucleus, nm, "mass_above", nm_ref.mass_above),
        "verify": (_verify, verify_kernel, "gumbel_partial", ve_ref.gumbel_partial),
    }


@pytest.mark.parametrize("op", sorted(_kernels()))
def test_pallas_triton_compiles_and_pallas_interpret_interprets(op, seed, monkeypatch):
    """Each op sends "pallas_triton" to its kernel compiled and "pallas_interpret" to it interpreted, once per call,
    and returns what the kernel gives (here the spec, from the stand-in), as its reference does."""
    call, module, name, spec = _kernels()[op]
    want = call(seed, "reference")
    calls = stand_in(monkeypatch, module, name, spec)
    for impl, interpret in (("pallas_triton", False), ("pallas_interpret", True)):
        calls.clear()
        got = call(seed, impl)
        assert calls == [interpret], (impl, calls)
        for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            assert g.shape == w.shape and g.dtype == w.dtype, (impl, g.shape, w.shape, g.dtype, w.dtype)
            np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(w, np.float64), rtol=1e-5, atol=1e-5)


def test_chain_attention_cudnn_split_runs_cudnn_and_the_compiled_prefix_kernel(seed, monkeypatch):
    """"pallas_cudnn": the block's causal attention by cuDNN and the prefix by the compiled prefix kernel (here
    cuDNN's stand-in is the jnp twin, the prefix kernel interpreted); "pallas_interpret": the jnp block, the prefix
    kernel interpreted. Both give the spec."""
    block, prefix = [], []
    monkeypatch.setattr(cudnn, "self_attention", lambda *a: block.append(1) or chain_reference.self_attention(*a))
    partials = tree_attention_kernel.prefix_partials

    def prefix_kernel(*args, interpret=False, **kw):
        prefix.append(interpret)
        return partials(*args, interpret=True, **kw)

    monkeypatch.setattr(tree_attention_kernel, "prefix_partials", prefix_kernel)
    q, keys, values, _, _ = attention_inputs(seed, AttentionSpec(2, 6, 30, 4, 2, 16, shape="chain"))
    start = jnp.asarray([30, 11], jnp.int32)
    slots = start[:, None] + jnp.arange(6)
    k, v = keys[jnp.arange(2)[:, None], slots], values[jnp.arange(2)[:, None], slots]
    want = chain_reference.chain_attention(q, k, v, keys, values, start)
    for impl, cudnn_calls, interpret in (("pallas_cudnn", [1], False), ("pallas_interpret", [], True)):
        block.clear()
        prefix.clear()
        got = chain.chain_attention(q, k, v, keys, values, start, implementation=impl)
        assert block == cudnn_calls and prefix == [interpret], (impl, block, prefix)
        assert rel_err(got, want) < 1e-4, impl


@pytest.mark.parametrize("impl", ["pallas_cudnn", "pallas_interpret", "tree"])
@pytest.mark.parametrize("batch,n", [(0, 4), (2, 0)])
def test_an_empty_chain_block_runs_no_kernel(seed, batch, n, impl):
    """No sequence or no node: the empty [B, N, H, hd] in the values' dtype, whatever the implementation; forcing
    cuDNN's split (which cannot run here) on an empty block reaches neither cuDNN nor the prefix kernel."""
    q, keys, values, _, _ = attention_inputs(seed, AttentionSpec(2, 4, 20, 4, 2, 16, shape="chain"))
    q, keys, values = q[:batch, :n], keys[:batch], values[:batch].astype(jnp.bfloat16)
    start = jnp.asarray([20, 7][:batch], jnp.int32)
    k = keys[:, :n]
    out = chain.chain_attention(q, k, k, keys, values, start, implementation=impl)
    assert out.shape == (batch, n, 4, 16) and out.dtype == jnp.bfloat16


def test_tree_delta_rule_off_the_gpu_runs_the_xla_solver(seed, no_flags):
    """With no flag the CPU runs the xla solver (recursive doubling, no triangular solve); "reference" runs the spec's
    solve_triangular instead, and "xla" by name the xla solver."""
    calls = []
    solver = delta_rule_xla.tree_delta_rule
    no_flags.setattr(delta_rule_xla, "tree_delta_rule", lambda *a: calls.append(a[0].shape) or solver(*a))
    args, _ = delta_inputs(seed, DeltaSpec(2, 5, 4, 16, 16, "tree", key_heads=2))
    out = tree_delta_rule.tree_delta_rule(*args)
    assert calls == [(2, 5, 2, 16)]
    ref = tree_delta_rule.tree_delta_rule(*args, implementation="reference")
    assert calls == [(2, 5, 2, 16)]
    tree_delta_rule.tree_delta_rule(*args, implementation="xla")
    assert len(calls) == 2
    for a, b in zip(out, ref):
        assert rel_err(a, b) < 1e-4


def test_a_named_kernel_is_refused_at_head_dims_it_does_not_take(seed, no_flags):
    """gdn_tree_inputs at Dk = 8: the flag's kernel falls back to the reference, a kernel named by argument is
    refused by the kernel, naming the head dims (as gdn_decode does)."""
    from pallas_kernels.gdn_tree_inputs import reference
    args = tree_inputs_specs.make_inputs(seed, tree_inputs_specs.random_parents(seed, 1, 6), hk=2, rep=3, dk=8,
                                         dv=16, kw=4)
    want = reference.gdn_tree_inputs(*args, dk=8, dv=16)
    no_flags.setenv(gdn_tree_inputs.ENV_VAR, "pallas_interpret")
    for a, b in zip(gdn_tree_inputs.gdn_tree_inputs(*args, dk=8, dv=16), want):
        np.testing.assert_array_equal(a, b)
    no_flags.delenv(gdn_tree_inputs.ENV_VAR)
    assert gdn_tree_inputs.resolve(6, 8, 16, "pallas_triton") == "pallas_triton"
    with pytest.raises(ValueError, match="Dk=8"):
        gdn_tree_inputs.gdn_tree_inputs(*args, dk=8, dv=16, implementation="pallas_interpret")


def test_skinny_matmul_counts_every_leading_dim_as_a_row():
    """The kernel takes 2..128 rows of x [..., K], all leading dims together: [3, 50, K] is 150 rows (XLA's dot),
    [1, 2, K] two rows and [2, 64, K] 128 (the kernel)."""
    assert not skinny.applies((3, 50, 64), (64, 128))
    assert not skinny.applies((1, 1, 1, 64), (64, 128))
    assert skinny.applies((1, 2, 64), (64, 128)) and skinny.applies((2, 64, 64), (64, 128))
    assert not skinny.applies((2, 65, 64), (64, 128))


# ---------------------------------------------------------------------------------------------- refusals

def test_tree_attention_refuses_keys_without_kv_heads(seed):
    q, keys, values, start, anc = attention_inputs(seed, AttentionSpec(1, 3, 10, 2, 1, 16))
    for impl in ("reference", "pallas_interpret"):
        with pytest.raises(ValueError, match=r"^tree_attention: the 2 query heads of q \(1, 3, 2, 16\) must be a "
                                             r"multiple of the 0 kv heads"):
            tree_attention.tree_attention(q, keys[:, :, :0], values[:, :, :0], start, anc, implementation=impl)


def test_chain_attention_refuses_block_values_unlike_its_keys(seed):
    q, keys, values, start, _ = attention_inputs(seed, AttentionSpec(1, 4, 20, 4, 2, 16, shape="chain"))
    k = keys[:, :4]
    for v in (k[:, :3], k[..., :8], k[:, :, :1]):
        for impl in ("reference", "tree", "pallas_interpret"):
            with pytest.raises(ValueError, match=rf"^chain_attention: k \(1, 4, 2, 16\) and v "
                                                 rf"\({', '.join(map(str, v.shape))}\) must be"):
                chain.chain_attention(q, k, v, keys, values, start, implementation=impl)


@pytest.mark.parametrize("impl", ["reference", "pallas_interpret"])
def test_add_rms_norm_refuses_a_scalar(impl):
    x = jnp.asarray(np.random.default_rng(3).standard_normal(()), jnp.float32)
    with pytest.raises(ValueError, match=r"^add_rms_norm: x \(\) must be \[\.\.\., D\]$"):
        add_rms_norm.add_rms_norm(x, x, x, eps=1e-6, offset=1.0, implementation=impl)


def test_choice_partial_refuses_what_has_no_per_slice_form(seed):
    """choice_partial (one shard of a vocabulary) has no "reference" form (its jax.random bits are per whole row),
    takes [R, V] slices only, and its kernel tuning does not apply to the jnp twin "xla"."""
    x = 3.0 * jax.random.normal(jax.random.key(seed), (3, 200))
    key = jax.random.key(seed + 1)
    with pytest.raises(ValueError, match=r"^choice_partial: 'reference' \(jax.random\) has no per-slice form"):
        verify.choice_partial(key, x, 0.7, implementation="reference")
    for impl in ("xla", "pallas_interpret"):
        with pytest.raises(ValueError, match=r"^choice_partial: logits \(3, 1, 200\) must be \[R, V\]$"):
            verify.choice_partial(key, x[:, None], 0.7, implementation=impl)
    with pytest.raises(ValueError, match=r"^choice_partial: \['block_v'\] tune the kernel; implementation 'xla' has "
                                         r"none$"):
        verify.choice_partial(key, x, 0.7, implementation="xla", block_v=64)


def test_combining_slices_where_none_saw_a_column_gives_token_0(seed):
    """`verify.combine`: the first best over slices in column order; a row whose slices saw no column (index NONE)
    gives 0, not the sentinel."""
    none = verify_kernel.NONE
    r = np.random.default_rng(seed)
    a, b = (float(x) for x in r.standard_normal(2))
    val = jnp.asarray([[-jnp.inf, -jnp.inf], [a, max(a, b) + 1.0], [b, b]], jnp.float32)
    idx = jnp.asarray([[none, none], [3, 70], [5, 90]], jnp.int32)
    assert verify.combine(val, idx).tolist() == [0, 70, 5]


def test_tree_attention_refuses_a_float_ancestor_mask_on_every_path(seed):
    """anc is [B, N, N] bool (integer 0 / 1 also runs on both paths): a float mask is refused naming anc, as the tree
    delta rule refuses one, rather than thresholded by the kernel (the GPU default) and a TypeError in the
    reference (the CPU default)."""
    q, keys, values, start, anc = attention_inputs(seed, AttentionSpec(2, 5, 20, 4, 2, 16))
    for impl in ("reference", "pallas_interpret"):
        with pytest.raises(ValueError, match=r"^tree_attention: anc \(2, 5, 5\) float32"):
            tree_attention.tree_attention(q, keys, values, start, anc.astype(jnp.float32), implementation=impl)


def test_tree_attention_takes_an_integer_ancestor_mask_as_the_bool_one(seed):
    """An integer 0 / 1 anc is the bool mask: the same output on the reference and the interpreted kernel."""
    q, keys, values, start, anc = attention_inputs(seed, AttentionSpec(2, 5, 20, 4, 2, 16))
    for impl in ("reference", "pallas_interpret"):
        want = tree_attention.tree_attention(q, keys, values, start, anc, implementation=impl)
        got = tree_attention.tree_attention(q, keys, values, start, anc.astype(jnp.int32), implementation=impl)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
