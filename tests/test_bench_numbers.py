"""Each number bench/harness.py and bench/rounds.py record is what its label says (per call / per step / per round,
in ms, from the timed calls only, batch counted), each ratio the right way up, and the table's tokens/s and goals
where they belong: what a mutation review of bench/harness.py, bench/table.py and bench/rounds.py found unchecked.
Timings are pinned with sleeps (lower bounds the sleep guarantees, upper bounds far from the wrong answers)."""

from __future__ import annotations

import dataclasses
import json
import time
import types

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from bench import harness, rounds, table
from jaxspec import model as M
from test_bench_harness_cli import SMALL
from test_bench_table import _rounds, _rows

# ------------------------------------------------------------------------------------------------ harness


def test_summarize_reports_the_median_not_the_mean():
    s = harness.summarize([1.0, 2.0, 9.0])
    assert (s["median_ms"], s["mean_ms"], s["min_ms"], s["n"]) == (2.0, 4.0, 1.0, 3)
    assert s["p10_ms"] <= s["median_ms"] <= s["p90_ms"]


def test_time_calls_times_only_the_calls_after_the_warmup_in_ms():
    """Two slow warm-up calls (a compile) are run but not timed; the timed ones are in milliseconds."""
    calls = []

    def fn():
        calls.append(None)
        time.sleep(0.4 if len(calls) <= 2 else 0.01)
    r = harness.time_calls(fn, 2, 3)
    assert len(calls) == 5 and r["n"] == 3
    assert r["min_ms"] >= 10 and r["p90_ms"] < 300, r           # 10 ms sleeps, in ms; the 400 ms warm-up left out


def test_engine_rounds_is_ms_per_round_not_per_call(monkeypatch):
    """harness.engine_rounds divides a call's time by the rounds it ran: 20 ms calls of 10 rounds are 2 ms a round."""
    cfg = harness.tiny_config("float32")

    def run(params, d, max_new, n):
        time.sleep(0.02)
        return dataclasses.replace(d, rounds=d.rounds + n)
    eng = types.SimpleNamespace(spec=types.SimpleNamespace(tree_size=1), mesh=None, params=None, _run=run)
    r = harness.engine_rounds(eng, harness.random_state(cfg, 1, 16, 8), (), rounds=10, repeats=2, queue=2)
    assert 2 <= r["median_ms"] < 8 and 2 <= r["queued_median_ms"] < 8, r       # per call: 20 ms
    assert r["rounds_per_call"] == 10 and r["queued_calls"] == 2


@pytest.fixture(scope="module")
def paced(tmp_path_factory):
    """bench.harness on the tiny config at batch 2, its decode step paced by a sleep: 100 ms for the warm-up, 20 ms
    a call for the 2 timed steps, 10 ms a call for the 8 pipelined ones (so the pipelined figure is the best)."""
    mp = pytest.MonkeyPatch()
    real, calls = harness.compile_fn, []

    def compile_fn(fn, *args, **kw):
        compiled, ct = real(fn, *args, **kw)
        if fn.__name__ != "decode_step":
            return compiled, ct

        def paced_step(*a):
            calls.append(None)
            time.sleep(0.1 if len(calls) == 1 else 0.02 if len(calls) <= 3 else 0.01)
            return compiled(*a)
        return paced_step, ct
    mp.setattr(harness, "compile_fn", compile_fn)
    out = tmp_path_factory.mktemp("paced") / "h.json"
    try:
        harness.main(SMALL[:8] + ["--batch", "2", "--contexts", "16", "--warmup", "1", "--iters", "2",
                                   "--pipelined", "8", "--loop-steps", "2", "--loop-iters", "1", "--breakdown",
                                   "--prompt", "8", "--prefill-warmup", "1", "--prefill-iters", "2",
                                   "--out", str(out)])
    finally:
        mp.undo()
    assert len(calls) == 11                     # 1 warm-up + 2 timed + 8 pipelined
    return json.loads(out.read_text())


def test_decode_times_are_per_step_in_ms_from_the_timed_steps(paced):
    d = paced["decode"][0]
    assert d["step"]["n"] == 2 and 20 <= d["step"]["median_ms"] < 45, d["step"]     # the warm-up (100) not timed
    assert 10 <= d["pipelined_ms"] < 30, d["pipelined_ms"]                          # 8 calls / 8, not / --iters
    loop = d["device_loop"]
    assert loop["steps_per_call"] == 2 and loop["step_ms"] == pytest.approx(loop["call"]["median_ms"] / 2)


def test_decode_roofline_tokens_and_bandwidth_follow_from_the_timings(paced):
    d, cfg, copy = paced["decode"][0], harness.tiny_config(), paced["copy_bandwidth"]
    kv = len(cfg.full_layers) * 2 * 2 * 16 * cfg.num_kv_heads * cfg.head_dim * 2        # K and V, batch 2, bf16
    assert d["bytes"]["kv_read"] == kv
    total, med, best = d["bytes"]["total"], d["step"]["median_ms"], min(d["step"]["median_ms"], d["pipelined_ms"])
    assert d["roofline_ms"] == pytest.approx(total / (copy["tb_s"] * 1e12) * 1e3)       # at the copy rate
    assert d["ratio_to_roofline"] == pytest.approx(med / d["roofline_ms"])             # measured / floor
    assert d["tokens_per_s"] == pytest.approx(2 * 1e3 / best)                          # both sequences
    assert d["achieved_tb_s"] == pytest.approx(total / (best * 1e-3) / 1e12)


def test_ceilings_follow_from_their_timings(paced):
    copy, mm = paced["copy_bandwidth"], paced["matmul"]
    for v in copy["variants"].values():        # bytes read + written
        assert v["tb_s"] == pytest.approx(copy["bytes_per_op"] / (v["min_ms"] * 1e-3) / 1e12)
    assert copy["tb_s"] == max(v["tb_s"] for v in copy["variants"].values())           # the fastest variant
    assert mm["tflop_s"] == pytest.approx(2 * mm["n"] ** 3 / (mm["min_ms"] * 1e-3) / 1e12)


def test_prefill_times_the_timed_prefills_and_counts_the_batch(paced):
    p = paced["prefill"]
    assert p["time"]["n"] == 2 and p["batch"] == 2
    assert p["tokens_per_s"] == pytest.approx(2 * 8 / (p["time"]["median_ms"] * 1e-3))


def test_breakdown_sum_is_every_part(paced):
    b = paced["breakdown"]
    assert b["sum_ms"] == pytest.approx(sum(b[k]["median_ms"] for k in ("mlp", "attn", "gdn", "head")))


# -------------------------------------------------------------------------------------------------- table


def test_round_tokens_per_s_are_tau_over_the_round_and_the_table_says_its_tau():
    t = table.compose(_rounds(), None, None, budget=64, block=16, tau=5.0, real=True)
    k1 = _rows(t, 1024)
    assert k1["DFlash round"]["tok_s"] == pytest.approx(5e3 / 20.0)
    assert k1["DDTree(B = 64) round"]["tok_s"] == pytest.approx(5e3 / 30.0)
    assert t["tau"] == 5.0 and "tokens/s at tau = 5.0 for the rounds" in table.markdown(t, "# t")


def test_tree_attention_goal_is_judged_on_the_kernel_only():
    """Without the Pallas kernel's rows (e.g. a run without the GPU kernel) the jnp rows are shown, not judged."""
    attention = {"copy_bytes_per_s": 3.7e12, "rows": [
        {"prefix": 131072, "n": 65, "impl": "reference", "frac_of_copy": 0.9, "bytes_per_s": 0.9 * 3.7e12}]}
    t = table.compose(None, attention, None, budget=64, block=16, tau=9.18, real=True)
    (r,) = t["rows"]
    assert "reference" in r["row"] and r["value"] == pytest.approx(0.9) and r["goal"] is None and r["met"] is None


# ------------------------------------------------------------------------------------------------- rounds


def test_back_to_back_is_the_median_per_call(monkeypatch):
    """k calls, then one sync, divided by k; the median of 5 repeats, so one slow repeat does not move it."""
    monkeypatch.setattr(rounds, "device_time", lambda call: {})
    calls = []

    def fn():
        calls.append(None)
        time.sleep(0.2 if 1 < len(calls) <= 5 else 0.01)       # after 1 warm-up, the first repeat's 4 calls slow
        return jnp.zeros(())
    r = rounds.back_to_back(fn, (), k=4, warmup=1)
    assert len(calls) == 21 and r["k"] == 4
    assert 10 <= r["min_ms"] <= r["median_ms"] < 30, r        # per call: 10 ms; a repeat of 4: 40; the mean: 48


def test_rounds_ar_step_is_per_call_and_ratios_are_to_it(tmp_path, monkeypatch):
    """The AR step (a 10 ms callback a call, --k 4) is ms per call; vs_ar_step and vs_roofline are phase / AR step
    and phase / (the weights a step reads at 4.30 TB/s); the result says its commit and device."""
    monkeypatch.setenv("JAXSPEC_COMMIT", "abc1234")

    def make_decode_step(graphdef, cfg, batch):
        def step(params, state, token):
            slow = lambda t: (time.sleep(0.01), t)[1]
            return state, jax.pure_callback(slow, jax.ShapeDtypeStruct(token.shape, token.dtype), token)
        return step
    monkeypatch.setattr(rounds.H, "make_decode_step", make_decode_step)
    monkeypatch.setattr(rounds.H, "engine_rounds", lambda *a, **k: dict(median_ms=25.0))
    out = tmp_path / "r.json"
    rounds.main(["--context", "16", "--phases", "ar", "--k", "4", "--rounds", "1", "--ar-rounds", "1",
                 "--dtype", "float32", "--max-len", "64", "--out", str(out)])
    res = json.loads(out.read_text())
    ar = res["phases"]["ar_step"]["median_ms"]
    assert 10 <= ar < 30, ar                                                    # per call, not per 4 calls
    assert res["vs_ar_step"]["ar_round_device_loop"] == pytest.approx(25.0 / ar)
    cfg = harness.tiny_config("float32")
    weights = nnx.state(nnx.eval_shape(lambda: M.Qwen35(cfg, rngs=nnx.Rngs(0))))
    assert res["weight_bytes_per_step"] == harness.param_bytes(cfg, weights)["decode_weight_bytes"]
    roof = res["roofline_ms_at_4.30TB_s"]
    assert roof == pytest.approx(res["weight_bytes_per_step"] / 4.30e12 * 1e3)
    assert res["vs_roofline"]["ar_round_device_loop"] == pytest.approx(25.0 / roof)
    assert res["git"]["commit"] == "abc1234" and res["machine"]["device_kind"] == jax.devices()[0].device_kind
