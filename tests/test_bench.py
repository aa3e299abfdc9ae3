"""The benchmark harness end to end on the tiny config (CPU, a few iterations): every field is there."""

from __future__ import annotations

import json
import re

import jax
import numpy as np
import pytest

from bench import harness, profile
from jaxspec.sharding import FRACTION_VARS, MEM_FRACTION


def _positive(d: dict, *keys):
    for k in keys:
        assert k in d, f"missing {k!r} in {sorted(d)}"
        assert d[k] > 0, f"{k} = {d[k]}"


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "tiny.json"
    harness.main(["--config", "tiny", "--contexts", "16,48", "--prompt", "40", "--warmup", "1", "--iters", "3",
                  "--pipelined", "2", "--loop-steps", "3", "--loop-iters", "2", "--prefill-iters", "2", "--copy-gib", "0.004", "--matmul-n", "64",
                  "--ceiling-iters", "2", "--profile-steps", "1", "--breakdown", "--out", str(out)])
    return json.loads(out.read_text())


def test_metadata(result):
    assert result["config_name"] == "tiny"
    assert result["config"]["hidden_size"] == 64 and result["config"]["dtype"] == "bfloat16"
    assert len(result["commit"]) >= 7 and isinstance(result["dirty"], bool)
    assert result["machine"]["device_kind"] and result["machine"]["host"]
    for k in ("jax", "jaxlib", "flax"):
        assert result["versions"][k]
    assert result["date"].startswith("20")
    assert result["skipped"] == []


def test_ceilings_and_params(result):
    _positive(result["copy_bandwidth"], "tb_s", "bytes_per_op", "read_tb_s")
    _positive(result["matmul"], "tflop_s", "median_ms")
    p = result["params"]
    _positive(p, "total", "decode_weight_bytes", "param_count")
    # Untied: a decode step reads every weight except the embedding table, which it only gathers from.
    assert p["decode_weight_bytes"] == p["total"] - p["by_part"]["embed"]


def test_decode(result):
    assert [d["context"] for d in result["decode"]] == [16, 48]
    for d in result["decode"]:
        assert d["max_len"] > d["context"]
        _positive(d["step"], "median_ms", "p10_ms", "p90_ms")
        assert d["step"]["p10_ms"] <= d["step"]["median_ms"] <= d["step"]["p90_ms"]
        _positive(d, "pipelined_ms", "roofline_ms", "ratio_to_roofline", "achieved_tb_s", "tokens_per_s", "compile_s")
        _positive(d["bytes"], "weights", "kv_read", "gdn_state_read_write", "total")
        assert d["bytes"]["total"] == d["bytes"]["weights"] + d["bytes"]["kv_read"] + d["bytes"]["gdn_state_read_write"]
        assert d["state_length_ok"]
        _positive(d, "roofline_read_ms", "ratio_to_roofline_read_pipelined", "ratio_to_roofline_device_loop")
        _positive(d["device_loop"], "step_ms", "steps_per_call")
        prof = d["profile"]
        assert "error" not in prof, prof
        # The CPU profiler sees only the XLA thunks that ran on its pool threads (not always all of
        # them); on a GPU every kernel is there. So only the shape of the summary is checked here.
        assert prof["kernel_ms_per_step"] >= 0 and isinstance(prof["by_part"], dict)
        assert all(set(t) >= {"kernel", "part", "ms_per_step"} for t in prof["top_kernels"])
    kv = [d["bytes"]["kv_read"] for d in result["decode"]]
    assert kv[1] == 3 * kv[0]


def test_prefill_and_breakdown(result):
    p = result["prefill"]
    assert p["prompt"] == 40 and p["state_length_ok"]
    _positive(p["time"], "median_ms")
    _positive(p, "tokens_per_s", "flops_2NP", "flops_matmul", "tflop_s_2NP")
    b = result["breakdown"]
    for k in ("mlp", "attn", "gdn", "head"):
        _positive(b[k], "median_ms", "bytes", "tb_s")
    _positive(b, "sum_ms")


def test_part_of():
    assert profile.part_of("jit(decode_step)/gdn/norm/mul") == "gdn"
    assert profile.part_of("jit(decode_step)/commit/add") == "commit"
    assert profile.part_of("params['layers'][3]['mlp']['up_proj']['kernel'].value") == "mlp"
    assert profile.part_of("mlp (from operands a b)") == "mlp"
    assert profile.part_of(None) == "unmapped"


def test_cli_help(capsys):
    with pytest.raises(SystemExit) as e:
        harness.parse_args(["--help"])
    assert e.value.code == 0
    assert "--contexts" in capsys.readouterr().out


def test_hlo_index_shares_deduplicated_kernels():
    hlo = "\n".join([
        'ENTRY %main (p0: bf16[8,4], p1: bf16[8,4]) -> bf16[4] {',
        '  %w_attn = bf16[8,4]{1,0} parameter(0), metadata={op_name="params[\'layers\'][3][\'self_attn\'][\'o_proj\'].value"}',
        '  %w_gdn = bf16[8,4]{1,0} parameter(1), metadata={op_name="params[\'layers\'][0][\'linear_attn\'][\'out_proj\'].value"}',
        '  %gemm_fusion_dot.1 = bf16[4]{0} fusion(%w_gdn), kind=kCustom, calls=%c1, '
        'metadata={op_name="jit(step)/gdn/dot_general" deduplicated_name="gemm_fusion_dot.1"}',
        '  %gemm_fusion_dot.2 = bf16[4]{0} fusion(%w_attn), kind=kCustom, calls=%c1, '
        'metadata={deduplicated_name="gemm_fusion_dot.1"}',
        '}'])
    idx = profile.HloIndex(hlo)
    assert idx.name("gemm_fusion_dot_2") == "gemm_fusion_dot.2"
    assert profile.part_of(idx.op_name("gemm_fusion_dot.2")) == "attn"      # from the weight it reads
    assert idx.shares("gemm_fusion_dot.1") == {"gdn": 0.5, "attn": 0.5}


def test_hlo_index_finds_pallas_kernels_by_their_name():
    """Inside a command buffer a Pallas kernel's trace name is its pallas_call's `name` ("__1" for a second
    compiled variant): the index finds the custom calls whose op_name ends in that name, not the instructions
    inside fusions that carry the same op_name, and splits the kernel over their stages."""
    on = 'metadata={op_name="jit(f)/while/body/%s/attn/jit(tree_attention)/tree_attention/pallas_call"}'
    hlo = "\n".join([
        "%fused_bitcast (p: f32[4]) -> f32[4] {",
        "  %p = f32[4]{0} parameter(0)",
        "  ROOT %bitcast.3 = f32[4]{0} bitcast(%p), " + on % "commit",
        "}",
        "ENTRY %main (x: f32[4]) -> f32[4] {",
        "  %x = f32[4]{0} parameter(0)",
        '  %pallas_call.5 = f32[4]{0} custom-call(%x), custom_call_target="__gpu$xla.gpu.triton", ' + on % "verify",
        '  %pallas_call.9 = f32[4]{0} custom-call(%x), custom_call_target="__gpu$xla.gpu.triton", ' + on % "draft",
        "  ROOT %f = f32[4]{0} fusion(%pallas_call.9), kind=kLoop, calls=%fused_bitcast",
        "}"])
    idx = profile.HloIndex(hlo)
    assert sorted(idx.pallas["tree_attention"]) == ["pallas_call.5", "pallas_call.9"]
    assert idx.name("tree_attention__1") in ("pallas_call.5", "pallas_call.9")
    assert idx.name("no_such_kernel") is None
    assert idx.shares(idx.name("tree_attention"), harness.stage_of) == {"verify": 0.5, "draft": 0.5}
    assert idx.shares(idx.name("tree_attention")) == {"attn": 1.0}


def test_engine_rounds_times_synced_and_queued_calls_and_refuses_a_full_cache():
    """harness.engine_rounds: a round's ms from one synced call and from calls queued back to back, every call
    running all its rounds; a state without room for them is an error naming max_len, not a silent average."""
    from flax import nnx
    from jaxspec.engine import Engine
    from jaxspec.model import Qwen35
    cfg = harness.tiny_config("float32")
    eng = Engine(Qwen35(cfg, rngs=nnx.Rngs(0)))
    r = harness.engine_rounds(eng, harness.random_state(cfg, 1, 64, 8), (), rounds=2, repeats=1, queue=2)
    _positive(r, "median_ms", "min_ms", "queued_median_ms", "queued_min_ms")
    assert r["rounds_per_call"] == 2 and r["queued_calls"] == 2
    # 2 untimed calls + 1 synced + 2 queued, 2 rounds each, one token a round (AR): 10 more slots than 8 + 1.
    with pytest.raises(RuntimeError, match="max_len of 16 slots"):
        harness.engine_rounds(eng, harness.random_state(cfg, 1, 16, 8), (), rounds=2, repeats=1, queue=2)


def test_rounds_samples_in_the_round_loops(tmp_path, capsys):
    """bench.rounds --sampling: the engine's AR, DFlash (rejection sampling) and DDTree (sampled walks) loops
    sample at the given temperature, top-k and top-p, recorded in the JSON; malformed values are refused."""
    from bench import rounds
    out = tmp_path / "rounds.json"
    rounds.main(["--config", "tiny", "--context", "32", "--phases", "ar,dflash,ddtree", "--rounds-only", "--k", "1",
                 "--rounds", "2", "--ar-rounds", "2", "--round-budget", "4", "--sampling", "0.8,5,0.9",
                 "--out", str(out)])
    res = json.loads(out.read_text())
    assert res["sampling"] == dict(temperature=0.8, top_k=5, top_p=0.9)
    assert {"ar_round_device_loop", "dflash_round", "ddtree4_round"} <= set(res["phases"]), sorted(res["phases"])
    capsys.readouterr()
    for bad in ("0.8,2.5", "-1", "0.8,5,0.9,1", "hot"):
        with pytest.raises(SystemExit):
            rounds.main(["--config", "tiny", "--sampling", bad])
        assert f"--sampling {bad!r}" in capsys.readouterr().err


@pytest.mark.slow
def test_rounds_phases_and_partial_json(tmp_path):
    """bench.rounds on the tiny config: the chosen groups only, every phase in the JSON it rewrites."""
    from bench import rounds
    out = tmp_path / "rounds.json"
    rounds.main(["--config", "tiny", "--context", "32", "--phases", "ar,ddtree,mtp", "--budgets", "4",
                 "--round-budget", "4", "--mtp-tokens", "1", "--k", "1", "--rounds", "2", "--ar-rounds", "3",
                 "--out", str(out)])
    res = json.loads(out.read_text())
    ph = res["phases"]
    assert ph["ar_round_device_loop"]["rounds_per_call"] == 3 and ph["ddtree4_round"]["rounds_per_call"] == 2
    for key in ("ar_step", "ar_round_device_loop", "draft", "verify_tree5", "accept_commit_tree5", "ddtree4_round",
                "mtp_step", "mtp_draft_k1", "mtp1_round"):
        _positive(ph[key], "median_ms")
    for key in ("ar_round_device_loop", "ddtree4_round", "mtp1_round"):         # the engine's device loop
        _positive(ph[key], "queued_median_ms")
    for key in ("draft", "verify_tree5", "accept_commit_tree5", "mtp_step"):     # the phases timed alone
        _positive(ph[key], "device_ms", "kernels")
    assert "dflash_round" not in ph and "verify_chain16" not in ph
    assert res["vs_ar_step"]["ar_step"] == 1.0 and set(res["vs_ar_step"]) >= {"ddtree4_round", "mtp1_round"}
    assert not (tmp_path / "rounds.json.tmp").exists()
    with pytest.raises(SystemExit):
        rounds.main(["--config", "tiny", "--phases", "ar,eagle"])
    rounds.main(["--config", "tiny", "--context", "32", "--phases", "dflash", "--rounds-only", "--k", "1",
                 "--rounds", "2", "--out", str(out)])
    res = json.loads(out.read_text())
    ph, tiny_bytes = res["phases"], res["weight_bytes_per_step"]
    assert set(ph) == {"ar_step", "draft", "dflash_round"}, sorted(ph)
    assert res["sampling"] == dict(temperature=0.0, top_k=0, top_p=1.0)
    # The demo pair's shapes (18.56M-parameter target; fp32: 4 bytes a weight, ~140x the tiny config's).
    rounds.main(["--config", "demo", "--dtype", "float32", "--context", "32", "--phases", "dflash", "--rounds-only",
                 "--k", "1", "--rounds", "2", "--out", str(out)])
    res = json.loads(out.read_text())
    assert res["config"] == "demo" and set(res["phases"]) == {"ar_step", "draft", "dflash_round"}
    assert 20 * tiny_bytes < res["weight_bytes_per_step"] < 4 * 18.56e6, (tiny_bytes, res["weight_bytes_per_step"])
    # Several contexts: one table per context, each with its own ratios to the AR step there.
    rounds.main(["--config", "tiny", "--context", "24,40", "--phases", "mtp", "--mtp-tokens", "1", "--k", "1",
                 "--rounds", "2", "--out", str(out)])
    res = json.loads(out.read_text())
    assert set(res["contexts"]) == {"24", "40"} and "phases" not in res
    for c in ("24", "40"):
        assert set(res["contexts"][c]) == {"ar_step", "mtp_step", "mtp_draft_k1", "mtp1_round"}
        assert res["ratios"][c]["vs_ar_step"]["ar_step"] == 1.0


@pytest.mark.slow
def test_rounds_times_a_ddtree_round_at_each_round_budget(tmp_path, capsys):
    """--round-budget 3,5: one process times a DDTree round at each budget (one phase each); bad lists are
    refused by the flag's name."""
    from bench import rounds
    out = tmp_path / "rounds.json"
    rounds.main(["--config", "tiny", "--context", "32", "--phases", "ddtree", "--rounds-only", "--round-budget", "3,5",
                 "--k", "1", "--rounds", "2", "--out", str(out)])
    ph = json.loads(out.read_text())["phases"]
    assert set(ph) == {"ar_step", "draft", "ddtree3_round", "ddtree5_round"}, sorted(ph)
    for key in ("ddtree3_round", "ddtree5_round"):
        _positive(ph[key], "median_ms", "queued_median_ms")
    for bad in ("x", "0", "", "4,-1"):
        with pytest.raises(SystemExit):
            rounds.main(["--config", "tiny", "--phases", "ddtree", "--round-budget", bad])
        assert "--round-budget" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("graphed", [False, True])
def test_rounds_trace_ar_compares_the_step_and_the_device_loop(tmp_path, monkeypatch, graphed):
    """--trace-ar: both AR forms profiled (on a CPU, the host's XLA thunks), per step / round, and their
    difference by part; a loop compiled to a CUDA graph (as on the GPU by default) is named as not traced, not
    compared; without the ar group it is refused."""
    from bench import rounds
    monkeypatch.setattr(rounds, "loop_is_graphed", lambda spec: graphed)
    out = tmp_path / "rounds.json"
    rounds.main(["--config", "tiny", "--context", "32", "--phases", "ar", "--trace-ar", "--k", "1", "--rounds", "2",
                 "--ar-rounds", "2", "--out", str(out)])
    tr = json.loads(out.read_text())["phases"]["ar_trace"]
    if graphed:
        assert "CUDA graph" in tr["ar_round_device_loop"]["not_traced"] and "loop_minus_step" not in tr
        _positive(tr["ar_step"], "kernel_ms_per_step", "span_ms_per_step", "kernels_per_step")
        return
    for form in ("ar_step", "ar_round_device_loop"):
        _positive(tr[form], "kernel_ms_per_step", "span_ms_per_step", "kernels_per_step")
        assert tr[form]["top_kernels"] and sum(tr[form]["by_part_ms"].values()) > 0
    d = tr["loop_minus_step"]
    assert np.isclose(d["span_ms_per_step"],
                      tr["ar_round_device_loop"]["span_ms_per_step"] - tr["ar_step"]["span_ms_per_step"])
    assert np.isclose(sum(d["by_part_ms"].values()), d["kernel_ms_per_step"], atol=1e-6)
    with pytest.raises(SystemExit):
        rounds.main(["--config", "tiny", "--phases", "dflash", "--trace-ar"])


@pytest.mark.slow
@pytest.mark.parametrize("graphed", [False, True])
def test_rounds_trace_rounds_charges_kernels_to_stages(tmp_path, monkeypatch, graphed):
    """--trace-rounds: a DDTree round loop profiled (on a CPU, the host's XLA thunks) per round, its kernels
    charged to the round's stages (the tree build apart from the rest of the draft) summing to the kernel time; a
    loop compiled to a CUDA graph is named as not traced; without dflash / ddtree it is refused."""
    from bench import harness, rounds
    monkeypatch.setattr(rounds, "loop_is_graphed", lambda spec: graphed)
    out = tmp_path / "rounds.json"
    rounds.main(["--config", "tiny", "--context", "32", "--phases", "ddtree", "--rounds-only", "--k", "1",
                 "--rounds", "2", "--round-budget", "8", "--budgets", "8", "--trace-rounds", "--out", str(out)])
    tr = json.loads(out.read_text())["phases"]["ddtree8_trace"]
    if graphed:
        assert "CUDA graph" in tr["not_traced"]
        return
    _positive(tr, "kernel_ms_per_step", "span_ms_per_step", "kernels_per_step")
    stages = tr["by_stage"]
    for st in ("draft", "build", "verify", "commit", "draft_update"):
        assert stages[st]["ms_per_step"] > 0 and stages[st]["kernels_per_step"] > 0, st
    assert set(stages) <= set(harness.STAGES) | {"loop", "unmapped", "unattributed"}
    assert np.isclose(sum(v["ms_per_step"] for v in stages.values()), tr["kernel_ms_per_step"], rtol=1e-6)
    assert np.isclose(sum(k["ms_per_step"] for k in tr["kernels"]), tr["kernel_ms_per_step"], rtol=1e-6)
    import gzip
    with gzip.open(f"{out}.ddtree8_trace.hlo.txt.gz", "rt") as f:
        assert "/build/" in f.read()                       # the loop's optimized HLO, with the stage names
    with pytest.raises(SystemExit):
        rounds.main(["--config", "tiny", "--phases", "ar", "--trace-rounds"])


def test_stage_names_are_scoped_and_restored():
    """named_stages names the round's stages while tracing and puts every function back after; stage_of takes
    the innermost stage of an op's name."""
    import jaxspec.ddtree
    import jaxspec.engine as E
    from bench import harness
    from jaxspec.dflash import DFlash
    from jaxspec.model import Qwen35
    before = (E.accept, E.commit, Qwen35.__call__, jaxspec.dflash.build_tree, "propose" in DFlash.__dict__,
              DFlash.update)
    import jax.numpy as jnp
    spec = object.__new__(DFlash)
    logp = jax.nn.log_softmax(jax.random.normal(jax.random.key(0), (1, 4, 16)), -1)
    with harness.named_stages(spec):
        assert E.accept is not before[0] and E.commit is not before[1] and DFlash.update is not before[5]
        build = jax.jit(lambda lp, a: jaxspec.dflash.build_tree(lp, a, 4))
        hlo = build.lower(logp, jnp.ones((1,), jnp.int32)).as_text(debug_info=True)
    after = (E.accept, E.commit, Qwen35.__call__, jaxspec.dflash.build_tree, "propose" in DFlash.__dict__,
             DFlash.update)
    assert after == before and jaxspec.ddtree.build_tree is before[3]
    assert 'build/' in hlo                                      # the build's ops carry its stage
    assert harness.stage_of("jit(_run_rounds)/while/body/draft/build/reduce") == "build"
    assert harness.stage_of("jit(_run_rounds)/while/body/verify/gdn/dot_general") == "verify"
    assert harness.stage_of("jit(_run_rounds)/while/body/add") == "loop"
    assert harness.stage_of("attn (from operands a b)") == "unattributed"
    assert harness.stage_of(None) == "unmapped"


def test_device_time_of_a_multi_device_call_is_the_busiest_devices():
    """A tensor-parallel call runs on its GPUs at once: its device time is the busiest GPU's kernel time, not
    the sum over GPUs (which read 52 ms for an 11.5 ms TP = 4 verify); one device's is reported as before."""
    ev = lambda *ms: [(0.0, m * 1e6, "k", "op") for m in ms]        # noqa: E731  (start, duration ns, ...)
    two_steps = [ev(3, 3), ev(4, 4, 1), ev(2)]                      # three devices, 2 traced calls
    assert profile.busiest(two_steps, 2) == dict(device_ms=4.5, kernels=1.5, devices=3)
    assert profile.busiest([ev(1, 2)], 1) == dict(device_ms=3.0, kernels=2.0)
    r = profile.device_time(lambda: jax.numpy.ones(8).sum(), 2)     # host-only trace on the CPU: as before
    assert set(r) == {"device_ms", "kernels"} and r["device_ms"] >= 0


def test_tree_build_bench_times_each_budget(tmp_path, monkeypatch, capsys):
    """bench.tree_build: one timing per budget, with the device time, its longest kernels and its HLO; bad
    budgets refused by flag."""
    from bench import tree_build
    from jaxspec import ddtree
    monkeypatch.setenv("JAXSPEC_DDTREE_TOP_K", "count")
    for v in FRACTION_VARS:       # unset for this test and restored after it (the bench sets one)
        monkeypatch.setenv(v, "")
        monkeypatch.delenv(v)
    out = tmp_path / "tb.json"
    assert tree_build.main(["--vocab", "300", "--depth", "3", "--budgets", "7,8", "--k", "2", "--out", str(out),
                            "--kernels", "3", "--hlo-dir", str(tmp_path / "hlo"), "--variants", "plain,materialized"]) == 0
    res = json.loads(out.read_text())
    assert set(res["runs"]) == {"b7", "b8", "b7_materialized", "b8_materialized"}
    assert all(r["median_ms"] > 0 for r in res["runs"].values())
    assert "HloModule" in (tmp_path / "hlo" / "tree_build_b8_materialized.hlo.txt").read_text()
    lp = jax.numpy.zeros((1, 3, 300))
    barriers = {}
    for v in tree_build.VARIANTS:      # the counted top-k's inputs behind barriers of their own, and only within
        with tree_build.variant(v):
            barriers[v] = str(jax.make_jaxpr(lambda x: ddtree.build_tree(x, jax.numpy.ones((1,), "int32"), 7))(lp))
    assert barriers["materialized"].count("optimization_barrier") > barriers["plain"].count("optimization_barrier")
    assert ddtree.count_ranks.__module__ == "jaxspec.ddtree"
    top = res["runs"]["b7"]["top_kernels"]      # on a CPU: the host's XLA thunks stand in for kernels
    assert 0 < len(top) <= 3 and top[0]["us_per_call"] >= top[-1]["us_per_call"] > 0
    assert "HloModule" in (tmp_path / "hlo" / "tree_build_b8.hlo.txt").read_text()
    assert res["top_k"] == "count"
    assert res["machine"]["mem_fraction"] == MEM_FRACTION      # 90% of the GPU, as the other benches
    with pytest.raises(SystemExit):
        tree_build.main(["--budgets", "0"])
    assert "--budgets" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="--variants"):
        tree_build.main(["--variants", "fast"])


def _profiled_with_aliases(tmp_path, argv, name):
    """bench.verify_profile on the tiny config with --hlo: its summary, the parameter numbers the compiled program
    aliases to its outputs (from the HLO module's header) and the count of decoding state arrays."""
    import gzip

    from bench import verify_profile
    verify_profile.main(["--config", "tiny", "--context", "32", "--hlo", "--out", str(tmp_path)] + argv)
    d = json.loads((tmp_path / f"{name}.json").read_text())
    header = gzip.open(tmp_path / f"{name}.hlo.txt.gz", "rt").readline()
    aliased = [int(p) for p in re.findall(r"\{[\d, ]+\}: \((\d+), \{\}, may-alias\)", header)]
    cfg = harness.tiny_config()
    n_state = 1 + 2 * len(cfg.full_layers) + 2 * len(cfg.linear_layers)    # length, keys, values, conv, ssm
    return d, aliased, n_state


def test_verify_profile_commit_threads_a_donated_state(tmp_path):
    """bench.verify_profile --commit profiles accept + commit as the engine's round loop runs it: the decoding
    state is donated (every state array aliased to its output in the compiled program, so nothing is copied
    whole first) and threaded from call to call."""
    d, aliased, n_state = _profiled_with_aliases(tmp_path, ["--nodes", "9", "--tree", "--commit", "--steps", "3"],
                                                 "commit-tree9")
    assert d["phase"] == "accept_commit" and d["kernel_ms_per_step"] > 0
    assert sorted(aliased) == list(range(n_state)), aliased


def test_verify_profile_threads_a_donated_state_through_the_verify(tmp_path):
    """bench.verify_profile (the verify itself) runs it as the engine's round loop does: every decoding state array
    is donated (aliased to an output of the compiled program, so the KV caches are not copied whole first)."""
    d, aliased, n_state = _profiled_with_aliases(tmp_path, ["--nodes", "5", "--steps", "2"], "verify-chain5")
    assert d["phase"] == "verify" and d["kernel_ms_per_step"] > 0
    assert len(aliased) == n_state, aliased


def test_verify_profile_charges_a_tree_verify_to_parts(tmp_path):
    """bench.verify_profile on the tiny config (on a CPU, the host's XLA thunks are the kernels): a 17-node
    DDTree-shaped verify, profiled, its time charged to parts and written as verify-tree17.json."""
    from bench import verify_profile
    verify_profile.main(["--config", "tiny", "--context", "32", "--nodes", "17", "--tree", "--steps", "1",
                         "--out", str(tmp_path)])
    d = json.loads((tmp_path / "verify-tree17.json").read_text())
    assert d["nodes"] == 17 and d["tree"] and d["phase"] == "verify"
    assert d["kernel_ms_per_step"] > 0 and d["kernels_per_step"] > 0 and d["top_kernels"]
    assert abs(sum(p["ms_per_step"] for p in d["by_part"].values()) - d["kernel_ms_per_step"]) < 1e-6 * max(
        1.0, d["kernel_ms_per_step"]) + 1e-3
