"""bench/tp_table.py: the #9 table from bench.tp JSONs (merging files of one TP degree, ratios, tok/s, refusals)."""

import json
from pathlib import Path

import pytest

from bench import tp_table


def result(tmp_path, name, tp, timings, commit="abc1234", allreduce=None, **extra):
    r = dict(kind="tp", config="real", tp=tp, budget=64, git=dict(commit=commit), date="2026-11-30",
             machine=dict(device_count=tp, device_kind="NVIDIA H200"), timings=timings,
             allreduce={k: dict(ms_per_round=v) for k, v in (allreduce or {}).items()}, layers=64, dtype="bfloat16",
             total_s=100.0, complete=True, skipped=[])
    r.update(extra)
    p = tmp_path / name
    p.write_text(json.dumps(r))
    return str(p)


def test_table_merges_ratios_and_tokens(tmp_path):
    files = [result(tmp_path, "a.json", 1, {"1024": {"ar_round": {"median_ms": 16.0}}}),
             result(tmp_path, "b.json", 1, {"1024": {"dflash_round": {"median_ms": 20.0}}}),
             result(tmp_path, "c.json", 4, {"1024": {"ar_round": {"median_ms": 8.0}, "dflash_round": {"median_ms": 15.0}}},
                    allreduce={"ar_round": 1.234})]
    out = tmp_path / "new" / "T.md"         # its directory made
    assert tp_table.main(files + ["--tau", "10", "--out", str(out)]) == 0
    text = out.read_text()
    assert "| AR round | 1K | 16.00 | 8.00 | 0.50 | 62 | 125 |" in text        # 1 token / 16 ms, / 8 ms
    assert "| DFlash round | 1K | 20.00 | 15.00 | 0.75 | 500 | 667 |" in text   # 10 tokens / 20 ms, / 15 ms
    assert not [l for l in text.splitlines() if l.startswith(("| verify", "| DDTree"))]   # rows not timed: none
    assert "- TP = 4: ar_round 1.23" in text


def test_table_refuses_mixed_commits_and_missing_tp1(tmp_path):
    a = result(tmp_path, "a.json", 1, {})
    b = result(tmp_path, "b.json", 2, {}, commit="fff0000")
    with pytest.raises(SystemExit, match="b.json.*differs"):
        tp_table.main([a, b])
    with pytest.raises(SystemExit, match="no TP = 1"):
        tp_table.main([result(tmp_path, "c.json", 2, {})])
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(SystemExit, match="bad.json: not a readable"):
        tp_table.main([str(bad)])


def test_table_refuses_mixed_layers_or_dtype_naming_both_files(tmp_path):
    a = result(tmp_path, "a.json", 1, {})
    for i, extra in enumerate([dict(layers=16), dict(dtype="float32")]):
        b = result(tmp_path, f"b{i}.json", 2, {}, **extra)
        with pytest.raises(SystemExit, match=rf"b{i}.json: .*layers, dtype.*differs from .*a.json"):
            tp_table.main([a, b])


def test_table_refuses_incomplete_runs_naming_the_file(tmp_path):
    a = result(tmp_path, "a.json", 1, {})
    late = result(tmp_path, "late.json", 2, {}, complete=False, skipped=["ar_round@32768"])
    with pytest.raises(SystemExit, match=r"late.json: an incomplete .*ar_round@32768"):
        tp_table.main([a, late])
    cut = tmp_path / "cut.json"         # an interrupted run of an older bench.tp: no total_s, no complete
    cut.write_text(json.dumps({k: v for k, v in json.loads(Path(a).read_text()).items()
                               if k not in ("total_s", "complete")}))
    with pytest.raises(SystemExit, match="cut.json: an incomplete"):
        tp_table.main([a, str(cut)])


@pytest.mark.parametrize("where", ["missing/dir/T.md", "."])
def test_table_refuses_an_unwritable_out_in_one_line(tmp_path, monkeypatch, capsys, where):
    """--out in a directory that cannot be made (a file stands in its path) or naming a directory: the parser's
    one line, before the table is made; the usage names the module."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "missing").write_text("a file, not a directory")
    a = result(tmp_path, "a.json", 1, {"1024": {"ar_round": {"median_ms": 16.0}}})
    with pytest.raises(SystemExit) as e:
        tp_table.main([a, "--out", where])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--out" in err and "python -m bench.tp_table" in err, err


def test_table_refuses_mixed_dirty_flags_or_jaxspec_flags_naming_both_files(tmp_path):
    """Runs of one commit but another dirty flag or other JAXSPEC_* flags did not time the same code (was: merged
    silently); the header says dirty and the flags of what it merged."""
    flags = {"JAXSPEC_TREE_ATTENTION": "reference"}
    a = result(tmp_path, "a.json", 1, {"1024": {"ar_round": {"median_ms": 16.0}}},
               git=dict(commit="abc1234", dirty=False), machine=dict(device_count=1, jaxspec_flags={}))
    for i, extra in enumerate([dict(git=dict(commit="abc1234", dirty=True)),
                               dict(machine=dict(device_count=2, device_kind="NVIDIA H200", jaxspec_flags=flags))]):
        b = result(tmp_path, f"b{i}.json", 2, {}, **({"git": dict(commit="abc1234", dirty=False),
                                                      "machine": dict(device_count=2, jaxspec_flags={})} | extra))
        with pytest.raises(SystemExit, match=rf"b{i}.json: .*dirty.*JAXSPEC_\* flags.*differs from .*a.json"):
            tp_table.main([a, b])
    same = [result(tmp_path, f"c{tp}.json", tp, {"1024": {"ar_round": {"median_ms": 16.0 / tp}}},
                   git=dict(commit="abc1234", dirty=True), machine=dict(device_count=tp, jaxspec_flags=flags))
            for tp in (1, 2)]
    out = tmp_path / "T.md"
    assert tp_table.main(same + ["--out", str(out)]) == 0
    head = out.read_text().splitlines()[0]
    assert "commit abc1234 (dirty)" in head and "JAXSPEC_TREE_ATTENTION=reference" in head, head


@pytest.mark.parametrize("tau", ["-5", "0", "nan"])
def test_table_refuses_a_tau_that_is_not_positive(tmp_path, capsys, tau):
    a = result(tmp_path, "a.json", 1, {"1024": {"ar_round": {"median_ms": 16.0}}})
    with pytest.raises(SystemExit) as e:
        tp_table.main([a, "--tau", tau])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"--tau: must be > 0, got {tau}" in err, err


def test_help_says_the_default_tau(capsys):
    with pytest.raises(SystemExit):
        tp_table.main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "tokens per DFlash / DDTree round for the tok/s columns (default: 9.18)" in out, out
