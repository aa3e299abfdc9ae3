"""bench.table: issue #6's table from the parts' JSONs, goals judged at 1K only, and a run of all parts."""

import json

import pytest

from bench import table
from jaxspec.sharding import FRACTION_VARS, MEM_FRACTION


def _phase(x, device=None):
    return dict(median_ms=x, min_ms=x, k=3) | ({} if device is None else dict(device_ms=device, kernels=9.0))


def _rounds():
    at = lambda s: {"ar_step": _phase(15.0 * s), "ar_round_device_loop": _phase(15.3 * s) | dict(queued_median_ms=14.8 * s),
                    "verify_chain16": _phase(18.6 * s), "verify_tree65": _phase(28.5 * s, 26.0 * s), "draft": _phase(2.4, 1.9),
                    "tree_build": {"64": _phase(0.2, 0.1)}, "accept_commit_tree65": _phase(2.5, 0.3),
                    "dflash_round": _phase(20.0 * s), "ddtree64_round": _phase(30.0 * s)}
    return {"contexts": {"1024": at(1.0), "32768": at(1.1)}, "block_size": 16, "roofline_ms_at_4.30TB_s": 11.92}


def _rows(t, ctx):
    return {r["row"]: r for r in t["rows"] if r["context"] == ctx}


def test_compose_judges_the_goals_at_1k():
    """Round goals at 1K context, the tree-attention goal at a 128K prefix, prefill whatever its length."""
    attention = {"copy_bytes_per_s": 3.7e12, "rows": [
        {"prefix": 131072, "n": 65, "impl": "reference", "frac_of_copy": 0.30, "bytes_per_s": 0.30 * 3.7e12},
        {"prefix": 131072, "n": 65, "impl": "pallas_triton", "frac_of_copy": 0.85, "bytes_per_s": 0.85 * 3.7e12}]}
    harness = {"prefill": {"prompt": 8192, "tflop_s_2NP": 300.0, "time": _phase(1500.0)}, "matmul": {"tflop_s": 600.0}}
    t = table.compose(_rounds(), attention, harness, budget=64, block=16, tau=9.18, real=True)
    k1, k32 = _rows(t, 1024), _rows(t, 32768)
    ar = k1["AR decode step (engine device loop)"]
    assert ar["value"] == 15.3 and ar["met"] is False and ar["vs_roofline"] == pytest.approx(15.3 / 11.92)
    assert ar["tok_s"] == pytest.approx(1e3 / 15.3)
    queued = k1["AR decode step (engine device loop, calls queued)"]
    assert queued["value"] == pytest.approx(14.8) and queued["goal"] is None and queued["met"] is None
    assert k32["AR decode step (engine device loop)"]["met"] is None          # goals are for 1K only
    assert k32["AR decode step (engine device loop)"]["goal"] is None
    # The verify / AR goals: on the verify's device time where measured (the tree), else back to back (the chain)
    chain = k1["verify, chain of 16 (back to back) / AR step (back to back)"]
    assert chain["value"] == pytest.approx(18.6 / 15.0) and chain["met"] is False
    tree = k1["verify, tree of 65 (device time) / AR step (back to back)"]
    assert tree["value"] == pytest.approx(26.0 / 15.0) and tree["met"] is False and tree["goal"] == "<= 1.2 x AR step"
    # The drafter step and tree build + accept + commit: judged on device time, back to back shown
    assert k1["drafter step (device time)"]["value"] == 1.9 and k1["drafter step (device time)"]["met"] is True
    assert k1["drafter step (back to back calls)"]["value"] == 2.4
    assert k1["drafter step (back to back calls)"]["goal"] is None
    dev, b2b = (k1[f"tree build (B = 64) + accept + commit ({how})"] for how in ("device time", "back to back calls"))
    assert dev["value"] == pytest.approx(0.4) and dev["met"] is True
    assert b2b["value"] == pytest.approx(2.7) and b2b["met"] is None
    assert k1["verify, tree of 65 (device time)"]["value"] == 26.0
    assert k1["verify, chain of 16 (device time)"]["value"] is None             # not measured in this JSON
    assert k1["DFlash round"]["tok_s"] == pytest.approx(9.18e3 / 20.0)
    assert k1["DDTree(B = 64) round"]["met"] is False
    att = [r for r in t["rows"] if r["row"].startswith("tree attention")]
    assert len(att) == 1 and "pallas_triton" in att[0]["row"] and att[0]["met"] is True   # the kernel, not the jnp
    pre = [r for r in t["rows"] if r["row"].startswith("prefill") and r["unit"] == "of matmul"][0]
    assert pre["value"] == pytest.approx(0.5) and pre["met"] is True
    md = table.markdown(t, "# t")
    assert "| AR decode step (engine device loop) | 1024 | 15.30 ms | <= 13.5 ms | **no** | 1.28 | 65 |" in md


def test_tree_attention_is_also_judged_against_the_matmul_rate():
    """Many nodes over a long prefix are compute-bound: the row of FLOP/s against the run's matmul rate, and what
    the copy goal would ask of it (N = 64 at 128K with session 14's numbers: 108% of the matmul rate)."""
    flops, kv, copy, us = 4 * 64 * 24 * (131072 + 64) * 256, 537133056, 2268666751135.787, 797.17
    attention = {"copy_bytes_per_s": copy, "rows": [
        {"prefix": 131072, "n": 64, "impl": "pallas_triton", "frac_of_copy": kv / (us * 1e-6) / copy,
         "bytes_per_s": kv / (us * 1e-6),
         "kv_bytes": kv, "flops": flops, "flop_s": flops / (us * 1e-6)}]}
    harness = {"prefill": {"prompt": 8192, "tflop_s_2NP": 330.0, "time": _phase(1272.9)}, "matmul": {"tflop_s": 642.5}}
    t = table.compose(None, attention, harness, budget=63, block=16, tau=9.18, real=True)
    r = {x["row"]: x for x in t["rows"]}
    got = r["tree attention (pallas_triton), N = 64, FLOP/s of bf16 matmul (642.5 TFLOP/s)"]
    assert got["value"] == pytest.approx(0.4027, abs=1e-3) and got["context"] == 131072 and got["goal"] is None
    need = r["tree attention, N = 64: FLOP/s the copy goal would take, of bf16 matmul"]
    assert need["value"] == pytest.approx(1.0847, abs=1e-3)
    assert r["tree attention (pallas_triton), N = 64, KV bytes/s of copy (2269 GB/s)"]["met"] is False


def test_compose_shows_each_kernel_against_its_copy():
    """The verify and tree delta rule parts: the Pallas kernel's rows where it ran (else the jnp ones), each as
    a fraction of the copy measured in its own run, with its time; no goal of their own."""
    verify = {"copy_bytes_per_s": 3.5e12, "rows": [
        {"rows": 65, "temperature": 0.0, "impl": "xla", "us": 30.0, "frac_of_copy": 0.6, "bytes_per_s": 2.1e12},
        {"rows": 65, "temperature": 0.0, "impl": "pallas_triton", "us": 25.0, "frac_of_copy": 0.7,
         "bytes_per_s": 2.45e12}]}
    delta = {"copy_bytes_per_s": 3.5e12, "rows": [
        {"n": 16, "impl": "xla", "device_us_per_layer": 20.0, "frac_of_copy": 0.1, "bytes_per_s": 0.35e12}]}
    t = table.compose(None, None, None, budget=64, block=16, tau=9.18, real=True, verify=verify, delta_rule=delta)
    r = {x["row"]: x for x in t["rows"]}
    assert r["verify (pallas_triton), 65 rows, T = 0: logits bytes/s of copy (3500 GB/s)"]["value"] == pytest.approx(0.7)
    assert r["verify (pallas_triton), 65 rows, T = 0: time"]["value"] == 25.0
    assert not any(k.startswith("verify (xla)") for k in r)                  # the kernel ran: its rows only
    assert r["tree delta rule (xla), N = 16, per GDN layer: device time"]["value"] == 20.0
    assert r["tree delta rule (xla), N = 16, per GDN layer: state + inputs + outputs bytes/s of copy (3500 GB/s)"][
        "value"] == pytest.approx(0.1)
    assert all(x["goal"] is None and x["met"] is None for x in t["rows"])
    assert "| verify (pallas_triton), 65 rows, T = 0: logits bytes/s of copy (3500 GB/s) | - | 70.0% |" in \
        table.markdown(t, "# t")


def test_every_of_copy_row_has_the_harness_copy_when_it_ran():
    """Session 16's first H200 table: each kernel part timed its own copy per host call (1881 / 2330 / 1919 GB/s)
    while the harness, in the same run, measured 3683 GB/s; against their own copies the tree attention kernel
    at N = 1 showed 158%. With the harness's copy every "of copy" row has that one ceiling."""
    harness = {"prefill": {"prompt": 8192, "tflop_s_2NP": 328.1, "time": _phase(1278.1)}, "matmul": {"tflop_s": 580.0},
               "copy_bandwidth": {"tb_s": 3.682642379070524}}
    attention = {"copy_bytes_per_s": 1.881e12, "rows": [
        {"prefix": 131072, "n": 1, "impl": "pallas_triton", "frac_of_copy": 1.581, "bytes_per_s": 2.974e12}]}
    verify = {"copy_bytes_per_s": 2.330e12, "rows": [
        {"rows": 64, "temperature": 0.0, "impl": "pallas_triton", "us": 118.2, "frac_of_copy": 0.231,
         "bytes_per_s": 0.538e12}]}
    delta = {"copy_bytes_per_s": 1.919e12, "rows": [
        {"n": 64, "impl": "pallas_triton", "device_us_per_layer": 27.75, "frac_of_copy": 0.207,
         "bytes_per_s": 0.397e12}]}
    t = table.compose(None, attention, harness, budget=63, block=16, tau=9.18, real=True, verify=verify,
                      delta_rule=delta)
    r = {x["row"]: x for x in t["rows"]}
    att = r["tree attention (pallas_triton), N = 1, KV bytes/s of copy (copy 3683 GB/s)"]
    assert att["value"] == pytest.approx(2.974 / 3.6826, rel=1e-3) and att["met"] is True
    assert r["verify (pallas_triton), 64 rows, T = 0: logits bytes/s of copy (copy 3683 GB/s)"]["value"] == \
        pytest.approx(0.538 / 3.6826, rel=1e-3)
    assert r["tree delta rule (pallas_triton), N = 64, per GDN layer: state + inputs + outputs bytes/s of copy "
             "(copy 3683 GB/s)"]["value"] == pytest.approx(0.397 / 3.6826, rel=1e-3)
    assert not any("1881" in k or "2330" in k or "1919" in k for k in r)


def _gdn_parts():
    decode = {"rows": [
        {"impl": "reference", "device_us_per_layer": 20.0, "device_bytes_per_s": 0.2e12},
        {"impl": "pallas_triton", "device_us_per_layer": 6.5, "device_bytes_per_s": 0.5e12},
        {"impl": "pallas_triton/w8", "device_us_per_layer": 7.5, "device_bytes_per_s": 0.45e12}]}
    inputs = {"rows": [{"n": 16, "impl": "reference", "device_us_per_layer": 9.0, "device_bytes_per_s": 0.1e12}]}
    commit = {"rows": [
        {"path": 16, "impl": "reference", "layers": 48, "device_us": 328.6, "device_bytes_per_s": 0.9e12},
        {"path": 16, "impl": "pallas_triton", "layers": 48, "device_us": 176.1, "device_bytes_per_s": 1.7e12}]}
    conv = {"rows": [
        {"n": 16, "impl": "reference", "layers": 48, "device_us": 56.2, "device_bytes_per_s": 0.1e12},
        {"n": 16, "impl": "pallas_triton", "layers": 48, "device_us": 3.5, "device_bytes_per_s": 1.7e12}]}
    return dict(gdn_decode=decode, gdn_tree_inputs=inputs, gdn_commit=commit, conv_commit=conv)


def test_compose_shows_the_gdn_kernels_against_the_harness_copy():
    """The GDN kernels' parts time no copy of their own: their rows are fractions of the harness's copy where it
    ran, else bytes/s on the device; the default kernel's row (impl "pallas_triton") where it ran, else every row
    (the reference's, on a CPU). No goal of their own."""
    harness = {"copy_bandwidth": {"tb_s": 4.0}}
    t = table.compose(None, None, harness, budget=63, block=16, tau=9.18, real=True, gdn=_gdn_parts())
    r = {x["row"]: x for x in t["rows"]}
    assert r["GDN decode (pallas_triton), 1 node, per GDN layer: state + inputs + outputs bytes/s of copy "
             "(copy 4000 GB/s)"]["value"] == pytest.approx(0.125)
    assert r["GDN decode (pallas_triton), 1 node, per GDN layer: device time"]["value"] == 6.5
    assert not any(k.startswith("GDN decode (reference)") or "w8" in k for k in r)
    assert r["GDN tree inputs (reference), N = 16, per GDN layer: inputs + outputs bytes/s of copy "
             "(copy 4000 GB/s)"]["value"] == pytest.approx(0.025)
    assert r["GDN commit (pallas_triton), path of 16, all 48 GDN layers: device time"]["value"] == 176.1
    assert r["GDN commit (pallas_triton), path of 16, all 48 GDN layers: states read and written + path bytes/s "
             "of copy (copy 4000 GB/s)"]["value"] == pytest.approx(0.425)
    assert not any(k.startswith("GDN commit (reference)") for k in r)
    assert r["GDN conv commit (pallas_triton), block of 16, all 48 GDN layers: device time"]["value"] == 3.5
    assert r["GDN conv commit (pallas_triton), block of 16, all 48 GDN layers: history rows read and written "
             "bytes/s of copy (copy 4000 GB/s)"]["value"] == pytest.approx(0.425)
    assert not any(k.startswith("GDN conv commit (reference)") for k in r)
    assert all(x["goal"] is None and x["met"] is None for x in t["rows"])
    alone = table.compose(None, None, None, budget=63, block=16, tau=9.18, real=True, gdn=_gdn_parts())
    md = table.markdown(alone, "# t")
    assert "| GDN commit (pallas_triton), path of 16, all 48 GDN layers: states read and written + path bytes/s " \
           "on the device | - | 1.70 TB/s |" in md
    assert "| GDN decode (pallas_triton), 1 node, per GDN layer: device time | - | 6.50 us |" in md


@pytest.mark.parametrize("budget, sizes", [(63, "16,64"), (15, "16"), (8, "9,16")])
def test_the_gdn_parts_time_the_block_and_the_tree(tmp_path, monkeypatch, budget, sizes):
    """The tree delta rule and the GDN tree inputs at the DFlash block and the tree, each size once (--budget 15
    asked the benches for '16,16', which they refuse); the commit after a path of 16."""
    ran = _fake_parts(monkeypatch, {p: (0, None) for p in table.PARTS})
    table.main(["--contexts", "64", "--prefill", "64", "--budget", str(budget), "--out", str(tmp_path)])
    for name in ("delta_rule", "gdn_tree_inputs"):
        assert ran[name][ran[name].index("--sizes") + 1] == sizes
    assert ran["gdn_commit"][ran["gdn_commit"].index("--paths") + 1] == "16"
    assert [ran[n][0] for n in table.GDN_PARTS] == [
        "pallas_kernels.gdn_decode.bench", "pallas_kernels.gdn_tree_inputs.bench", "pallas_kernels.gdn_commit.bench",
        "pallas_kernels.conv_commit.bench"]


def test_compose_of_a_tiny_run_judges_nothing():
    t = table.compose(_rounds(), None, None, budget=64, block=16, tau=9.18, real=False)
    assert all(r["met"] is None for r in t["rows"])
    assert any(r["goal"] for r in t["rows"])                                    # shown, not judged


def test_parts_past_the_deadline_leave_rows_unmeasured(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("JAXSPEC_DDTREE_TOP_K", "count")
    monkeypatch.setenv("JAXSPEC_COMMIT", "abc1234")
    assert table.main(["--config", "tiny", "--contexts", "64", "--deadline-s", "0.5", "--out", str(tmp_path)]) == 1
    t = json.loads((tmp_path / "table.json").read_text())
    assert set(t["parts"]) == set(table.PARTS)
    assert all("not started" in p["rc"] for p in t["parts"].values())
    md = (tmp_path / "table.md").read_text()
    assert "No roofline" in md
    assert t["flags"] == {"JAXSPEC_DDTREE_TOP_K": "count"} and "with JAXSPEC_DDTREE_TOP_K=count." in md
    # no part ran: the commit of this checkout (the parts would have run from it), with its dirty flag (was: unknown)
    assert "Commit abc1234 (dirty)," in md and t["git"]["commit"] == "abc1234"


@pytest.mark.slow
def test_all_parts_run_on_cpu(tmp_path, monkeypatch):
    for v in FRACTION_VARS:         # unset for this test, restored after it (table.main sets one for its parts)
        monkeypatch.setenv(v, "")
        monkeypatch.delenv(v)
    rc = table.main(["--config", "tiny", "--contexts", "64,128", "--budget", "8", "--prefill", "64", "--k", "2",
                     "--rounds", "2", "--ar-rounds", "3", "--out", str(tmp_path)])
    t = json.loads((tmp_path / "table.json").read_text())
    assert rc == 0, t["parts"]
    loops = json.loads((tmp_path / "rounds.json").read_text())["contexts"]["64"]
    assert loops["ar_round_device_loop"]["rounds_per_call"] == 3 and loops["dflash_round"]["rounds_per_call"] == 2
    assert {r["context"] for r in t["rows"]} == {64, 128, None}
    missing = [r["row"] for r in t["rows"] if r["value"] is None]
    assert not missing, missing
    assert any(r["row"].startswith("tree attention") and r["context"] == 128 for r in t["rows"])
    for kernel in ("verify (xla), 9 rows", "tree delta rule (xla), N = 16", "tree delta rule (xla), N = 9",
                   "GDN decode (reference), 1 node", "GDN tree inputs (reference), N = 9",
                   "GDN tree inputs (reference), N = 16", "GDN commit (pallas_triton), path of 16",
                   "GDN conv commit (pallas_triton), block of 4"):
        assert any(r["row"].startswith(kernel) and r["unit"] == "of copy" and r["value"] > 0 for r in t["rows"]), kernel
    assert "not measured" not in (tmp_path / "table.md").read_text()
    # Each part takes 90% of the GPU, not JAX's default 75% (a 27B's cache at 128K did not fit an 80 GB card's 75%).
    assert json.loads((tmp_path / "harness.json").read_text())["machine"]["mem_fraction"] == MEM_FRACTION


@pytest.mark.parametrize("bad", ["1k", "0,1024", ""])
def test_bad_contexts_are_refused_by_name(tmp_path, capsys, bad):
    with pytest.raises(SystemExit):
        table.main(["--contexts", bad, "--out", str(tmp_path)])
    assert "--contexts" in capsys.readouterr().err


_JSONS = dict(rounds="rounds.json", attention="tree_attention.json", prefill="harness.json", verify="verify.json",
              delta_rule="delta_rule.json")


def _fake_parts(monkeypatch, results: dict):
    """table.run_part replaced: each part named in `results` gives (rc, JSON it writes or None); the commands are
    recorded by part. Any other part fails the test."""
    ran = {}

    def run_part(name, cmd, out, timeout):
        ran[name] = cmd
        rc, data = results[name]
        if data is not None:
            (out / _JSONS[name]).write_text(json.dumps(data))
        return dict(command=["python", "-m", *cmd], rc=rc, seconds=0.0)
    monkeypatch.setattr(table, "run_part", run_part)
    return ran


def test_only_parts_that_succeed_in_this_run_give_rows(tmp_path, monkeypatch):
    """An earlier table's DIR: its parts' JSONs (another context, another commit and card) never show in the new
    table. The rounds part fails now: its rows at the new context are "not measured" and its old JSON is gone; the
    verify part succeeds: its new rows; the parts not run now: no rows."""
    old = dict(git={"commit": "stale00"}, machine={"device_kind": "OldCard"})
    (tmp_path / "rounds.json").write_text(json.dumps(_rounds() | {"contexts": {"64": _rounds()["contexts"]["1024"]}}
                                                     | old))
    (tmp_path / "verify.json").write_text(json.dumps(old | {"copy_bytes_per_s": 1e12, "rows": [
        {"rows": 5, "temperature": 0.0, "impl": "xla", "us": 999.0, "frac_of_copy": 0.9, "bytes_per_s": 0.9e12}]}))
    (tmp_path / "delta_rule.json").write_text(json.dumps(old | {"copy_bytes_per_s": 1e12, "rows": [
        {"n": 16, "impl": "xla", "device_us_per_layer": 7.0, "frac_of_copy": 0.1, "bytes_per_s": 0.1e12}]}))
    (tmp_path / "table.json").write_text("{}")
    verify = dict(git={"commit": "new1111"}, machine={"device_kind": "cpu"}, copy_bytes_per_s=1e12, rows=[
        {"rows": 5, "temperature": 0.0, "impl": "xla", "us": 3.0, "frac_of_copy": 0.2, "bytes_per_s": 0.2e12}])
    _fake_parts(monkeypatch, {"rounds": (1, None), "verify": (0, verify)})
    assert table.main(["--contexts", "128", "--budget", "4", "--parts", "rounds,verify", "--out", str(tmp_path)]) == 1
    t = json.loads((tmp_path / "table.json").read_text())
    assert {r["context"] for r in t["rows"]} == {128, None}
    assert all(r["value"] is None for r in t["rows"] if r["context"] == 128)
    assert {r["value"] for r in t["rows"] if r["row"].startswith("verify (xla)")} == {0.2, 3.0}
    assert not any("delta rule" in r["row"] for r in t["rows"])
    md = (tmp_path / "table.md").read_text()
    assert "stale00" not in md and "OldCard" not in md and "Commit new1111, cpu" in md and "No roofline" in md
    assert not (tmp_path / "rounds.json").exists()


def test_an_earlier_table_is_gone_before_the_parts_start(tmp_path, monkeypatch):
    """An earlier run's table.md / table.json are removed with its parts' JSONs, before any part runs: a rerun that
    is interrupted leaves no stale table beside its own files (was: the old table stayed until the new one)."""
    for name in ("table.md", "table.json", "verify.json"):
        (tmp_path / name).write_text("old")
    seen = []

    def interrupted(name, cmd, out, timeout):
        seen.append(sorted(p.name for p in out.iterdir()))
        raise KeyboardInterrupt
    monkeypatch.setattr(table, "run_part", interrupted)
    with pytest.raises(KeyboardInterrupt):
        table.main(["--parts", "verify", "--out", str(tmp_path)])
    assert seen == [[]] and not any(tmp_path.iterdir())


def test_the_rounds_part_is_given_contexts_up_to_the_models_limit(tmp_path, monkeypatch):
    """The limit table checks for the rounds part is bench.rounds' own: the longest context it allows is run."""
    from bench import rounds
    ran = _fake_parts(monkeypatch, {"rounds": (0, None)})
    assert table.main(["--config", "real", "--contexts", "259942", "--parts", "rounds", "--out", str(tmp_path)]) == 0
    cmd = ran["rounds"]

    class Started(Exception):
        pass

    def started(msg):
        raise Started(msg)
    monkeypatch.setattr(rounds, "log", started)
    with pytest.raises(Started):                         # past its flags: the run would start
        rounds.main(cmd[1:cmd.index("--out")])


def test_the_header_takes_the_commit_of_a_harness_part(tmp_path, monkeypatch):
    """The prefill part (bench.harness) records commit and dirty at its JSON's top level, not under "git": the header
    shows them (was: "Commit unknown" when it was the first part with metadata), dirty or clean."""
    for dirty, shown in ((True, "Commit pre1234 (dirty), cpu"), (False, "Commit pre1234 (clean), cpu")):
        harness = dict(commit="pre1234", dirty=dirty, source="git", machine={"device_kind": "cpu"})
        _fake_parts(monkeypatch, {"prefill": (0, harness)})
        assert table.main(["--parts", "prefill", "--out", str(tmp_path / str(dirty))]) == 0
        md = (tmp_path / str(dirty) / "table.md").read_text()
        assert shown in md, md
        t = json.loads((tmp_path / str(dirty) / "table.json").read_text())
        assert t["git"] == {"commit": "pre1234", "dirty": dirty, "source": "git"}


def test_only_the_tiny_config_times_cpu_sized_kernels(tmp_path, monkeypatch):
    """A config.json path runs the kernels at their real sizes (was: the tiny config's vocabulary of 4096)."""
    from jaxspec.generate import demo_dir
    ran = _fake_parts(monkeypatch, {p: (0, None) for p in table.PARTS})
    for config, small in ((str(demo_dir() / "target" / "config.json"), False), ("tiny", True)):
        table.main(["--config", config, "--contexts", "64", "--prefill", "64",      # the demo's limit is 4096
                    "--out", str(tmp_path / config.replace("/", "_"))])
        assert ran["rounds"][ran["rounds"].index("--config") + 1] == config
        assert ("--vocab" in ran["verify"]) is small and ("--copy-gib" in ran["prefill"]) is small
        assert ("--layers" in ran["delta_rule"]) is small and ("--layers" in ran["gdn_decode"]) is small
        assert ("--layers" in ran["gdn_tree_inputs"]) is small and ("--iters" in ran["gdn_commit"]) is small
        assert ("--iters" in ran["conv_commit"]) is small


@pytest.mark.parametrize("argv, message", [
    (["--parts", ""], "--parts '': names no part"),                           # was: nothing run, exit 0
    (["--parts", ","], "names no part"),
    (["--budget", "-1"], "--budget: must be >= 1"),
    (["--budget", "0"], "--budget: must be >= 1"),
    (["--k", "0"], "--k: must be >= 1"),
    (["--rounds", "0"], "--rounds: must be >= 1"),
    (["--ar-rounds", "0"], "--ar-rounds: must be >= 1"),
    (["--prefill", "-1"], "--prefill: must be >= 0"),
    (["--config", "no/such/model"], "--config 'no/such/model': "),
    # were: an empty table, exit 0
    (["--parts", "prefill", "--prefill", "0", "--contexts", "16"],
     "--parts 'prefill': no part left to run (--prefill 0 skips prefill)"),
    (["--parts", "attention", "--attention-prefix", "-1", "--contexts", "16"],
     "--parts 'attention': no part left to run (--attention-prefix -1 skips attention)"),
    (["--tau", "0.5"], "--tau: must be >= 1, got 0.5"),                        # was: at least 0
    (["--tau", "nan"], "--tau: must be a finite number >= 1, got nan"),
    (["--contexts", "16,16"], "--contexts: 16 given more than once in '16,16'"),   # was: timed twice, one kept
    # were: parts that time what Engine.generate refuses (max_position_embeddings), refused only by the parts
    (["--config", "real", "--contexts", "1024,259943"], "--contexts 259943: + 2202 slots bench.rounds' timed calls "
     "take past it exceeds the model's context limit (max_position_embeddings 262144); at most 259942"),
    (["--config", "real", "--contexts", "1024", "--prefill", "262144"], "--prefill 262144: + 1 generated token "
     "(the prefill's) exceeds the model's context limit (max_position_embeddings 262144); at most 262143"),
])
def test_bad_flags_are_refused_before_any_part(tmp_path, monkeypatch, capsys, argv, message):
    _fake_parts(monkeypatch, {})
    with pytest.raises(SystemExit) as e:
        table.main(argv + ["--out", str(tmp_path / "new")])
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "new").exists()


def test_out_is_a_directory_whose_other_files_stay(tmp_path, monkeypatch, capsys):
    """--out: a file (was: FileExistsError), or a path under a file, is refused at parse time; an existing directory
    is used, and only the table's own files in it are replaced (a caller's log written there first stays)."""
    _fake_parts(monkeypatch, {"verify": (0, None)})
    (tmp_path / "f").write_text("")
    for out, message in ((tmp_path / "f", "is a file; name a directory"),
                         (tmp_path / "f" / "d", f"{tmp_path / 'f'} is not a directory")):
        with pytest.raises(SystemExit) as e:
            table.main(["--parts", "verify", "--out", str(out)])
        assert e.value.code == 2 and f"--out {out}: {message}" in capsys.readouterr().err
    assert table.main(["--parts", "verify", "--out", str(tmp_path / "t")]) == 0
    (tmp_path / "t" / "call.log").write_text("keep")
    assert table.main(["--parts", "verify", "--out", str(tmp_path / "t")]) == 0          # an earlier table's
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == ["call.log", "table.json", "table.md"]
    assert (tmp_path / "t" / "call.log").read_text() == "keep"


def test_help_says_the_defaults(capsys):
    with pytest.raises(SystemExit):
        table.main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "default: 64" in out and "default: 20" in out and "default: 100" in out and "default: tiny" in out


def test_help_says_what_dtype_is_and_the_docstring_runs_the_readmes_command(capsys):
    """--dtype's help was only its default; the module's example lacked the README's --budget 63."""
    import re
    from pathlib import Path
    with pytest.raises(SystemExit):
        table.main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--dtype {bfloat16,float32} dtype of the random weights and activations of the round phases" in out, out
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    command = re.search(r"`(?:\.venv/bin/)?(python -m bench\.table [^`]*)`", readme).group(1)
    assert command in " ".join(table.__doc__.split()), command
