"""states_at at the real GDN commit shape (48 layers, 48 value heads over 16 key heads, Dk = Dv = 128, fp32),
after a DDTree(64) verify (65 nodes) with an accepted path of 6 nodes: over all 65 nodes (anc_row mask) against
over the path's first 16 slots (`nodes`, the tree's depth bound). Same result; time per call on this machine."""
import json, sys, time
import jax, jax.numpy as jnp, numpy as np
from pallas_kernels.tree_delta_rule.reference import states_at

L, B, N, H, HK, D, P = 48, 1, 65, 48, 16, 128, 16
r = np.random.default_rng(0)
s0s = [jnp.asarray(r.normal(size=(B, H, D, D)), jnp.float32) for _ in range(L)]
ks = [jnp.asarray(r.normal(size=(B, N, HK, D)) / 11, jnp.float32) for _ in range(L)]
ds = [jnp.asarray(r.normal(size=(B, N, H, D)), jnp.float32) for _ in range(L)]
Gs = [jnp.asarray(-np.cumsum(r.uniform(0, .1, (B, N, H)), 1), jnp.float32) for _ in range(L)]
path = np.array([[0, 3, 9, 20, 41, 60] + [0] * (P - 6)], np.int32)
anc = np.zeros((B, N), bool); anc[0, path[0, :6]] = True
gl = [g[:, path[0, 5]] for g in Gs]
full = jax.jit(lambda a, b, c, d, e, f: states_at(a, b, c, d, e, f, rep=H // HK))
part = jax.jit(lambda a, b, c, d, e, f, nodes: states_at(a, b, c, d, e, f, rep=H // HK, nodes=nodes))
on = jnp.arange(P)[None] < 6
args_f = (s0s, ks, ds, Gs, jnp.asarray(anc), gl)
args_p = (s0s, ks, ds, Gs, on, gl, jnp.asarray(path))
res = {}
for name, f, a in (("all 65 nodes", full, args_f), ("path slots (16)", part, args_p)):
    out = jax.block_until_ready(f(*a))
    ts = []
    for _ in range(7):
        t = time.perf_counter(); jax.block_until_ready(f(*a)); ts.append(time.perf_counter() - t)
    res[name] = dict(median_ms=float(np.median(ts)) * 1e3, min_ms=float(min(ts)) * 1e3)
    res.setdefault("_outs", []).append(out)
o1, o2 = res.pop("_outs")
res["max_rel_diff"] = max(float(jnp.max(jnp.abs(x - y)) / jnp.max(jnp.abs(x))) for x, y in zip(o1, o2))
res["device"] = jax.devices()[0].device_kind
print(json.dumps(res, indent=1))
