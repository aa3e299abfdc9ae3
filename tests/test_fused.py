"""The fused projection layout (jaxspec/model.py `FUSED`): one kernel per layer input, split back exactly into the
checkpoint's kernels, and split by tensor parallelism into the fused kernels of the parts' shards."""

import numpy as np
import pytest

from jaxspec.config import FULL, LINEAR, TargetConfig
from jaxspec.model import FUSED, fuse_kernels, fuse_params, part_widths, split_columns, split_params


def config(**kw) -> TargetConfig:
    base = dict(vocab_size=97, hidden_size=24, intermediate_size=40, layer_types=(LINEAR, FULL), num_heads=6,
                num_kv_heads=2, head_dim=8, rotary_dim=4, rope_theta=1e4, linear_num_key_heads=2,
                linear_num_value_heads=6, linear_key_head_dim=4, linear_value_head_dim=5, conv_kernel=4,
                dtype="float32")
    base.update(kw)
    return TargetConfig(**base)


def parts_of(cfg, fused, rs):
    return [rs.standard_normal((cfg.hidden_size, w)).astype(np.float32) for w in part_widths(cfg, fused)]


@pytest.mark.parametrize("fused", sorted(FUSED))
def test_split_inverts_fuse_and_products_agree(fused):
    cfg, rs = config(), np.random.RandomState(0)
    parts = parts_of(cfg, fused, rs)
    kernel = fuse_kernels(cfg, fused, parts)
    assert kernel.shape == (cfg.hidden_size, sum(part_widths(cfg, fused)))
    for got, want in zip(split_columns(cfg, fused, kernel), parts):
        np.testing.assert_array_equal(got, want)
    x = rs.standard_normal((3, 2, cfg.hidden_size)).astype(np.float32)
    for got, want in zip(split_columns(cfg, fused, x @ kernel), parts):
        np.testing.assert_array_equal(got, x @ want)        # each output column is one column's product


@pytest.mark.parametrize("fused,tp", [("gate_up_proj", 2), ("gate_up_proj", 5), ("qkv_proj", 2), ("in_proj", 2)])
def test_a_contiguous_shard_is_the_fused_kernel_of_the_parts_shards(fused, tp):
    """What tensor parallelism relies on: shard s of the fused kernel (columns split tp ways) equals the fused
    kernel, at the shard's config, of shard s of every part (each part's columns split tp ways)."""
    cfg, rs = config(), np.random.RandomState(1)
    parts = parts_of(cfg, fused, rs)
    kernel = fuse_kernels(cfg, fused, parts)
    split = lambda n: n // tp if n % tp == 0 else n          # the fields this kernel's groups do not involve stay
    shard_cfg = cfg.replace(**{f: split(getattr(cfg, f)) for f in (
        "intermediate_size", "num_heads", "num_kv_heads", "linear_num_key_heads", "linear_num_value_heads")})
    for s, block in enumerate(np.split(kernel, tp, axis=1)):
        want = fuse_kernels(shard_cfg, fused, [np.split(p, tp, axis=1)[s] for p in parts])
        np.testing.assert_array_equal(block, want)


def test_fuse_params_and_split_params_round_trip_by_path():
    cfg, rs = config(), np.random.RandomState(2)
    values = {("embed_tokens",): rs.standard_normal((97, 24))}
    for fused in FUSED:
        for name, p in zip(FUSED[fused], parts_of(cfg, fused, rs)):
            values[("layers", 0, "x", name, "kernel")] = p
    fused = fuse_params(cfg, dict(values))
    assert sorted(map(str, fused)) == sorted(map(str, [("embed_tokens",)] + [("layers", 0, "x", f, "kernel")
                                                                            for f in FUSED]))
    back = split_params(cfg, fused)
    assert set(back) == set(values)
    for p, v in values.items():
        np.testing.assert_array_equal(back[p], v)


def test_an_incomplete_group_is_an_error():
    cfg = config()
    with pytest.raises(KeyError, match="gate_up_proj"):
        fuse_params(cfg, {("layers", 0, "mlp", "gate_proj", "kernel"): np.zeros((24, 40), np.float32)})
