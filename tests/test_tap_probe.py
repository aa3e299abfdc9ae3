"""bench/tap_probe.py: the probe learns a map that exists, and the CLI runs end to end on the demo target."""

import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from bench import tap_probe

DEMO = Path(__file__).resolve().parents[1] / "jaxspec" / "demo" / "target"


def test_probe_learns_a_linear_rule_through_the_head():
    rng = np.random.default_rng(0)
    head = jnp.asarray(rng.normal(size=(8, 32)), jnp.float32)
    x = rng.normal(size=(4096, 12)).astype(np.float32)
    true_w = rng.normal(size=(12, 8)).astype(np.float32)
    y = np.asarray(jnp.argmax(jnp.asarray(x @ true_w) @ head, -1))
    w, b = tap_probe.fit_probe(x, y, head, epochs=8, batch=256, lr=3e-2)
    acc = float((np.asarray(jnp.argmax((jnp.asarray(x) @ w + b) @ head, -1)) == y).mean())
    chance = np.bincount(y).max() / len(y)
    assert acc > 0.8 and acc > chance + 0.3, (acc, chance)


def test_cli_writes_every_tap_set(tmp_path):
    files = sorted(str(p) for p in (Path(__file__).resolve().parents[1] / "jaxspec").glob("*.py"))
    out = tmp_path / "probe.json"
    assert tap_probe.main(["--target", str(DEMO), "--text", *files[:8], "--eval-text", *files[8:12],
                           "--prompts", "40", "--eval-prompts", "8", "--prompt-len", "32", "--gen", "30",
                           "--epochs", "1", "--taps", "1,4,6;7", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert [r["taps"] for r in res["results"]] == [[1, 4, 6], [7]]
    assert all(0.0 <= r["eval_agreement"] <= 1.0 for r in res["results"])
    with pytest.raises(SystemExit, match="0..7"):
        tap_probe.main(["--target", str(DEMO), "--text", files[0], "--eval-text", files[0], "--taps", "8",
                        "--out", str(out)])


def test_probe_fits_fewer_rows_than_a_batch():
    """300 rows with the default batch of 1024: each step is one minibatch of all of them (it used to take no
    step at all and return the initial weights)."""
    rng = np.random.default_rng(1)
    head = jnp.asarray(rng.normal(size=(8, 32)), jnp.float32)
    x = rng.normal(size=(300, 12)).astype(np.float32)
    y = np.asarray(jnp.argmax(jnp.asarray(x @ rng.normal(size=(12, 8)).astype(np.float32)) @ head, -1))
    w, b = tap_probe.fit_probe(x, y, head, epochs=60, lr=3e-2)
    acc = float((np.asarray(jnp.argmax((jnp.asarray(x) @ w + b) @ head, -1)) == y).mean())
    assert acc > np.bincount(y).max() / len(y) + 0.3, acc


@pytest.mark.parametrize("flags, message", [
    (["--taps", "1,x"], "--taps '1,x'"), (["--epochs", "0"], "--epochs"), (["--gen", "1"], "--gen"),
    (["--target", "/nonexistent"], "--target /nonexistent: "), (["--out", "."], "directory")])
def test_cli_refuses_bad_flags_in_one_line(tmp_path, capsys, flags, message):
    """Bad --taps or numbers, a target that is not a checkpoint, an --out that is a directory: the parser's one
    line, exit status 2, before (or instead of) the fits."""
    argv = ["--target", str(DEMO), "--text", __file__, "--eval-text", __file__, "--prompts", "4", "--eval-prompts", "2",
            "--prompt-len", "8", "--gen", "4", "--out", str(tmp_path / "p.json")]
    with pytest.raises(SystemExit) as e:
        tap_probe.main(argv + flags)
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and "Traceback" not in err, err
