"""The projections of Qwen3.6-27B (K, N of each Linear a verify runs), shared by the tests and the bench."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

# name: (K, N, layers that have it). hidden 5120, MLP 17408; attention: 24 q heads (+ gate) and 4 kv heads
# of 256; GDN: q, k 16 heads of 128, v and z 48 heads of 128 (in_proj_a / _b, 48 wide, stay with XLA).
REAL = {
    "mlp.gate_proj": (5120, 17408, 64), "mlp.up_proj": (5120, 17408, 64), "mlp.down_proj": (17408, 5120, 64),
    "gdn.in_proj_qkv": (5120, 10240, 48), "gdn.in_proj_z": (5120, 6144, 48), "gdn.out_proj": (6144, 5120, 48),
    "attn.q_proj": (5120, 12288, 16), "attn.k_proj": (5120, 1024, 16), "attn.v_proj": (5120, 1024, 16),
    "attn.o_proj": (6144, 5120, 16),
}
# The products the model runs since the projections were fused (jaxspec/model.py FUSED, session 37): one per layer
# input. gdn.in_proj's N (qkv | z | b | a = 16480) is not a multiple of 64: XLA's dot takes it.
FUSED = {
    "mlp.gate_up_proj": (5120, 2 * 17408, 64), "attn.qkv_proj": (5120, 12288 + 2 * 1024, 16),
    "gdn.in_proj": (5120, 10240 + 6144 + 2 * 48, 48),
}
ROWS = (16, 65)     # a DFlash block; a DDTree(64) tree with its root


def make_inputs(seed: int, m: int, k: int, n: int, dtype=jnp.float32):
    """Fresh random x [m, k] ~ N(0, 1) and w [k, n] ~ N(0, 1/k) (outputs O(1)); never zeros."""
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((m, k)), jnp.float32).astype(dtype)
    w = jnp.asarray(rng.standard_normal((k, n)) / np.sqrt(k), jnp.float32).astype(dtype)
    return x, w
