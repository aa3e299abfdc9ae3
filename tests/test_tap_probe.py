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
