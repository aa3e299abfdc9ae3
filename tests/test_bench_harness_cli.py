"""The flags of bench.harness, bench.verify_profile and bench.profile: nonsense refused at parse time (before any
timing) in one line, results that say when and where they were made, and a rerun that never destroys a finished
result (tiny config, CPU)."""

from __future__ import annotations

import importlib
import json
import re
import shutil

import jax
import jax.numpy as jnp
import pytest

from bench import harness, profile, verify_profile

# Everything small: where a check is missing, the run finishes in seconds and the test fails on its result.
SMALL = ["--config", "tiny", "--copy-gib", "0.001", "--matmul-n", "64", "--ceiling-iters", "1", "--warmup", "0",
         "--iters", "1", "--pipelined", "1", "--prefill-warmup", "0", "--prefill-iters", "1", "--prompt", "0"]


def _refused(main, argv, flag, capsys):
    """main(argv) stops at the parser (exit 2) with one error line naming `flag`."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2, err
    line = err.strip().splitlines()[-1]
    assert "error:" in line and flag in line, err
    assert "Traceback" not in err
    return line


@pytest.mark.parametrize("bad, flag", [(["--contexts", "-5"], "--contexts"), (["--contexts", "abc"], "--contexts"),
                                       (["--batch", "0"], "--batch"), (["--prompt", "-3"], "--prompt"),
                                       (["--iters", "0"], "--iters"), (["--copy-gib", "0"], "--copy-gib"),
                                       (["--breakdown", "--contexts", ""], "--breakdown"),
                                       (["--profile-prefill"], "--profile-prefill"),
                                       (["--prefill-chunks", "64"], "--prefill-chunks"),
                                       (["--prompt", "8", "--prefill-chunks", "0"], "--prefill-chunks"),
                                       (["--config", "nosuch"], "--config"), (["--out", "DIR"], "--out"),
                                       # were: accepted, then measured twice / an OverflowError / a hang or error
                                       (["--contexts", "16,16"], "--contexts"),
                                       (["--contexts", "2147483648"], "--contexts"),
                                       (["--copy-gib", "inf"], "--copy-gib"),
                                       # were: no decode to apply to, yet recorded in the JSON as if applied
                                       (["--contexts", "", "--profile-steps", "1"], "--profile-steps"),
                                       (["--contexts", "", "--loop-steps", "2"], "--loop-steps"),
                                       (["--dump-dir", "DIR/d"], "--dump-dir"),
                                       (["--contexts", "", "--prompt", "8", "--dump-dir", "DIR/d"], "--dump-dir")])
def test_harness_refuses_nonsense_before_timing(tmp_path, capsys, bad, flag):
    out = tmp_path / "h.json"
    bad = [a.replace("DIR", str(tmp_path)) for a in bad]
    _refused(harness.main, SMALL + ["--contexts", "16", "--out", str(out)] + bad, flag, capsys)
    assert not out.exists()


def test_harness_rerun_keeps_a_finished_result(tmp_path, monkeypatch):
    """A rerun that fails leaves the earlier result whole and its own phases in OUT.partial, marked incomplete; a
    rerun that completes replaces it (complete: true) and removes OUT.partial. Without an earlier result, the
    failed run's file says it is incomplete."""
    good = tmp_path / "good.json"
    earlier = dict(harness="bench.harness", decode=[dict(context=1024)], prefill=dict(prompt=8))
    good.write_text(json.dumps(earlier))
    partial = tmp_path / "good.json.partial"

    def boom(*a, **k):
        raise RuntimeError("prefill failed")
    monkeypatch.setattr(harness, "run_prefill", boom)
    with pytest.raises(RuntimeError, match="prefill failed"):
        harness.main(SMALL + ["--contexts", "16", "--prompt", "8", "--out", str(good)])
    assert json.loads(good.read_text()) == earlier
    p = json.loads(partial.read_text())
    assert p["complete"] is False and [d["context"] for d in p["decode"]] == [16] and "prefill" not in p

    fresh = tmp_path / "fresh.json"
    with pytest.raises(RuntimeError, match="prefill failed"):
        harness.main(SMALL + ["--contexts", "", "--prompt", "8", "--out", str(fresh)])
    f = json.loads(fresh.read_text())
    assert f["complete"] is False and f["matmul"]["tflop_s"] > 0 and not (tmp_path / "fresh.json.partial").exists()

    monkeypatch.undo()
    harness.main(SMALL + ["--contexts", "16", "--out", str(good)])
    r = json.loads(good.read_text())
    assert r["complete"] is True and [d["context"] for d in r["decode"]] == [16] and not partial.exists()
    assert sorted(x.name for x in tmp_path.iterdir()) == ["fresh.json", "good.json"]


def test_harness_deadline_lists_every_phase_it_skips(tmp_path):
    """--deadline-s also skips each context's profile and device loop: they are listed in `skipped`."""
    out = tmp_path / "h.json"
    res = harness.main(SMALL + ["--contexts", "16", "--loop-steps", "2", "--profile-steps", "1", "--prompt", "8",
                                "--breakdown", "--deadline-s", "1e-9", "--out", str(out)])
    assert res["skipped"] == ["profile ctx=16", "device_loop ctx=16", "prefill", "breakdown"]
    d = res["decode"][0]
    assert "profile" not in d and "device_loop" not in d and d["state_length_ok"]
    assert json.loads(out.read_text())["skipped"] == res["skipped"]


def _options(help_text: str) -> dict[str, str]:
    """{flag: its help text} from argparse's --help."""
    opts, cur = {}, None
    for line in help_text.split("options:", 1)[1].splitlines():
        m = re.match(r"\s{2}(-\S+)(.*)", line)
        if m:
            cur = m.group(1).rstrip(",")
            opts[cur] = m.group(2)
        elif cur:
            opts[cur] += " " + line.strip()
    return opts


def test_harness_help_documents_every_flag_and_its_default(capsys):
    with pytest.raises(SystemExit):
        harness.parse_args(["--help"])
    opts = _options(capsys.readouterr().out)
    for flag in ("--batch", "--warmup", "--prefill-warmup", "--prefill-iters", "--matmul-n", "--ceiling-iters"):
        assert flag in opts and "(default:" in opts[flag], (flag, opts.get(flag))
    assert "(default: 8192)" in opts["--matmul-n"] and "device loop" in opts["--deadline-s"]
    assert "--prefill-chunks" in opts["--deadline-s"]               # it skips those engine prefills too
    assert "(default:" not in opts["--out"]                         # required: was "(default: None)"


def test_harness_refuses_contexts_past_the_models_limit_exactly(capsys):
    """--config real (max_position_embeddings 262144): a context, its timed decode steps and the first token must
    fit, as Engine.generate asks of a prompt and its new tokens; the tiny config has no limit."""
    steps = ["--warmup", "2", "--iters", "3", "--pipelined", "4", "--profile-steps", "1", "--loop-steps", "2",
             "--loop-iters", "3"]                      # 2 + 3 + 4 + 1 + (1 + 3) x 2 = 18 steps, + the first token
    ok = ["--config", "real", "--prompt", "262143", "--out", "h.json"] + steps
    assert harness.parse_args(ok + ["--contexts", "1024,262125"]).contexts == [1024, 262125]
    line = _refused(harness.parse_args, ok + ["--contexts", "1024,262126"], "--contexts", capsys)
    assert line.endswith("--contexts 262126: + 19 generated tokens (the first, then one per timed decode step) "
                         "exceeds the model's context limit (max_position_embeddings 262144); at most 262125"), line
    line = _refused(harness.parse_args, ok + ["--contexts", "16", "--prompt", "262144"], "--prompt", capsys)
    assert "the model's context limit (max_position_embeddings 262144); at most 262143" in line, line
    assert harness.parse_args(["--contexts", "300000", "--prompt", "300000", "--out", "h.json"]).prompt == 300000


def test_harness_dump_dir_under_a_file_is_refused_in_one_line(tmp_path, capsys):
    """--dump-dir under a file (was: a NotADirectoryError traceback after the ceilings), or a file itself."""
    (tmp_path / "f").write_text("")
    for d in (tmp_path / "f" / "x", tmp_path / "f"):
        line = _refused(harness.main, SMALL + ["--contexts", "16", "--profile-steps", "1", "--dump-dir", str(d),
                                               "--out", str(tmp_path / "h.json")], "--dump-dir", capsys)
        assert f"--dump-dir {d}: {tmp_path / 'f'} is not a directory" in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


def test_harness_stops_before_timing_where_the_decode_state_cannot_fit(tmp_path, monkeypatch, capsys):
    """Where the pool has fewer free bytes than the weights and the longest context's decode state (was: a JAX
    out-of-memory traceback after the ceilings), the run stops with the sizes, before any timing, nothing written."""
    from jaxspec import sharding
    monkeypatch.setattr(sharding, "device_room", lambda devices: (10 * 2**30, 20 * 2**30))
    monkeypatch.setattr(harness, "measure_copy", lambda *a: pytest.fail("timed before checking the memory"))
    out = tmp_path / "h.json"
    with pytest.raises(SystemExit) as e:
        harness.main(SMALL + ["--contexts", "16,200000000", "--out", str(out)])
    assert str(e.value).startswith("error: the weights and a decode state of max_len 200000128 (the longest --contexts "
                                   "200000000 and the timed steps' room, --batch 1) needs "), e.value
    assert str(e.value).endswith("time fewer or shorter --contexts values") and "\n" not in str(e.value)
    monkeypatch.setattr(sharding, "device_room", lambda devices: (1000, 2000))      # not even the weights
    with pytest.raises(SystemExit) as e:
        harness.main(SMALL + ["--contexts", "16", "--out", str(out)])
    assert str(e.value).startswith("error: the weights of --config tiny needs "), e.value
    assert not out.exists()


@pytest.fixture
def no_model(monkeypatch):
    """verify_profile's weights fail the test: a refusal must come before any work."""
    def work(*a, **k):
        raise AssertionError("verify_profile built the model before checking its flags")
    monkeypatch.setattr(verify_profile, "random_params", work)


@pytest.mark.parametrize("bad, flag", [(["--context", "-4", "--nodes", "5"], "--context"),
                                       (["--nodes", "0"], "--nodes"), (["--steps", "0"], "--steps"),
                                       (["--hlo"], "--hlo"), (["--out", "FILE"], "--out"),
                                       (["--config", "nosuch"], "--config")])
def test_verify_profile_refuses_before_any_work(tmp_path, capsys, no_model, bad, flag):
    (tmp_path / "f").write_text("")
    bad = [str(tmp_path / "f") if a == "FILE" else a for a in bad]
    _refused(verify_profile.main, ["--config", "tiny", "--context", "8", "--nodes", "3", "--steps", "1"] + bad, flag,
             capsys)


def test_verify_profile_prints_the_whole_summary_with_its_date(capsys):
    verify_profile.main(["--config", "tiny", "--context", "8", "--nodes", "3", "--steps", "1"])
    res = json.loads(capsys.readouterr().out)               # all of it, not cut
    assert res["nodes"] == 3 and res["date"].startswith("20") and res["git"]["commit"] and res["machine"]["host"]
    assert res["top_kernels"]


def test_verify_profile_help_names_every_flag(capsys):
    with pytest.raises(SystemExit):
        verify_profile.main(["--help"])
    opts = _options(capsys.readouterr().out)
    for flag in ("--config", "--context", "--nodes", "--steps"):
        assert opts[flag].strip(), flag
    assert "text" not in opts["--out"]


def test_profile_help_says_the_defaults(capsys):
    with pytest.raises(SystemExit):
        profile.main(["--help"])
    opts = _options(capsys.readouterr().out)
    assert "(default: 1)" in opts["--steps"] and "(default: 25)" in opts["--top"], opts


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    """A host-only xplane.pb of two calls of a jitted function, and that function's optimized HLO."""
    d = tmp_path_factory.mktemp("trace")
    step = jax.jit(lambda x: jnp.tanh(x @ x).sum()).lower(jnp.ones((32, 32))).compile()
    (d / "step.hlo.txt").write_text(step.as_text())
    with profile.trace(lambda: step(jnp.ones((32, 32))), 2) as xplane:
        shutil.copy(xplane, d / "step.xplane.pb")
    return str(d / "step.xplane.pb"), str(d / "step.hlo.txt")


def test_profile_refuses_what_it_cannot_honour(trace, tmp_path, capsys):
    xplane, hlo = trace
    assert "/host:CPU" in _refused(profile.main, [xplane, hlo, "--device", "3"], "--device 3", capsys)
    assert "jit_" in _refused(profile.main, [xplane, hlo, "--module", "nosuchmodule"], "--module nosuchmodule", capsys)
    for steps in ("0", "-2"):
        _refused(profile.main, [xplane, hlo, "--steps", steps], "--steps", capsys)
    _refused(profile.main, [hlo, xplane], "XPLANE HLO", capsys)                         # swapped
    _refused(profile.main, [str(tmp_path / "missing.xplane.pb"), hlo], "missing.xplane.pb", capsys)
    _refused(profile.main, [xplane, str(tmp_path / "missing.txt")], "missing.txt", capsys)
    _refused(profile.main, [xplane, hlo, "--json", str(tmp_path)], "--json", capsys)


def _xspace(path, planes) -> str:
    """An xplane.pb of empty planes named `planes` (protobuf by hand: XSpace.planes = 1, XPlane.name = 2)."""
    field = lambda tag, payload: bytes([tag, len(payload)]) + payload      # noqa: E731 (payloads < 128 bytes)
    path.write_bytes(b"".join(field(0x0A, field(0x12, n.encode())) for n in planes))
    return str(path)


def test_profile_refuses_to_merge_device_planes(trace, tmp_path, capsys):
    """A trace of several devices without --device: refused naming the planes and the flag (was: every device's
    kernels summed as one step, busy > span); with --device, that device's kernels."""
    _, hlo = trace
    two = _xspace(tmp_path / "two.xplane.pb", ["/device:GPU:0", "/device:GPU:1", "/host:CPU"])
    line = _refused(profile.main, [two, hlo], "--device", capsys)
    assert "/device:GPU:0, /device:GPU:1" in line, line
    assert profile.main([two, hlo, "--device", "1"])["kernels_per_step"] == 0
    one = _xspace(tmp_path / "one.xplane.pb", ["/device:GPU:0", "/host:CPU"])
    assert profile.main([one, hlo])["kernels_per_step"] == 0                       # one device: nothing to choose


def test_profile_json_made_where_asked_with_commit_machine_and_date(trace, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("JAXSPEC_DDTREE_TOP_K", "count")
    xplane, hlo = trace
    out = tmp_path / "missing" / "p.json"
    s = profile.main([xplane, hlo, "--steps", "2", "--module", "jit", "--json", str(out)])
    d = json.loads(out.read_text())
    assert d["kernels_per_step"] == s["kernels_per_step"] > 0 and d["steps"] == 2
    assert d["git"]["commit"] and d["machine"]["host"] and d["date"].startswith("20") and "/host:CPU" in d["planes"]
    assert d["versions"]["jax"] == jax.__version__ and d["versions"]["jaxlib"]
    assert d["machine"]["jaxspec_flags"] == {"JAXSPEC_DDTREE_TOP_K": "count"}
    with pytest.raises(SystemExit):
        profile.main(["--help"])
    text = capsys.readouterr().out
    assert re.search(r"^\s+xplane\s+\S", text, re.M), text                  # the positional has help
    opts = _options(text)
    assert all(opts[f].strip() for f in ("--module", "--top"))


def test_write_results_is_whole_or_not_at_all_and_makes_its_directory(tmp_path):
    """A kernel bench's --json: a failed write leaves no file and no .tmp (was: a half-written OUT.tmp), and a
    directory yet to be made is made (was: FileNotFoundError after the timing)."""
    out = tmp_path / "new" / "k.json"
    harness.write_results(str(out), [{"us": 1.0}], layers=2)
    d = json.loads(out.read_text())
    assert d["rows"] == [{"us": 1.0}] and d["layers"] == 2 and d["git"]["commit"] and d["jax"] == jax.__version__
    with pytest.raises(TypeError):
        harness.write_results(str(out), [{"us": object()}])
    assert json.loads(out.read_text()) == d and [p.name for p in out.parent.iterdir()] == ["k.json"]


@pytest.mark.parametrize("bench", ["verify", "tree_attention", "tree_delta_rule", "skinny_matmul", "gdn_decode",
                                   "gdn_tree_inputs"])
def test_kernel_benches_refuse_an_unwritable_json_before_timing(bench, tmp_path, capsys, monkeypatch):
    """--json naming a directory or a path under a file: the parser's one line before any timing (was: an error
    after the whole run, its rows lost)."""
    mod = importlib.import_module(f"pallas_kernels.{bench}.bench")

    def timed(*a, **k):
        raise AssertionError("the timing started")
    for m in (mod, harness):
        for name in ("time_kernel", "measure_copy", "copy_bandwidth"):
            if hasattr(m, name):
                monkeypatch.setattr(m, name, timed)
    (tmp_path / "f").write_text("")
    for bad in (str(tmp_path), str(tmp_path / "f" / "k.json")):
        _refused(mod.main, ["--json", bad], "--json", capsys)


def test_harness_dump_dir_has_the_hlo_of_every_context_it_traces(tmp_path):
    """--dump-dir: each traced context's trace and the optimized HLO that names its kernels (was: the HLO of the
    first context only, so bench.profile could not read the others' traces)."""
    d = tmp_path / "dump"
    harness.main(SMALL + ["--contexts", "16,24", "--profile-steps", "1", "--dump-dir", str(d),
                          "--out", str(tmp_path / "h.json")])
    assert sorted(p.name for p in d.iterdir()) == ["hlo_decode_16.txt.gz", "hlo_decode_24.txt.gz",
                                                   "trace_decode_16.xplane.pb", "trace_decode_24.xplane.pb"]


def test_harness_profiles_the_prefill_by_part(tmp_path):
    """--profile-prefill traces one more prefill and charges its kernels to the model's parts (the GDN's delta rule
    among them), and --dump-dir keeps that trace and the prefill's optimized HLO."""
    d = tmp_path / "dump"
    res = harness.main(SMALL[:-2] + ["--contexts", "", "--prompt", "130", "--profile-prefill", "--dump-dir", str(d),
                                     "--out", str(tmp_path / "h.json")])
    prof = res["prefill"]["profile"]
    assert "error" not in prof, prof
    assert prof["kernels_per_step"] > 0 and {"gdn", "attn", "mlp"} <= set(prof["by_part"]), prof["by_part"]
    assert sorted(p.name for p in d.iterdir()) == ["hlo_prefill_130.txt.gz", "trace_prefill_130.xplane.pb"]


def test_harness_times_the_engines_prefill_in_pieces(tmp_path):
    """--prefill-chunks 16,64: the prompt of 70 through Engine.prefill in 5 and 2 pieces (the last one as short as
    its tail needs), after one untimed call, beside the one-piece prefill; its rates from the same formula."""
    res = harness.main(SMALL[:-2] + ["--contexts", "", "--prompt", "70", "--prefill-chunks", "16,64",
                                     "--out", str(tmp_path / "h.json")])
    one, pieces = res["prefill"], res["engine_prefill"]
    assert [(r["chunk"], r["pieces"], r["time"]["n"]) for r in pieces] == [(16, 5, 1), (64, 2, 1)]
    assert [r["sizes"] for r in pieces] == [[16] * 5, [64, 16]]      # engine.prefill_pieces, as Engine.prefill
    for r in pieces:
        assert r["time"]["median_ms"] > 0 and r["first_call_s"] > 0 and r["flops_2NP"] == one["flops_2NP"]
        assert r["tflop_s_2NP"] == pytest.approx(r["flops_2NP"] / (r["time"]["median_ms"] * 1e-3) / 1e12)


def test_ctrl_c_ends_the_harness_without_a_traceback(tmp_path):
    """SIGINT mid-run (`python -m bench.harness`): "interrupted" and status 130, as generate does; the JSON keeps the
    phases saved before it, marked incomplete. It printed a KeyboardInterrupt traceback and exited 1."""
    import os
    import signal
    import subprocess
    import sys
    out = tmp_path / "h.json"
    argv = SMALL[:SMALL.index("--iters")] + ["--iters", "1000000"] + SMALL[SMALL.index("--iters") + 2:]  # minutes
    # as `python -m bench.harness ...` run from a terminal: Python's Ctrl-C handler on even where this test's own
    # process was started with SIGINT ignored (a background job), which the child would inherit
    ctrl_c_on = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
                 "sys.argv[0] = 'bench.harness'; runpy.run_module('bench.harness', run_name='__main__')")
    p = subprocess.Popen([sys.executable, "-c", ctrl_c_on, *argv, "--contexts", "16", "--out", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, PYTHONUNBUFFERED="1"))
    seen = []
    for line in p.stdout:               # the ceilings and the weights are done: the decode's timing has begun
        seen.append(line)
        if "] params:" in line:
            break
    p.send_signal(signal.SIGINT)
    rest, err = p.communicate(timeout=120)
    assert p.returncode == 130, "".join(seen) + rest + err
    assert "Traceback" not in err and err.strip() == "interrupted", err
    saved = json.loads(out.read_text())
    assert saved["complete"] is False and saved["matmul"]["tflop_s"] > 0, saved     # saved before "params:"
