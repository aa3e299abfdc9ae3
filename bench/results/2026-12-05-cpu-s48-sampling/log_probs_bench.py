"""log_probs at the real vocabulary on this CPU: session 47's (sort-based) against session 48's (sort-free)."""
import importlib.util, json, sys, time, datetime, platform, subprocess
import jax, jax.numpy as jnp, numpy as np
from jaxspec.sampling import Sampling, log_probs as new
spec = importlib.util.spec_from_file_location("sampling_old", sys.argv[2])
old_mod = importlib.util.module_from_spec(spec); sys.modules["sampling_old"] = old_mod; spec.loader.exec_module(old_mod)
old = old_mod.log_probs
V = 248320
res = dict(commit=subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
           old_commit="9b0daea", machine=platform.processor() or platform.machine(), cpus=jax.device_count(),
           date=datetime.datetime.now(datetime.timezone.utc).isoformat(), vocab=V, rows={})
for rows in (1, 16, 64):
    x = jax.random.normal(jax.random.key(rows), (rows, V)) * 3
    for s in (Sampling(0.6, 20, 0.95), Sampling(0.7, 0, 0.9), Sampling(1.0, 20)):
        out = {}
        for name, f in (("before", old), ("after", new)):
            g = jax.jit(lambda x: f(x, s))
            r = g(x).block_until_ready()
            ts = []
            for _ in range(5):
                t = time.perf_counter(); g(x).block_until_ready(); ts.append(time.perf_counter() - t)
            out[name] = dict(median_ms=1e3 * float(np.median(ts)), kept=int(np.isfinite(np.asarray(r)).sum()))
        assert out["before"]["kept"] == out["after"]["kept"], out
        res["rows"].setdefault(str(rows), {})[str(s)] = out
        print(rows, s, {k: round(v["median_ms"], 2) for k, v in out.items()}, "kept", out["after"]["kept"], flush=True)
json.dump(res, open(sys.argv[1], "w"), indent=1)
