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


def test_bench_tp_layers_and_methods(tmp_path):
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
    rc = tp.main(["--config", "tiny", "--dtype", "float32", "--tp", "2", "--contexts", "40", "--budget", "4",
                  "--rounds", "2", "--skip-identity", "--methods", "dflash", "--out", str(out)])
    assert rc == 0 and set(json.loads(out.read_text())["timings"]["40"]) == {"dflash_round"}
    with pytest.raises(SystemExit, match="unknown.*mtp"):
        tp.main(["--config", "tiny", "--methods", "ar,mtp", "--skip-identity"])


def test_bench_tp_identity_only(tmp_path):
    """--contexts '' checks TP = 1 vs TP = 2 identity and times no rounds (#9's identity call)."""
    out = tmp_path / "tp.json"
    rc = tp.main(["--config", "tiny", "--dtype", "float32", "--tp", "2", "--contexts", "", "--budget", "4",
                  "--prompt", "12", "--new", "6", "--identity-layers", "2", "--out", str(out)])
    res = json.loads(out.read_text())
    assert rc == 0 and res["timings"] == {} and res["contexts"] == []
    assert set(res["identity"]) == {"ar", "dflash", "ddtree4"}
    assert all(v["identical"] for v in res["identity"].values()), res["identity"]
