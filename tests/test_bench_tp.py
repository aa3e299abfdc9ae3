"""bench/tp.py at the tiny shape on 4 of the 8 simulated CPU devices: TP = 1 vs TP = 4 token identity for
AR, DFlash and DDTree, every timing phase and the all-reduce estimate, in the JSON."""

import json

import pytest

from bench import tp


@pytest.mark.slow
def test_bench_tp_tiny(tmp_path):
    out = tmp_path / "tp.json"
    rc = tp.main(["--config", "tiny", "--dtype", "float32", "--tp", "4", "--contexts", "48,96", "--budget", "8",
                  "--prompt", "20", "--new", "12", "--rounds", "4", "--k", "2", "--identity-layers", "2",
                  "--profile", str(tmp_path / "prof"), "--out", str(out)])
    res = json.loads(out.read_text())
    assert rc == 0
    assert set(res["identity"]) == {"ar", "dflash", "ddtree8"}
    assert all(v["identical"] for v in res["identity"].values()), res["identity"]
    for ctx in ("48", "96"):
        assert set(res["timings"][ctx]) == {"ar_round", "dflash_round", "ddtree8_round", "verify16", "verify9"}
    assert res["allreduce"]["ar_round"]["ms_per_round"] > 0
    for name in ("ar", "dflash", "ddtree"):       # one trace per method at the first context
        assert (tmp_path / "prof" / f"{name}_rounds.xplane.pb").stat().st_size > 0, res.get("profile")
    assert res["git"]["commit"] and res["machine"]["device_count"] == 8 and res["date"]
    assert res["skipped"] == [] and res["identity_layers"] == 2 and res["identity_dtype"] == "float32"


def test_bench_tp_layers_and_methods(tmp_path, capsys):
    """--layers times a model of the first N layers (the all-reduce plan counts them); --methods keeps only
    the rounds named; an unknown method is refused before any work."""
    out = tmp_path / "tp.json"
    rc = tp.main(["--config", "tiny", "--dtype", "float32", "--tp", "2", "--contexts", "40", "--budget", "4",
                  "--rounds", "2", "--k", "1", "--skip-identity", "--layers", "2", "--methods", "ar,verify",
                  "--out", str(out)])
    res = json.loads(out.read_text())
    assert rc == 0 and res["layers"] == 2
    assert set(res["timings"]["40"]) == {"ar_round", "verify16", "verify5"}
    assert res["allreduce"]["ar_round"]["ops"] == [{"shape": [1, 1, 64], "count": 5}]
    # "layers" is read off the model sharded and timed (was: the flag echoed, whatever was built)
    assert res["allreduce"]["ar_round"]["ops"][0]["count"] == 2 * res["layers"] + 1
    rc = tp.main(["--config", "tiny", "--dtype", "float32", "--tp", "2", "--contexts", "40", "--budget", "4",
                  "--rounds", "2", "--skip-identity", "--methods", "dflash", "--out", str(out)])
    assert rc == 0 and set(json.loads(out.read_text())["timings"]["40"]) == {"dflash_round"}
    with pytest.raises(SystemExit) as e:
        tp.main(["--config", "tiny", "--methods", "ar,mtp", "--skip-identity"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--methods ar,mtp: unknown ['mtp']" in err, err


def test_bench_tp_identity_only(tmp_path):
    """--contexts '' checks TP = 1 vs TP = 2 identity and times no rounds (#9's identity call)."""
    out = tmp_path / "tp.json"
    rc = tp.main(["--config", "tiny", "--dtype", "float32", "--tp", "2", "--contexts", "", "--budget", "4",
                  "--prompt", "12", "--new", "6", "--identity-layers", "2", "--out", str(out)])
    res = json.loads(out.read_text())
    assert rc == 0 and res["timings"] == {} and res["contexts"] == []
    assert set(res["identity"]) == {"ar", "dflash", "ddtree4"}
    assert all(v["identical"] for v in res["identity"].values()), res["identity"]


@pytest.mark.parametrize("flags, message", [
    (["--contexts=-64"], "--contexts: expected positive"), (["--contexts", "abc"], "--contexts: expected integers"),
    (["--prompt", "0"], "--prompt: must be >= 1"), (["--tp", "0"], "--tp: must be >= 1"),
    (["--tp", "16"], "needs 16 devices"), (["--tp", "3"], "--tp 3"), (["--deadline-s", "-1"], "--deadline-s"),
    (["--config", "/nonexistent/config.json"], "--config: /nonexistent/config.json"), (["--out", "."], "directory")])
def test_bench_tp_refuses_bad_flags_at_once(flags, message, capsys):
    """Nonsense flags, a TP degree the devices or heads cannot take, a config or --out that cannot be used: one
    line naming the flag and exit status 2, before any model is made."""
    with pytest.raises(SystemExit) as e:
        tp.main(["--config", "tiny", "--skip-identity", "--methods", "ar", "--budget", "4"] + flags)
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and "Traceback" not in err, err


def test_bench_tp_config_path_keeps_its_shape(tmp_path, monkeypatch):
    """A config.json --config is timed at its own shape: the tiny config's TP overrides (vocab 509, 8 heads)
    are for 'tiny' only."""
    from tests.conftest import TINY
    (tmp_path / "config.json").write_text(json.dumps(dict(TINY, model_type="qwen3_5_text")))
    seen = {}

    def stop(cfg, tp_):
        seen["cfg"] = cfg
        raise SystemExit("stopped")
    monkeypatch.setattr(tp.S, "check_target", stop)
    with pytest.raises(SystemExit, match="stopped"):
        tp.main(["--config", str(tmp_path / "config.json"), "--skip-identity", "--contexts", ""])
    assert (seen["cfg"].vocab_size, seen["cfg"].num_heads, seen["cfg"].linear_num_value_heads) == (512, 4, 6)


@pytest.mark.parametrize("degree", [3, 6, 8])
def test_bench_tp_config_path_shards_as_far_as_the_target_does(tmp_path, monkeypatch, degree):
    """The bench's own tiny drafter (for a config.json --config) has heads for --tp: a target that shards 8 or 6
    ways is not refused for a drafter the user never chose (it had 4 q / 2 kv heads, so past TP = 4 it was)."""
    from tests.conftest import TINY
    config = dict(TINY, model_type="qwen3_5_text", num_attention_heads=24, intermediate_size=192,
                  num_key_value_heads=6 if degree != 8 else 2, linear_num_key_heads=24, linear_num_value_heads=48)
    (tmp_path / "config.json").write_text(json.dumps(config))
    seen = {}

    def stop(*a, **kw):
        seen["ok"] = True
        raise SystemExit("stopped after the checks")
    real = tp.S.check_drafter
    monkeypatch.setattr(tp.S, "check_drafter", lambda cfg, d: (seen.update(drafter=cfg), real(cfg, d)))
    monkeypatch.setattr(tp, "run", stop)
    with pytest.raises(SystemExit, match="stopped after the checks"):
        tp.main(["--config", str(tmp_path / "config.json"), "--tp", str(degree), "--skip-identity", "--contexts", "",
                 "--methods", "ar"])
    assert seen["ok"] and seen["drafter"].num_heads % degree == 0, seen


def test_bench_tp_deadline_zero_is_no_limit_and_records_dtype(tmp_path):
    """--deadline-s 0 skips nothing (as in bench.harness and bench.table); the JSON names the timed dtype and
    layers and says the run completed; no partial file is left beside it."""
    out = tmp_path / "sub" / "tp.json"
    rc = tp.main(["--config", "tiny", "--dtype", "float32", "--tp", "2", "--contexts", "", "--skip-identity",
                  "--budget", "4", "--layers", "2", "--deadline-s", "0", "--out", str(out)])
    res = json.loads(out.read_text())
    assert rc == 0 and res["skipped"] == [] and set(res["allreduce"]) == {"ar_round", "dflash_round", "ddtree4_round"}
    assert res["dtype"] == "float32" and res["layers"] == 2 and res["complete"] is True
    assert not (tmp_path / "sub" / "tp.json.partial").exists()


def test_bench_tp_skipped_phase_fails_loudly_and_keeps_the_old_result(tmp_path, capsys):
    """A phase skipped past --deadline-s: exit status 3, a summary naming it, the earlier --out untouched and the
    partial result (complete: false) in OUT.partial."""
    out = tmp_path / "tp.json"
    out.write_text('{"earlier": "complete"}')
    rc = tp.main(["--config", "tiny", "--tp", "2", "--contexts", "", "--skip-identity", "--budget", "4",
                  "--deadline-s", "1e-9", "--out", str(out)])
    assert rc == 3 and "INCOMPLETE" in capsys.readouterr().err
    assert json.loads(out.read_text()) == {"earlier": "complete"}
    part = json.loads((tmp_path / "tp.json.partial").read_text())
    assert part["complete"] is False and part["skipped"] == ["allreduce"]


def test_bench_tp_failed_rerun_keeps_the_old_result(tmp_path, monkeypatch):
    """A rerun that fails after its first phases leaves a complete earlier --out whole; what it had is in
    OUT.partial, marked complete: false."""
    out = tmp_path / "tp.json"
    out.write_text('{"earlier": "complete"}')

    def boom(*a, **k):
        raise RuntimeError("boom")
    monkeypatch.setattr(tp, "time_rounds", boom)
    with pytest.raises(RuntimeError, match="boom"):
        tp.main(["--config", "tiny", "--tp", "2", "--contexts", "40", "--skip-identity", "--budget", "4",
                 "--out", str(out)])
    assert json.loads(out.read_text()) == {"earlier": "complete"}
    part = json.loads((tmp_path / "tp.json.partial").read_text())
    assert part["complete"] is False and part["allreduce"] and "total_s" not in part


@pytest.fixture
def no_model(monkeypatch):
    """A run that gets past its flags fails the test at once (instead of making models for minutes, then failing)."""
    def started(*a, **k):
        raise AssertionError("the run started")
    monkeypatch.setattr(tp, "log", started)
    monkeypatch.setattr(tp.R, "random_pair", started)


@pytest.mark.parametrize("flags, message", [
    (["--layers", "10"], "--layers 10: the tiny config has 4 layers"),                   # was: ConfigError traceback
    (["--layers", "1"], "--layers 1: the drafter taps 2 target layers"),                # was: exit 1 after the identity
    (["--identity-layers", "1"], "--identity-layers 1: the drafter taps 2 target layers"),
    (["--identity-layers", "5"], "--identity-layers 5: the tiny config has 4 layers"),
    (["--methods", "ar,eagle"], "--methods ar,eagle: unknown ['eagle']"),               # was: exit 1
    (["--profile", "FILE"], "--profile FILE: "),                                         # was: FileExistsError late
    (["--tp", "16"], "--tp 16: needs 16 devices")])                                      # was: "--tp 16 --dp 1"
def test_bench_tp_refuses_what_it_cannot_build_before_any_work(flags, message, tmp_path, capsys, no_model):
    """Layer counts the config or the drafter's taps cannot take, an unknown method, a --profile path that is a file:
    the parser's one line naming the flag (exit 2; exit 1 means "tokens differ"), before any model is made."""
    (tmp_path / "f").write_text("a file, not a directory")
    flags = [str(tmp_path / "f") if a == "FILE" else a for a in flags]
    with pytest.raises(SystemExit) as e:
        tp.main(["--config", "tiny", "--tp", "2", "--contexts", "40", "--budget", "4"] + flags)
    err = capsys.readouterr().err
    message = message.replace("FILE", str(tmp_path / "f"))
    assert e.value.code == 2 and message in err and "Traceback" not in err and "--dp" not in err, err
