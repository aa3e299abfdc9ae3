"""bench/cli.py: the flag checks the benchmark CLIs share."""

import argparse
import json
import os

import pytest

from bench import cli


def parser():
    ap = argparse.ArgumentParser(prog="bench.x")
    ap.add_argument("--k", type=cli.at_least(1), default=3)
    ap.add_argument("--lr", type=cli.at_least(0, float), default=0.5)
    return ap


@pytest.mark.parametrize("argv, message", [(["--k", "0"], "--k: must be >= 1, got 0"),
                                           (["--k", "x"], "--k: expected an integer, got 'x'"),
                                           (["--lr", "-1"], "--lr: must be >= 0, got -1"),
                                           (["--lr", "a"], "--lr: expected a number, got 'a'"),
                                           # was: accepted (nan < 0 is False), failing later or never ending
                                           (["--lr", "nan"], "--lr: must be a finite number >= 0, got nan"),
                                           (["--lr", "inf"], "--lr: must be a finite number >= 0, got inf"),
                                           (["--lr", "1e400"], "--lr: must be a finite number >= 0, got 1e400")])
def test_at_least_names_the_flag_and_the_bound(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        parser().parse_args(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert parser().parse_args(["--k", "1", "--lr", "0"]).k == 1


def test_writable_file(tmp_path, capsys, monkeypatch):
    ap = parser()
    cli.writable_file(ap, "--out", None)
    cli.writable_file(ap, "--out", str(tmp_path / "new" / "deeper" / "r.json"))    # parents made when written
    (tmp_path / "old.json").write_text("{}")
    cli.writable_file(ap, "--out", str(tmp_path / "old.json"))
    (tmp_path / "f").write_text("")
    locked = tmp_path / "locked"
    locked.mkdir()
    cases = [((str(tmp_path),), {}, "is a directory"),
             ((str(tmp_path / "old.json"),), {"must_not_exist": True}, "exists; name a new file"),
             ((str(tmp_path / "f" / "r.json"),), {}, "is not a directory")]
    for args, kw, message in cases:
        with pytest.raises(SystemExit):
            cli.writable_file(ap, "--out", *args, **kw)
        err = capsys.readouterr().err
        assert f"--out {args[0]}: " in err and message in err, err
    # a dir the user cannot write (root can write anywhere, so its answer is the one os.access gives a user)
    access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if str(p) == str(locked) else access(p, mode))
    with pytest.raises(SystemExit):
        cli.writable_file(ap, "--out", str(locked / "r.json"))
    assert f"--out {locked / 'r.json'}: {locked} is not writable" in capsys.readouterr().err


def test_write_json_is_whole_or_not_at_all(tmp_path, monkeypatch):
    path = tmp_path / "sub" / "r.json"
    cli.write_json(path, {"a": 1})
    assert json.loads(path.read_text()) == {"a": 1}
    with pytest.raises(TypeError):
        cli.write_json(path, {"a": object()})               # fails while encoding: the old file stays
    assert json.loads(path.read_text()) == {"a": 1} and sorted(p.name for p in path.parent.iterdir()) == ["r.json"]


@pytest.mark.parametrize("module,argv", [
    ("bench.harness", ["--out", "{tmp}/h.json"]), ("bench.rounds", []), ("bench.table", ["--out", "{tmp}/t"]),
    ("bench.tp", []), ("bench.tp_table", ["{tmp}/a.json"]), ("bench.tree_build", []), ("bench.verify_profile", []),
    ("bench.tap_probe", ["--target", "{tmp}", "--text", "{tmp}", "--eval-text", "{tmp}", "--out", "{tmp}/p.json"]),
    ("pallas_kernels.gdn_decode.bench", []), ("pallas_kernels.gdn_tree_inputs.bench", []),
    ("pallas_kernels.gdn_commit.bench", []), ("pallas_kernels.conv_commit.bench", []),
    ("pallas_kernels.add_rms_norm.bench", []),
    ("pallas_kernels.skinny_matmul.bench", []), ("pallas_kernels.tree_attention.bench", []),
    ("pallas_kernels.tree_delta_rule.bench", []), ("pallas_kernels.verify.bench", []),
])
def test_every_benchmark_refuses_a_bad_flag_value_before_any_work(module, argv, tmp_path, monkeypatch, capsys):
    """An op's flag set to a value it does not take is the parser's one-line error (an op's value was first checked
    when the model was traced, and bench.table checked only after all its parts had run)."""
    import importlib
    monkeypatch.setenv("JAXSPEC_VERIFY", "bogus")
    with pytest.raises(SystemExit) as e:
        importlib.import_module(module).main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.strip().splitlines()[-1].endswith(
        "error: JAXSPEC_VERIFY='bogus': expected one of reference, xla, pallas_triton, pallas_interpret"), err
    assert not any(tmp_path.iterdir())                  # nothing written


@pytest.mark.parametrize("argv, message", [
    (["--sizes", "abc"], "--sizes: expected integers separated by commas, got 'abc'"),
    (["--sizes", "0"], "--sizes: expected positive block sizes, got '0'"),
    (["--sizes", "16,16"], "--sizes: 16 given more than once in '16,16'; give each once"),
    (["--layers", "0"], "argument --layers: must be >= 1, got 0"),
    (["--iters", "0"], "argument --iters: must be >= 1, got 0"),
])
def test_a_layer_bench_refuses_bad_sizes_layers_and_iters_naming_the_flag(argv, message, capsys):
    """bench.harness.layer_bench (the GDN tree inputs' bench): a bad --sizes / --layers / --iters is the parser's
    error naming the flag, before any input is built (not a traceback from int(), max() of nothing or the
    percentile of no timings, nor a 0-node row)."""
    from bench import harness
    built = []
    with pytest.raises(SystemExit) as e:
        harness.layer_bench(argv, "doc", {}, lambda n, layers: built.append(n), None, 2)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.strip().splitlines()[-1].endswith(message), err
    assert built == []


def test_exit_with_passes_the_status_and_ends_ctrl_c_quietly(capsys):
    """`python -m bench.X`: an int status is the exit status, a returned result (harness's dict) is success, and
    Ctrl-C is one "interrupted" line and 130 (was: a KeyboardInterrupt traceback and 1)."""
    from bench.cli import exit_with

    def interrupted():
        raise KeyboardInterrupt
    for main, status in ((lambda: 3, 3), (lambda: {"complete": True}, 0), (lambda: None, 0), (interrupted, 130)):
        with pytest.raises(SystemExit) as e:
            exit_with(main)
        assert e.value.code == status
    assert capsys.readouterr().err == "\ninterrupted\n"


def test_a_layer_bench_returns_every_layers_outputs(monkeypatch, tmp_path):
    """Each timed call returns every layer's outputs, so XLA cannot drop the work of an earlier layer that the next
    one does not read (session 77: the GDN tree inputs' reference timed 1.4 us a layer against 7.3 for the kernel,
    where in verify the kernel was the faster); the error and the bytes are the last layer's."""
    import jax.numpy as jnp

    from bench import harness
    seen = []
    timed = harness.time_kernel

    def recording(run, iters):
        t = timed(run, iters)
        seen.append(t["out"])
        return t
    monkeypatch.setattr(harness, "time_kernel", recording)
    op = lambda x, w: (x @ w, jnp.tanh(x))
    link = lambda args, out: (args[0] + 1e-3 * out[1][:, :1],) + args[1:]
    stack_for = lambda n, layers: [(jnp.full((n, 4), i + 1.0), jnp.eye(4)) for i in range(layers)]
    rows = harness.layer_bench(["--sizes", "2", "--layers", "3", "--iters", "1", "--json", str(tmp_path / "r.json")],
                               "doc", {"op": op}, stack_for, link, 3)
    (outs,) = seen
    assert len(outs) == 3 and all(len(o) == 2 for o in outs)
    assert float(outs[0][0][0, 0]) == 1.0 and float(outs[2][0][0, 0]) > 3.0        # layer 3 saw layer 2's output
    assert rows[0]["bytes_per_layer"] == (2 * 4 + 16 + 2 * 4 + 2 * 4) * 4              # x, w in; x @ w, tanh x out


def test_the_add_rms_norm_bench_times_both_and_chains_the_residual_stream(monkeypatch, tmp_path):
    """pallas_kernels.add_rms_norm.bench on a CPU: a row per row count and implementation (the reference, the kernel
    at 4 and 8 warps, interpret mode), the kernel within bf16 rounding of the reference, and in each traced call
    after the first, x is the previous call's x + u (the stream the model carries) while u and w are its own."""
    from pallas_kernels.add_rms_norm import bench, pallas_triton
    calls, kernel = [], pallas_triton.add_rms_norm

    def spy(x, u, w, **kw):
        out = kernel(x, u, w, **kw)
        calls.append((x, u, w, out))
        return out
    monkeypatch.setattr(pallas_triton, "add_rms_norm", spy)
    rows = bench.main(["--sizes", "1,2", "--layers", "3", "--iters", "1", "--json", str(tmp_path / "r.json")])
    assert [(r["n"], r["impl"]) for r in rows] == [(n, i) for n in (1, 2)
                                                     for i in ("reference", "pallas_triton", "pallas_triton/w8")]
    assert all(r["rel_err_vs_reference"] < 1e-2 and r["bytes_per_layer"] > 0 for r in rows)
    assert json.loads((tmp_path / "r.json").read_text())["layers"] == 3
    assert len(calls) >= 2 * 2 * 3 and len(calls) % 3 == 0     # each (size, kernel row) traced, 3 calls a trace
    for first in range(0, len(calls), 3):
        trace = calls[first:first + 3]
        for prev, nxt in zip(trace, trace[1:]):
            assert nxt[0] is prev[3][0] and nxt[1] is not prev[1] and nxt[2] is not prev[2]


def test_the_gdn_decode_bench_returns_every_layers_outputs():
    """pallas_kernels.gdn_decode.bench.stacked: every layer's outputs (its new states too), not the last one's."""
    import jax.numpy as jnp

    from pallas_kernels.gdn_decode import bench
    op = lambda x, s: (x * 2.0, s + x.sum())
    outs = bench.stacked(op, 3)([(jnp.ones((1, 2)), jnp.zeros(())) for _ in range(3)])
    assert len(outs) == 3 and [float(o[1]) for o in outs] == pytest.approx([2.0, 2.004, 2.004008])
