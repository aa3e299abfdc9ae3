"""bench/tp_table.py: the #9 table from bench.tp JSONs (merging files of one TP degree, ratios, tok/s, refusals)."""

import json

import pytest

from bench import tp_table


def result(tmp_path, name, tp, timings, commit="abc1234", allreduce=None):
    r = dict(kind="tp", config="real", tp=tp, budget=64, git=dict(commit=commit), date="2026-11-30",
             machine=dict(device_count=tp, device_kind="NVIDIA H200"), timings=timings,
             allreduce={k: dict(ms_per_round=v) for k, v in (allreduce or {}).items()})
    p = tmp_path / name
    p.write_text(json.dumps(r))
    return str(p)


def test_table_merges_ratios_and_tokens(tmp_path):
    files = [result(tmp_path, "a.json", 1, {"1024": {"ar_round": {"median_ms": 16.0}}}),
             result(tmp_path, "b.json", 1, {"1024": {"dflash_round": {"median_ms": 20.0}}}),
             result(tmp_path, "c.json", 4, {"1024": {"ar_round": {"median_ms": 8.0}, "dflash_round": {"median_ms": 15.0}}},
                    allreduce={"ar_round": 1.234})]
    out = tmp_path / "T.md"
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
