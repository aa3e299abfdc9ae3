"""bench.rounds' flags: bad values refused by name at parse time (before any weights are made), the cache sized for
the phases the run times, its JSON written whole."""

import json

import pytest

from bench import rounds


@pytest.fixture
def no_run(monkeypatch):
    """A run that gets past its flags fails the test at once (instead of timing for seconds, then failing)."""
    def started(msg):
        raise AssertionError(f"the run started: {msg}")
    monkeypatch.setattr(rounds, "log", started)


def refused(argv, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        rounds.main(argv)
    assert e.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--k", "0"], "--k: must be >= 1, got 0"),                              # was: ZeroDivisionError after the setup
    (["--rounds", "0", "--ar-rounds", "0"], "--rounds: must be >= 1, got 0"),
    (["--ar-rounds", "0"], "--ar-rounds: must be >= 1, got 0"),
    (["--budgets", "x"], "--budgets 'x': expected integers"),                # was: ValueError
    (["--budgets", "-3"], "--budgets '-3': expected integers >= 1"),         # was: failed after the setup
    (["--mtp-tokens", "0"], "--mtp-tokens '0': expected integers >= 1"),
    (["--max-len", "0"], "--max-len: must be >= 1, got 0"),                  # was: the default
    (["--config", "no/such/model"], "--config 'no/such/model': "),          # was: a ConfigError traceback
    (["--context", "16,16"], "--context: 16 given more than once in '16,16'"),  # was: timed twice, one kept
    (["--context", "2147483648"], "--context: expected token counts below 2**31"),   # was: an OverflowError
    # was: timed, though Engine.generate refuses a context past the model's limit (max_position_embeddings)
    (["--config", "real", "--context", "1024,259943"], "--context 259943: + 2202 slots the timed calls take past it "
     "exceeds the model's context limit (max_position_embeddings 262144); at most 259942"),
    (["--config", "demo", "--context", "3875", "--phases", "ar", "--ar-rounds", "10"],
     "--context 3875: + 222 slots the timed calls take past it exceeds the model's context limit "
     "(max_position_embeddings 4096); at most 3874"),
])
def test_bad_values_are_refused_by_name_before_the_run(argv, message, capsys, no_run):
    err = refused(argv, capsys)
    assert message in err and "Traceback" not in err, err


def test_bad_out_is_refused_before_the_run(tmp_path, capsys, no_run):
    """--out: a directory (was: a stray DIR.tmp after the whole run) or under a file, refused at parse time."""
    (tmp_path / "adir").mkdir()
    (tmp_path / "afile").write_text("")
    assert "--out " in refused(["--out", str(tmp_path / "adir")], capsys)
    assert "is not a directory" in refused(["--out", str(tmp_path / "afile" / "r.json")], capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "afile"]


@pytest.mark.parametrize("argv, need, counted", [
    # The AR group alone: the AR loop's 22 calls x 2 rounds, not the default --budgets up to 512 (was: 1140).
    (["--context", "64", "--phases", "ar", "--k", "2", "--rounds", "2", "--ar-rounds", "2"], 110,
     "the AR loop's 22 calls x --ar-rounds = 44"),
    # --rounds-only: no tree build, so no --budgets either; the round's tree is its block of 16 (was: 1092).
    (["--context", "32", "--phases", "ddtree", "--rounds-only", "--round-budget", "4", "--k", "1", "--rounds", "2"],
     100, "(--k + 1) blocks of 16 + --rounds x (largest tree 16 + 1) = 66"),
])
def test_the_cache_is_sized_for_the_phases_that_run(argv, need, counted, capsys, no_run):
    err = refused(argv + ["--max-len", "10"], capsys)
    assert f"--max-len 10: the timed calls need {need} slots (context " in err and counted in err, err


def test_help_names_a_config_path(capsys):
    with pytest.raises(SystemExit):
        rounds.main(["--help"])
    assert "config.json" in capsys.readouterr().out


def test_help_shows_the_defaults(capsys):
    with pytest.raises(SystemExit):
        rounds.main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    for shown in ("compiles once (default: 1024)", "ddtree{B}_round; default: 64)", "to time (default: 1,3,5)",
                  "always runs (default: ar,dflash,ddtree,mtp)"):
        assert shown in out, shown


@pytest.mark.slow
def test_the_needed_slots_suffice_and_the_json_is_written_whole(tmp_path):
    """At exactly the slots it asks for, the AR group runs every round; --out in a directory yet to be made."""
    out = tmp_path / "new" / "r.json"
    rounds.main(["--context", "64", "--phases", "ar", "--k", "2", "--rounds", "2", "--ar-rounds", "2", "--max-len",
                 "110", "--dtype", "float32", "--out", str(out)])
    res = json.loads(out.read_text())
    assert res["max_len"] == 110 and res["phases"]["ar_round_device_loop"]["rounds_per_call"] == 2
    assert [p.name for p in out.parent.iterdir()] == ["r.json"]


def test_an_unknown_phase_group_is_named_before_the_trace_flags(capsys, no_run):
    """--phases ar,dflsh --trace-rounds: the typo is named (was: "--trace-rounds needs the dflash or ddtree group")."""
    err = refused(["--phases", "ar,dflsh", "--trace-rounds"], capsys)
    assert "--phases: unknown group(s) ['dflsh']" in err and "--trace-rounds" not in err.splitlines()[-1], err


def test_a_rerun_keeps_a_finished_result_and_records_its_settings(tmp_path, monkeypatch):
    """A rerun that fails after its first phase leaves a finished earlier --out whole (was: overwritten by the AR
    step's phase) and its own phases in OUT.partial, complete: false, with the dtype and the run's settings; a
    rerun that completes replaces it (complete: true) and removes OUT.partial."""
    out = tmp_path / "r.json"
    out.write_text('{"earlier": "complete"}')
    argv = ["--context", "16", "--phases", "ar", "--k", "1", "--rounds", "1", "--ar-rounds", "2", "--dtype", "float32",
            "--max-len", "64", "--out", str(out)]

    def boom(*a, **k):
        raise RuntimeError("boom")
    monkeypatch.setattr(rounds.H, "engine_rounds", boom)
    with pytest.raises(RuntimeError, match="boom"):
        rounds.main(argv)
    assert json.loads(out.read_text()) == {"earlier": "complete"}
    part = json.loads((tmp_path / "r.json.partial").read_text())
    assert part["complete"] is False and part["phases"]["ar_step"]["k"] == 1 and part["dtype"] == "float32"
    s = part["settings"]
    assert (s["k"], s["rounds"], s["ar_rounds"], s["phases"], s["max_len"], s["context"]) == (1, 1, 2, "ar", 64, "16")
    assert {"budgets", "round_budget", "sampling", "mtp_tokens", "rounds_only", "dtype"} <= set(s)

    monkeypatch.setattr(rounds.H, "engine_rounds", lambda *a, **k: dict(median_ms=1.0))
    rounds.main(argv)
    res = json.loads(out.read_text())
    assert res["complete"] is True and res["phases"]["ar_round_device_loop"] == {"median_ms": 1.0}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_a_cache_the_device_cannot_hold_stops_before_any_timing(tmp_path, monkeypatch, capsys):
    """Where the pool reports fewer free bytes than one target state and drafter cache of --max-len slots (on an
    80 GB card at 128K the run stalled for 9 min, bench/results/2026-12-05-h100-s57/), the run stops with the
    sizes, before any phase and with nothing written to --out."""
    from jaxspec import sharding
    monkeypatch.setattr(sharding, "device_room", lambda devices: (1000, 2000))
    out = tmp_path / "r.json"
    with pytest.raises(SystemExit) as e:
        rounds.main(["--context", "64", "--phases", "ar", "--k", "2", "--ar-rounds", "2", "--max-len", "110", "--out",
                     str(out)])
    assert str(e.value).startswith("error: a target state and a drafter cache of max_len 110 (the longest --context "
                                   "64 and the timed calls' room) needs ") and "--context values" in str(e.value)
    assert "ar_step" not in capsys.readouterr().err and not out.exists()
