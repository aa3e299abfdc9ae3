"""bench/tree_build.py's flags and JSON: bad numbers and unusable --out refused at parse time, a missing --out
directory made, and the result carrying its commit, machine and date (the README's promise for bench results)."""

import json

import pytest

from bench import tree_build


@pytest.mark.parametrize("flags, message", [(["--k", "0"], "--k: must be >= 1"),
                                            (["--kernels", "-1"], "--kernels: must be >= 0"),
                                            (["--out", "."], "--out .: is a directory"),
                                            (["--budgets", "0"], "--budgets: expected positive tree budgets, got '0'")])
def test_tree_build_refuses_at_parse_time(flags, message, capsys):
    with pytest.raises(SystemExit) as e:
        tree_build.main(["--vocab", "300", "--depth", "3", "--budgets", "7", "--k", "2"] + flags)
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err, err


def test_tree_build_out_file_under_a_file_refused(tmp_path, capsys):
    (tmp_path / "f").write_text("a file, not a directory")
    with pytest.raises(SystemExit) as e:
        tree_build.main(["--vocab", "300", "--depth", "3", "--budgets", "7", "--out", str(tmp_path / "f" / "tb.json")])
    assert e.value.code == 2 and "not a directory" in capsys.readouterr().err


def test_tree_build_json_in_a_new_directory_has_commit_machine_and_date(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXSPEC_DDTREE_TOP_K", "count")
    out = tmp_path / "missing" / "tb.json"
    assert tree_build.main(["--vocab", "300", "--depth", "3", "--budgets", "7", "--k", "2", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert set(res["runs"]) == {"b7"} and res["runs"]["b7"]["median_ms"] > 0
    assert res["git"]["commit"] and res["machine"]["device_count"] >= 1 and res["date"].startswith("20")
    assert res["versions"]["jax"] and res["versions"]["jaxlib"]
    assert res["machine"]["jaxspec_flags"] == {"JAXSPEC_DDTREE_TOP_K": "count"}


def test_tree_build_hlo_dir_that_is_a_file_refused(tmp_path, capsys):
    """--hlo-dir naming a file (or under one): the parser's error before any build (was: a FileExistsError
    traceback after the first budget's timing, and no JSON)."""
    (tmp_path / "f").write_text("a file, not a directory")
    for where in (tmp_path / "f", tmp_path / "f" / "hlo"):
        with pytest.raises(SystemExit) as e:
            tree_build.main(["--vocab", "300", "--depth", "3", "--budgets", "7", "--k", "1", "--hlo-dir", str(where),
                             "--out", str(tmp_path / "tb.json")])
        err = capsys.readouterr().err
        assert e.value.code == 2 and f"--hlo-dir {where}: " in err and "tree_build B=" not in err, err
    assert not (tmp_path / "tb.json").exists()
