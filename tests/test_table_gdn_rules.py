"""bench.table's GDN kernel parts (gdn_decode, gdn_tree_inputs, gdn_commit) and the numbers their benches report:
which JSON each part is read from, the CPU-sized flags, the rows compose keeps, the layer benches' per-layer times,
rates and errors (bench.harness.layer_bench, pallas_kernels.gdn_decode.bench), and gdn_commit.bench's rows."""

import itertools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bench import harness, profile, table

GDN_PARTS = ("gdn_decode", "gdn_tree_inputs", "gdn_commit")


def _record_parts(monkeypatch, write):
    """table.run_part replaced: records each part's command and, where `write(name)` gives a JSON, writes it at the
    path the command names after --json (where the part itself would write it)."""
    ran = {}

    def run_part(name, cmd, out, timeout):
        ran[name] = cmd
        data = write(name)
        if data is not None:
            with open(cmd[cmd.index("--json") + 1], "w") as f:
                json.dump(data, f)
        return dict(command=["python", "-m", *cmd], rc=0, seconds=0.0)
    monkeypatch.setattr(table, "run_part", run_part)
    return ran


def test_each_gdn_part_is_read_from_the_json_it_wrote(tmp_path, monkeypatch):
    """The three GDN parts write three distinct files, and each part's rows in the table come from its own file:
    a device time of 1, 2 and 3 us marks which part a row came from."""
    rng = np.random.default_rng()
    rate = float(rng.uniform(1e11, 1e12))
    jsons = dict(
        gdn_decode={"rows": [{"impl": "reference", "device_us_per_layer": 1.0, "device_bytes_per_s": rate}]},
        gdn_tree_inputs={"rows": [{"n": 16, "impl": "reference", "device_us_per_layer": 2.0,
                                   "device_bytes_per_s": rate}]},
        gdn_commit={"rows": [{"path": 16, "impl": "pallas_triton", "layers": 4, "device_us": 3.0,
                              "device_bytes_per_s": rate}]})
    ran = _record_parts(monkeypatch, jsons.get)
    table.main(["--contexts", "64", "--budget", "15", "--parts", ",".join(GDN_PARTS), "--out", str(tmp_path)])
    assert len({ran[p][ran[p].index("--json") + 1] for p in GDN_PARTS}) == 3
    rows = {r["row"]: r for r in json.loads((tmp_path / "table.json").read_text())["rows"]}
    assert rows["GDN decode (reference), 1 node, per GDN layer: device time"]["value"] == 1.0
    assert rows["GDN tree inputs (reference), N = 16, per GDN layer: device time"]["value"] == 2.0
    assert rows["GDN commit (pallas_triton), path of 16, all 4 GDN layers: device time"]["value"] == 3.0
    assert rows["GDN commit (pallas_triton), path of 16, all 4 GDN layers: states read and written + path "
                "bytes/s on the device"]["value"] == pytest.approx(rate / 1e12)
    assert len(rows) == 6


def test_the_tiny_config_on_a_gpu_times_the_gdn_kernels_at_their_real_sizes(tmp_path, monkeypatch):
    """--config tiny on a GPU: the GDN benches get no CPU-sized --layers / --iters (those are for a CPU run)."""
    ran = _record_parts(monkeypatch, lambda name: None)
    monkeypatch.setattr(table, "_default_backend", lambda: "gpu")
    table.main(["--contexts", "64", "--prefill", "64", "--parts", "delta_rule," + ",".join(GDN_PARTS),
                "--out", str(tmp_path)])
    for name in ("delta_rule", "gdn_decode", "gdn_tree_inputs"):
        assert "--layers" not in ran[name], ran[name]
    assert "--iters" not in ran["gdn_commit"], ran["gdn_commit"]
    monkeypatch.setattr(table, "_default_backend", lambda: "cpu")
    table.main(["--contexts", "64", "--prefill", "64", "--parts", ",".join(GDN_PARTS), "--out", str(tmp_path)])
    assert "--layers" in ran["gdn_decode"] and "--iters" in ran["gdn_commit"]


def test_compose_keeps_only_gdn_rows_with_a_device_rate_and_labels_each_size():
    """A row without device_bytes_per_s (an older bench's JSON) gives no table row, even as the kernel's: the rows
    that have one are shown. The tree inputs' rows at two sizes each keep their own N and numbers."""
    rng = np.random.default_rng()
    r16, r65 = (float(x) for x in rng.uniform(1e11, 1e12, 2))
    gdn = dict(
        gdn_commit={"rows": [{"path": 16, "impl": "pallas_triton", "layers": 48, "device_us": 100.0},
                             {"path": 16, "impl": "reference", "layers": 48, "device_us": 300.0,
                              "device_bytes_per_s": 2e11}]},
        gdn_tree_inputs={"rows": [{"n": 16, "impl": "reference", "device_us_per_layer": 5.0, "device_bytes_per_s": r16},
                                  {"n": 65, "impl": "reference", "device_us_per_layer": 9.0,
                                   "device_bytes_per_s": r65}]})
    t = table.compose(None, None, {"copy_bandwidth": {"tb_s": 2.0}}, budget=64, block=16, tau=9.0, real=True, gdn=gdn)
    rows = {r["row"]: r["value"] for r in t["rows"]}
    assert rows == {
        "GDN tree inputs (reference), N = 16, per GDN layer: inputs + outputs bytes/s of copy (copy 2000 GB/s)":
            pytest.approx(r16 / 2e12),
        "GDN tree inputs (reference), N = 16, per GDN layer: device time": 5.0,
        "GDN tree inputs (reference), N = 65, per GDN layer: inputs + outputs bytes/s of copy (copy 2000 GB/s)":
            pytest.approx(r65 / 2e12),
        "GDN tree inputs (reference), N = 65, per GDN layer: device time": 9.0,
        "GDN commit (reference), path of 16, all 48 GDN layers: states read and written + path bytes/s of copy "
        "(copy 2000 GB/s)": pytest.approx(0.1),
        "GDN commit (reference), path of 16, all 48 GDN layers: device time": 300.0}


def _timing(monkeypatch, module, wall_s, device_s, seen=None):
    """module.time_kernel replaced: one call's outputs (recorded in `seen`), the given wall and device times."""
    def fake(run, iters):
        out = jax.block_until_ready(run())
        if seen is not None:
            seen.append(out)
        return dict(out=out, compile_s=0.0, wall_s=wall_s, device_s=device_s)
    monkeypatch.setattr(module, "time_kernel", fake)


def test_layer_bench_links_each_layer_to_the_one_before_and_errs_on_the_last(monkeypatch, tmp_path):
    """Layer i's input is its own plus layer i-1's output (checked against a direct loop); the error is the last
    layer's: "b" agrees with "a" on layer 0 and differs once an input passes 5."""
    seen = []
    _timing(monkeypatch, harness, 3e-3, 1.5e-3, seen)
    rng = np.random.default_rng()
    base = rng.uniform(0.5, 1.0, (3, 2, 4)).astype(np.float32)
    impls = {"a": lambda x: (x * 2.0,), "b": lambda x: (x * 2.0 + jnp.where(x > 5.0, 1.0, 0.0),)}
    stack_for = lambda n, layers: [(jnp.asarray(base[i] + 2.0 * i),) for i in range(layers)]
    link = lambda args, out: (args[0] + out[0],)
    rows = harness.layer_bench(["--sizes", "2", "--layers", "3", "--iters", "1"], "doc", impls, stack_for, link, 3)
    want, out = {}, None
    for name, extra in (("a", 0.0), ("b", 1.0)):
        outs = []
        for i in range(3):
            x = base[i] + 2.0 * i + (0 if out is None else out)
            out = x * 2.0 + np.where(x > 5.0, extra, 0.0)
            outs.append(out)
        want[name], out = outs, None
    for got, name in zip(seen, "ab"):
        assert len(got) == 3
        for g, w in zip(got, want[name]):
            np.testing.assert_allclose(np.asarray(g[0]), w, rtol=1e-6)
    assert np.array_equal(want["a"][0], want["b"][0]) and not np.array_equal(want["a"][2], want["b"][2])
    last = want["a"][2]
    assert rows[1]["rel_err_vs_reference"] == pytest.approx(np.abs(want["b"][2] - last).max() / np.abs(last).max())
    assert rows[0]["rel_err_vs_reference"] == 0.0


def test_layer_bench_times_and_rates_per_layer(monkeypatch):
    """Per layer: the wall time over --layers, the device time over --layers, and the bytes over the device time; a
    device time of 0 (no kernel in the trace) gives no rate (nan), not an error."""
    _timing(monkeypatch, harness, 3e-3, 1.5e-3)
    op = lambda x, w: (x @ w,)
    stack_for = lambda n, layers: [(jnp.full((n, 4), i + 1.0), jnp.eye(4)) for i in range(layers)]
    link = lambda args, out: (args[0] + 1e-3 * out[0],) + args[1:]
    (row,) = harness.layer_bench(["--sizes", "2", "--layers", "3", "--iters", "1"], "doc", {"op": op}, stack_for,
                                 link, 3)
    assert row["us_per_layer"] == pytest.approx(1000.0) and row["device_us_per_layer"] == pytest.approx(500.0)
    assert row["bytes_per_layer"] == (8 + 16 + 8) * 4
    assert row["device_bytes_per_s"] == pytest.approx(row["bytes_per_layer"] / 500e-6)
    _timing(monkeypatch, harness, 3e-3, 0.0)
    (row,) = harness.layer_bench(["--sizes", "2", "--layers", "3", "--iters", "1"], "doc", {"op": op}, stack_for,
                                 link, 3)
    assert np.isnan(row["device_bytes_per_s"]) and row["device_us_per_layer"] == 0.0


def _gdn_decode_on_a_fake_gpu(monkeypatch, calls):
    """gdn_decode.bench as on a GPU: its pallas_triton.gdn_decode replaced by the reference, each call's keyword
    arguments recorded, every layer's outputs but the first doubled (the layer counted by the calls as traced)."""
    from types import SimpleNamespace

    from pallas_kernels.gdn_decode import bench, reference
    count = itertools.count()

    def kernel(*x, **kw):
        calls.append(kw)
        outs = reference.gdn_decode(*x, eps=kw["eps"])
        return outs if next(count) % 2 == 0 else tuple(o * 2 for o in outs)
    monkeypatch.setattr(bench, "pallas_triton", SimpleNamespace(gdn_decode=kernel))
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    return bench


def test_the_gdn_decode_bench_rows_on_a_gpu(monkeypatch, tmp_path):
    """On a GPU: the reference, the kernel at its default warps ("pallas_triton") and on 8; per layer: wall and device
    time over --layers, the bytes over the device time; the error is the last layer's outputs' (doubled: 1.0)."""
    calls = []
    bench = _gdn_decode_on_a_fake_gpu(monkeypatch, calls)
    _timing(monkeypatch, bench, 4e-3, 1e-3)
    bench.main(["--layers", "2", "--iters", "1", "--json", str(tmp_path / "b.json")])
    rows = json.loads((tmp_path / "b.json").read_text())["rows"]
    assert [r["impl"] for r in rows] == ["reference", "pallas_triton", "pallas_triton/w8"]
    assert calls == [dict(eps=1e-6)] * 2 + [dict(eps=1e-6, num_warps=8)] * 2
    for r in rows:
        assert r["us_per_layer"] == pytest.approx(2000.0) and r["device_us_per_layer"] == pytest.approx(500.0)
        assert r["device_bytes_per_s"] == pytest.approx(r["bytes_per_layer"] / 500e-6)
        assert r["bytes_per_s"] == pytest.approx(r["bytes_per_layer"] / 2000e-6)
    assert rows[0]["rel_err_vs_reference"] == 0.0
    assert [r["rel_err_vs_reference"] for r in rows[1:]] == pytest.approx([1.0, 1.0])


def test_the_gdn_decode_bench_without_a_device_time_gives_no_rate(monkeypatch, tmp_path):
    """A device time of 0 (no kernel in the trace): the row's device rate is nan, as in bench.harness.layer_bench."""
    from pallas_kernels.gdn_decode import bench
    _timing(monkeypatch, bench, 4e-3, 0.0)
    bench.main(["--layers", "2", "--iters", "1", "--json", str(tmp_path / "b.json")])
    (row,) = json.loads((tmp_path / "b.json").read_text())["rows"]
    assert np.isnan(row["device_bytes_per_s"])


def _commit_bench(monkeypatch, device_ms):
    """gdn_commit.bench with profile.time_donated's device time replaced, and the kernel's keyword arguments per call
    recorded."""
    from pallas_kernels.gdn_commit import bench, pallas_triton
    real_time, real_kernel = profile.time_donated, pallas_triton.gdn_commit
    calls = []

    def timed(fn, args, iters):
        got, compile_s, _ = real_time(fn, args, 1)
        return got, compile_s, dict(device_ms=device_ms, kernels=1.0)

    def kernel(*x, **kw):
        calls.append(kw)
        return real_kernel(*x, **kw)
    monkeypatch.setattr(profile, "time_donated", timed)
    monkeypatch.setattr(pallas_triton, "gdn_commit", kernel)
    return bench, calls


def test_the_gdn_commit_bench_times_the_kernel_at_its_defaults(monkeypatch, tmp_path):
    """The "pallas_triton" row is the kernel at its defaults (only interpret= passed, on a CPU), its device time in
    us (0.25 ms: 250 us) and its bytes over that time; --sweep adds rows that pass a tiling."""
    bench, calls = _commit_bench(monkeypatch, 0.25)
    rows = bench.main(["--paths", "2", "--iters", "1"])
    assert [r["impl"] for r in rows] == ["reference", "pallas_triton"]
    assert calls and all(kw == dict(interpret=True) for kw in calls), calls
    for r in rows:
        assert r["device_us"] == pytest.approx(250.0)
        assert r["device_bytes_per_s"] == pytest.approx(r["bytes"] / 250e-6)
    calls.clear()
    rows = bench.main(["--paths", "2", "--iters", "1", "--sweep"])
    assert len(rows) == 5 and all({"per", "block_dv", "precision"} <= set(kw) for kw in calls if len(kw) > 1)
    assert sum(kw == dict(interpret=True) for kw in calls) >= 1


def test_the_gdn_commit_bench_without_a_device_time_gives_no_rate(monkeypatch):
    """A device time of 0 (no kernel in the trace): the rows' device rate is nan, not a ZeroDivisionError."""
    bench, _ = _commit_bench(monkeypatch, 0.0)
    rows = bench.main(["--paths", "1", "--iters", "1"])
    assert len(rows) == 2 and all(np.isnan(r["device_bytes_per_s"]) and r["device_us"] == 0.0 for r in rows)
