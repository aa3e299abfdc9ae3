"""`python -m jaxspec.train` on the command line, and its loss-curve PNGs (jaxspec/plot.py).

The commands: each bad flag value is refused up front (before any model is read or anything written) with one line
naming the flag and the value, and the least value each check allows goes through; --help states the defaults the
commands use; a rerun of a finished `drafter` run resumes it; checkpoints fall every --ckpt-every steps (0: only at
the end); the progress line of the last step gives the mean loss of the steps it covers.

The PNG: a valid 8-bit RGB file (signature, IHDR fields, CRCs, IDAT, IEND), each loss drawn at its place in the
plot area (first at the left axis, last at the right end, the highest loss at the top, the lowest on the x axis),
the moving average ending at each step, the labels (max, min, number of steps), and losses that are constant, a
single one, not finite or with a gap.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest

from jaxspec import train
from jaxspec import plot
from jaxspec.plot import _GLYPHS, label, loss_curve_png
from test_train import cli_target, drafter_args  # noqa: F401 (cli_target: a fixture)

# ------------------------------------------------------------------------------------------------
# The commands' flags


def offline_drafter(tmp_path, *extra):
    """`drafter` args whose --target does not exist: the flags are checked before it is read, so a run whose flags
    pass ends in an error about the target alone."""
    (tmp_path / "a.py").write_text("def f(x):\n    return x\n" * 20)
    return ["drafter", "--target", str(tmp_path / "no_target"), "--text", str(tmp_path / "a.py"), "--out",
            str(tmp_path / "o"), "--mask-token-id", "1", "--block", "4", "--layers", "1", "--heads", "1",
            "--kv-heads", "1", "--head-dim", "8", "--window", "32", "--batch", "2", "--anchors", "1",
            "--prompt-len", "4", *extra]


def offline_eval(tmp_path, *extra):
    (tmp_path / "a.py").write_text("def f(x):\n    return x\n" * 20)
    return ["eval", "--target", str(tmp_path / "no_target"), "--draft", str(tmp_path / "no_draft"), "--text",
            str(tmp_path / "a.py"), "--out", str(tmp_path / "r.json"), *extra]


@pytest.mark.parametrize("flags,message", [
    (["--n-taps", "0"], "--n-taps 0: must be >= 1"), (["--ffn", "0"], "--ffn 0: must be >= 1"),
    (["--heads", "0"], "--heads 0: must be >= 1"), (["--kv-heads", "0"], "--kv-heads 0: must be >= 1"),
    (["--head-dim", "0"], "--head-dim 0: must be >= 1"), (["--layers", "0"], "--layers 0: must be >= 1"),
    (["--prompt-len", "0"], "--prompt-len 0: must be >= 1"), (["--gen-new", "0"], "--gen-new 0: must be >= 1"),
    (["--shard-mb", "-1"], "--shard-mb -1: must be >= 0"), (["--grow-layers", "-1"], "--grow-layers -1: must be >= 0"),
    (["--val-sequences", "-2"], "--val-sequences -2: must be >= 0"),
    (["--max-epochs", "-1"], "--max-epochs -1: must be >= 0"), (["--max-epochs", "nan"], "--max-epochs nan: must be"),
    (["--time-budget-s", "inf"], "--time-budget-s inf: must be"),
    (["--lr", "inf"], "--lr inf: must be > 0"), (["--lr", "nan"], "--lr nan: must be > 0"),
    (["--gamma", "inf"], "--gamma inf: must be > 0"), (["--gamma", "-1"], "--gamma -1: must be > 0"),
    (["--mask-token-id", "-1"], "--mask-token-id -1: must be >= 0"),
    (["--taps", "2", "-1"], "--taps 2 -1: layer ids must be >= 0"),
    (["--grow-layers", "1"], "--grow-layers needs --init"),
    (["--soft-labels", "-0.1", "--features", "live"], "--soft-labels must be in [0, 1], got -0.1"),
    (["--val-sequences", "1"], "--val-sequences 1: must be 0 or at least --batch (2)"),
    (["--window", "6"], "--window 6: too short for --anchors 1 blocks of 4 tokens after the first --prompt-len - 1 "
                        "= 3 tokens; the least is 7"),
    (["--data", "greedy", "--gen-new", "2"], "--gen-new 2: too short for --anchors 1 blocks of 4 tokens after the "
                                             "first --prompt-len - 1 = 3 tokens; the least is 3")])
def test_drafter_refuses_a_bad_flag_before_reading_the_target(tmp_path, capsys, flags, message):
    assert train.main(offline_drafter(tmp_path, *flags)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err, err
    assert "no_target" not in err and not (tmp_path / "o").exists()


@pytest.mark.parametrize("flags", [
    ["--window", "7"], ["--data", "greedy", "--gen-new", "3"], ["--soft-labels", "1", "--features", "live"],
    ["--val-sequences", "2"], ["--max-epochs", "0"], ["--time-budget-s", "0"], ["--ckpt-every", "0"],
    ["--windows", "0"], ["--grow-layers", "0"], ["--mask-token-id", "0"], ["--taps", "0"]])
def test_drafter_takes_the_least_value_each_check_allows(tmp_path, capsys, flags):
    """The boundary values pass every flag check: the run goes on to read --target (missing here)."""
    assert train.main(offline_drafter(tmp_path, *flags)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and str(tmp_path / "no_target") in err, err
    assert not any(word in err for word in ("must", "too short", "needs")), err


def test_a_missing_text_file_is_one_line_naming_text(tmp_path, capsys):
    gone = tmp_path / "gone.py"
    for args in (offline_drafter(tmp_path), offline_eval(tmp_path)):
        args[args.index("--text") + 1] = str(gone)
        assert train.main(args) == 2
        err = capsys.readouterr().err
        assert err == f"error: --text {gone}: no such file or directory\n", err


@pytest.mark.parametrize("flags,message", [
    (["--budgets", "16", "0"], "--budgets 0: must be >= 1"), (["--ar-rows", "0"], "--ar-rows 0: must be >= 1"),
    (["--prompts", "0"], "--prompts 0: must be >= 1"), (["--max-new", "0"], "--max-new 0: must be >= 1"),
    (["--prompt-len", "0"], "--prompt-len 0: must be >= 1")])
def test_eval_refuses_a_bad_flag_before_reading_the_models(tmp_path, capsys, flags, message):
    assert train.main(offline_eval(tmp_path, *flags)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "no_target" not in err, err


@pytest.mark.parametrize("flags", [["--top-k", "5"], ["--top-p", "0.9"], ["--top-k", "5", "--temperature", "0"]])
def test_eval_refuses_a_sampling_cut_without_a_temperature(tmp_path, capsys, flags):
    """--top-k/--top-p without --temperature > 0 (was: a greedy run, the cut unused): generate's line, before the
    models are read; with a temperature they go on to --target."""
    assert train.main(offline_eval(tmp_path, *flags)) == 2
    assert capsys.readouterr().err == ("error: --top-k/--top-p only apply when sampling (--temperature > 0); greedy "
                                       "takes the argmax\n")
    assert train.main(offline_eval(tmp_path, *flags[:2], "--temperature", "1")) == 2
    assert capsys.readouterr().err == f"error: --target {tmp_path / 'no_target'}: does not exist\n"


def test_eval_says_an_unseen_by_file_is_not_json(tmp_path, capsys):
    """Was only json's "Expecting value: line 1 column 1 (char 0)" after the flag."""
    bad = tmp_path / "results.txt"
    bad.write_text("not json\n")
    assert train.main(offline_eval(tmp_path, "--unseen-by", str(bad))) == 2
    err = capsys.readouterr().err
    assert err == f"error: --unseen-by {bad}: not valid JSON (Expecting value: line 1 column 1 (char 0))\n", err


def test_no_command_names_the_commands(capsys):
    """Was "the following arguments are required: cmd"."""
    with pytest.raises(SystemExit) as e:
        train.main([])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 2 and line.endswith("error: the following arguments are required: {pair,drafter,eval}"), line


def test_eval_refuses_an_out_under_a_file_before_reading_the_models(tmp_path, capsys):
    """eval --out FILE/r.json: one line naming --out (it ran the whole evaluation and then failed to write)."""
    (tmp_path / "f").write_text("x")
    args = offline_eval(tmp_path)
    args[args.index("--out") + 1] = str(tmp_path / "f" / "r.json")
    assert train.main(args) == 2
    err = capsys.readouterr().err
    assert err == f"error: --out {tmp_path / 'f'}: it is a file, not a directory\n", err


@pytest.mark.parametrize("budget", ["0", "inf", "nan"])
def test_pair_refuses_a_time_budget_that_is_not_positive_and_finite(tmp_path, capsys, budget):
    assert train.main(["pair", "--tiny", "--out", str(tmp_path / "o"), "--time-budget-s", budget]) == 2
    assert f"--time-budget-s {budget}: must be > 0" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("flags", [["--vocab", "258"], ["--target-share", "0.18"], ["--target-layers", "4"],
                                   ["--target-max-epochs", "0", "--ckpt-every", "0", "--package-text", "0"],
                                   ["--part-mb", "1", "--gen-sequences", "1", "--gen-batch", "1"]])
def test_pair_takes_the_least_value_each_check_allows(tmp_path, monkeypatch, flags):
    """The boundary values pass `pair`'s checks: it goes on to read the corpus (caught there, nothing trains)."""
    class Caught(Exception):
        pass

    def corpus():
        raise Caught
    monkeypatch.setattr(train, "stdlib_files", corpus)
    with pytest.raises(Caught):
        train.main(["pair", "--tiny", "--out", str(tmp_path / "o"), *flags])


def _helps():
    import argparse
    sub = next(a for a in train.parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {(name, a.option_strings[0]): a.help for name, p in sub.choices.items() for a in p._actions
            if a.option_strings}


def test_pair_help_states_the_sizes_it_uses_with_and_without_tiny():
    helps, full, tiny = _helps(), train.full_sizes(), train.tiny_sizes()
    for flag, field in (("--gen-sequences", "gen_n"), ("--gen-batch", "gen_batch"),
                        ("--drafter-layers", "draft_layers"), ("--vocab", "vocab")):
        said = f"default: {getattr(full, field)}, --tiny {getattr(tiny, field)}"
        assert said in helps["pair", flag], (flag, said, helps["pair", flag])
    assert "both (mixed, the default)" in helps["pair", "--drafter-data"]
    assert full.d_data == tiny.d_data == "mixed"


def test_drafter_help_says_what_text_is_for_each_data():
    """--text said "to cut prompts from", which is --data greedy's use; the default corpus data is the text itself."""
    text = " ".join(_helps()["drafter", "--text"].split())
    assert "with --data corpus (the default), the corpus the target is teacher-forced over" in text, text
    assert "with --data greedy, the text the --sequences prompts are cut from" in text, text


def test_drafter_default_ffn_and_taps_are_those_its_help_states(cli_target, tmp_path, monkeypatch):  # noqa: F811
    """--ffn (default: 3 x hidden) and --n-taps (default: N_TAPS, or L - 2 where that is fewer), as the run records
    them for its checkpoints, caught where its Trainer is made (nothing trains)."""
    class Caught(Exception):
        pass
    seen = {}

    def trainer(loss_fn, params, frozen, batch_at, **kw):
        seen.update(kw)
        raise Caught
    monkeypatch.setattr(train, "Trainer", trainer)
    helps = _helps()
    assert "default: 3 x hidden" in helps["drafter", "--ffn"]
    assert f"default: {train.N_TAPS}, or L - 2 where that is fewer" in helps["drafter", "--n-taps"]
    with pytest.raises(Caught):
        train.main(drafter_args(cli_target, tmp_path / "o"))
    hidden, layers = train.tiny_sizes().target.hidden_size, train.tiny_sizes().target.num_layers
    assert seen["config"]["--ffn"] == 3 * hidden
    assert seen["config"]["--taps"] == list(train.spread_taps(layers, min(train.N_TAPS, layers - 2)))


def test_checkpoints_every_n_steps_progress_and_a_rerun_of_a_finished_run(cli_target, tmp_path, capsys):  # noqa: F811
    """--ckpt-every 2 over 5 steps saves steps 2, 4 and 5 (Orbax keeps the last two), --ckpt-every 0 only the last;
    the last step's progress line gives the mean loss of the steps since the previous line; the same command again
    resumes the finished run (nothing to train) and exports it again."""
    import json
    out = tmp_path / "o"
    assert train.main(drafter_args(cli_target, out, "--steps", "5", "--ckpt-every", "2")) == 0
    err = capsys.readouterr().err
    assert sorted(p.name for p in (out / "ckpt" / "meta").iterdir()) == ["4.json", "5.json"]
    losses = json.loads((out / "ckpt" / "meta" / "5.json").read_text())["losses"]
    assert len(losses) == 5 and len(set(losses)) == 5
    assert f"drafter: step 5/5 loss {np.mean(losses):.4f} |g| " in err, err
    (out / "drafter" / "config.json").unlink()
    assert train.main(drafter_args(cli_target, out, "--steps", "5", "--ckpt-every", "2")) == 0
    err = capsys.readouterr().err
    assert f"drafter: resumed from {out / 'ckpt'} at step 5/5" in err and "drafter: step " not in err, err
    assert (out / "drafter" / "config.json").is_file()
    assert train.main(drafter_args(cli_target, tmp_path / "end", "--steps", "3", "--ckpt-every", "0")) == 0
    assert sorted(p.name for p in (tmp_path / "end" / "ckpt" / "meta").iterdir()) == ["3.json"]


def test_a_missing_target_is_one_line_naming_target(tmp_path, capsys):
    """Before, `drafter` and `eval` said `PATH: no such checkpoint directory`, the only path flag not named."""
    (tmp_path / "file_target").write_text("x")
    for args in (offline_drafter(tmp_path), offline_eval(tmp_path)):
        assert train.main(args) == 2
        assert capsys.readouterr().err == f"error: --target {tmp_path / 'no_target'}: does not exist\n"
        args[args.index("--target") + 1] = str(tmp_path / "file_target")
        assert train.main(args) == 2
        err = capsys.readouterr().err
        assert err == f"error: --target {tmp_path / 'file_target'}: is not a directory (expected a model dir)\n"
    assert not (tmp_path / "o").exists() and not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("seed,ok", [(str(2**32), False), (str(2**64), False), (str(2**32 - 1), True)])
def test_a_seed_past_the_range_is_refused_before_anything_runs(tmp_path, capsys, seed, ok):
    """A --seed of 2**64 passed the old `>= 0` check and ended in an OverflowError from JAX's key mid-run."""
    for args in (offline_drafter(tmp_path, "--seed", seed), offline_eval(tmp_path, "--seed", seed),
                 ["pair", "--tiny", "--out", str(tmp_path / "p"), "--seed", seed, "--vocab", "1"]):
        assert train.main(args) == 2
        err = capsys.readouterr().err
        refused = f"error: --seed {seed}: must be >= 0 and <= {2**32 - 1}\n"
        assert (err != refused) if ok else (err == refused), err
        assert err.count("\n") == 1 and "Traceback" not in err, err
    assert not (tmp_path / "o").exists() and not (tmp_path / "p").exists()


@pytest.mark.parametrize("flags,message", [
    (["--max-epochs", "inf"], "--max-epochs inf: must be a finite number >= 0\n"),
    (["--time-budget-s", "inf"], "--time-budget-s inf: must be a finite number >= 0 (0: no budget)\n"),
    (["--max-epochs", "-1"], "--max-epochs -1: must be >= 0\n")])
def test_an_infinite_value_is_refused_as_not_finite(tmp_path, capsys, flags, message):
    assert train.main(offline_drafter(tmp_path, *flags)) == 2
    assert capsys.readouterr().err == "error: " + message


# ------------------------------------------------------------------------------------------------
# The loss-curve PNG

LIGHT, DARK, BLACK, WHITE = (160, 190, 240), (20, 40, 160), (0, 0, 0), (255, 255, 255)
LEFT, RIGHT, TOP, BOTTOM = 60, 10, 10, 30          # the plot area's margins
PW, PH = 640 - LEFT - RIGHT, 400 - TOP - BOTTOM     # and its size at the default 640 x 400


def read_png(path):
    """The [H, W, 3] pixels of an 8-bit RGB PNG of filter-0 rows, checking every part of the file on the way."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    chunks, i = [], 8
    while i < len(data):
        (n,), kind = struct.unpack(">I", data[i:i + 4]), data[i + 4:i + 8]
        body, (crc,) = data[i + 8:i + 8 + n], struct.unpack(">I", data[i + 8 + n:i + 12 + n])
        assert crc == zlib.crc32(kind + body), kind
        chunks.append((kind, body))
        i += 12 + n
    assert i == len(data) and [k for k, _ in chunks] == [b"IHDR", b"IDAT", b"IEND"] and chunks[-1][1] == b""
    w, h, depth, colour, compression, filt, interlace = struct.unpack(">IIBBBBB", chunks[0][1])
    assert (depth, colour, compression, filt, interlace) == (8, 2, 0, 0, 0)
    raw = np.frombuffer(zlib.decompress(chunks[1][1]), np.uint8)
    assert raw.size == h * (1 + 3 * w)
    rows = raw.reshape(h, 1 + 3 * w)
    assert not rows[:, 0].any()
    return rows[:, 1:].reshape(h, w, 3).astype(int)


def read_text(img, x, y, n=7, scale=2):
    """The label drawn at (x, y) in the plot's 3x5 font, blank cells as spaces ('?': no glyph of the font)."""
    shapes = {g: ch for ch, g in _GLYPHS.items()}
    s = ""
    for k in range(n):
        x0 = x + 4 * scale * k
        bits = "".join("1" if (img[y + r * scale, x0 + c * scale] == BLACK).all() else "0"
                       for r in range(5) for c in range(3))
        s += shapes.get(bits, "?")
    return s.rstrip()


def is_colour(img, y, x, colour):
    return (img[y, x] == colour).all()


def where(values, lo=None, hi=None):
    """(column, row) where the plot puts each of `values` (row None where not finite): evenly spaced from the left
    axis to the right end, scaled from `lo` on the x axis to `hi` on the top row (default: their finite min, max)."""
    y = np.asarray(values, np.float64)
    lo = y[np.isfinite(y)].min() if lo is None else lo
    hi = y[np.isfinite(y)].max() if hi is None else hi
    xs = np.linspace(0, PW, len(y)) if len(y) > 1 else np.zeros(1)
    ys = PH - (y - lo) / (hi - lo) * PH
    return [(LEFT + int(round(x)), TOP + int(round(r)) if np.isfinite(r) else None) for x, r in zip(xs, ys)]


def test_the_png_is_a_valid_rgb_file_of_the_asked_size(tmp_path, seed):
    rng = np.random.default_rng(seed)
    loss_curve_png(tmp_path / "c.png", list(1 + rng.random(80)), width=300, height=200)
    img = read_png(tmp_path / "c.png")
    assert img.shape == (200, 300, 3)
    loss_curve_png(tmp_path / "empty.png", [])
    img = read_png(tmp_path / "empty.png")
    assert img.shape == (400, 640, 3)
    assert (img[TOP:TOP + PH + 1, LEFT] == BLACK).all() and (img[TOP + PH, LEFT:LEFT + PW + 1] == BLACK).all()
    img[TOP:TOP + PH + 1, LEFT] = img[TOP + PH, LEFT:LEFT + PW + 1] = WHITE
    assert (img == WHITE).all()                                     # no curve, no labels


def test_each_loss_is_drawn_at_its_step_and_value(tmp_path, seed):
    """One loss per column (571 losses over the 570-px-wide plot, smoothing off): each where its step and value put
    it, the first on the left axis, the last at the right end, the max on the top row, the min on the x axis, each
    joined to the next by an unbroken line; the axes black; and the labels the max, the min, 0 and the number of
    steps."""
    rng = np.random.default_rng(seed)
    losses = 2 + 6 * rng.random(571)
    loss_curve_png(tmp_path / "c.png", list(losses), smooth=1)
    img = read_png(tmp_path / "c.png")
    at = where(losses)
    assert at[0][0] == LEFT and at[-1][0] == LEFT + PW
    assert at[int(np.argmax(losses))][1] == TOP and at[int(np.argmin(losses))][1] == TOP + PH
    for x, y in at:
        assert is_colour(img, y, x, LIGHT), (x, y, img[y, x])
    light = (img == LIGHT).all(-1)
    for (x0, y0), (x1, y1) in zip(at, at[1:]):                 # each step joined to the next without a gap
        rows = set(np.flatnonzero(light[:, x0])) | set(np.flatnonzero(light[:, x1]))
        assert set(range(min(y0, y1), max(y0, y1) + 1)) <= rows, (x0, y0, y1)
    assert not (img[:, LEFT + PW + 1:] == LIGHT).all(-1).any() and not (img[:, :LEFT] == LIGHT).all(-1).any()
    assert not (img == DARK).all(-1).any()
    for axis in (img[TOP:TOP + PH + 1, LEFT], img[TOP + PH, LEFT:LEFT + PW + 1]):
        assert ((axis == BLACK).all(-1) | (axis == LIGHT).all(-1)).all() and (axis == BLACK).all(-1).mean() > 0.5
    assert read_text(img, 2, TOP) == f"{losses.max():.3g}"
    assert read_text(img, 2, TOP + PH - 10) == f"{losses.min():.3g}"
    assert read_text(img, LEFT, TOP + PH + 8, 1) == "0" and read_text(img, LEFT + PW - 60, TOP + PH + 8) == "571"


def test_the_moving_average_ends_at_each_step(tmp_path, seed):
    """The default window is 2% of the steps (10 of 500): the smoothed curve (dark) is the mean of the window of
    losses ending at each step, from the 10th on; the raw curve stays light where the smoothed one is not."""
    rng = np.random.default_rng(seed)
    losses = 2 + 6 * rng.random(500)
    loss_curve_png(tmp_path / "c.png", list(losses))
    img = read_png(tmp_path / "c.png")
    k = 10
    means = np.convolve(losses, np.ones(k) / k, mode="valid")
    at = where(np.r_[np.full(k - 1, np.nan), means], losses.min(), losses.max())     # scaled as the raw losses
    for x, y in at[k - 1:]:
        assert is_colour(img, y, x, DARK), (x, y, img[y, x])
    assert not (img[:, :at[k - 1][0]] == DARK).all(-1).any()
    x0, y0 = where(losses)[0]
    assert is_colour(img, y0, x0, LIGHT)


def test_non_finite_losses_leave_a_gap_and_do_not_scale_the_plot(tmp_path, seed):
    """inf and nan losses are not drawn: the curve stops before each and starts again after it, the labels are the
    finite max and min, and the moving average counts each as the mean of the finite losses."""
    rng = np.random.default_rng(seed)
    losses = 2 + 6 * rng.random(571)
    losses[100], losses[300] = np.inf, np.nan
    finite = np.isfinite(losses)
    loss_curve_png(tmp_path / "c.png", list(losses), smooth=1)
    img = read_png(tmp_path / "c.png")
    assert read_text(img, 2, TOP) == f"{losses[finite].max():.3g}"
    assert read_text(img, 2, TOP + PH - 10) == f"{losses[finite].min():.3g}"
    for i, (x, y) in enumerate(where(losses)):
        if i in (100, 300):
            assert y is None and not (img[TOP:TOP + PH, x] == LIGHT).all(-1).any(), i    # (TOP + PH: the x axis)
        else:
            assert is_colour(img, y, x, LIGHT), (i, x, y)
    losses, finite = losses[:500], finite[:500]                        # smoothed over 10 steps
    loss_curve_png(tmp_path / "s.png", list(losses))
    img = read_png(tmp_path / "s.png")
    filled = np.where(finite, losses, losses[finite].mean())
    means = np.convolve(filled, np.ones(10) / 10, mode="valid")
    at = where(np.r_[np.full(9, np.nan), means], losses[finite].min(), losses[finite].max())
    for i in (95, 105, 300, 305):
        assert is_colour(img, at[i][1], at[i][0], DARK), (i, at[i])


@pytest.mark.parametrize("losses,hi,lo", [([3.25] * 40, "4.25", "3.25"), ([2.5], "3.5", "2.5")])
def test_constant_and_single_losses_lie_on_the_x_axis_under_a_range_of_one(tmp_path, losses, hi, lo):
    loss_curve_png(tmp_path / "c.png", losses)
    img = read_png(tmp_path / "c.png")
    assert read_text(img, 2, TOP) == hi and read_text(img, 2, TOP + PH - 10) == lo
    assert read_text(img, LEFT + PW - 60, TOP + PH + 8) == str(len(losses))
    ys, xs = np.nonzero((img[TOP:TOP + PH + 1, LEFT:LEFT + PW + 1] == LIGHT).all(-1))
    assert (ys == PH).all() and sorted(set(xs)) == (list(range(PW + 1)) if len(losses) > 1 else [0])


@pytest.mark.parametrize("small,large", [(1.234e-5, 0.5), (0.25, 1.5e10), (1.234e-4, 2.5e-4)])
def test_the_y_labels_read_as_the_min_and_max(tmp_path, small, large):
    loss_curve_png(tmp_path / "c.png", [large, small, (small + large) / 2])
    img = read_png(tmp_path / "c.png")
    assert float(read_text(img, 2, TOP)) == pytest.approx(large, rel=1e-2)
    assert float(read_text(img, 2, TOP + PH - 10)) == pytest.approx(small, rel=1e-2)


@pytest.mark.parametrize("v,text", [(1.234e-5, "1.23e-5"), (1.5e10, "1.5e10"), (1.234e-4, "1.23e-4"),
                                    (-1.234e-5, "-1.2e-5"), (3.25, "3.25"), (12345.6, "1.23e4"), (1e-100, "1e-100")])
def test_a_label_keeps_the_most_digits_that_fit_in_seven_glyphs(v, text):
    """Before, labels were f"{v:.3g}" cut to 7 characters: 1.23e-05 became "1.23e-0", read as 1.23."""
    assert label(v) == text and len(text) <= 7 and set(text) <= set(plot._GLYPHS)
