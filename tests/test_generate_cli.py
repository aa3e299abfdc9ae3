"""`python -m jaxspec.generate` end to end: the out-of-the-box default, an HF checkpoint with AR and
DFlash, and flag errors."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest

from conftest import make_causal_lm
from jaxspec.generate import main
from test_drafter import make_reference, tiny_hf


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    target = tmp_path_factory.mktemp("cli_target")
    make_causal_lm(target, vocab_size=256)
    hf = tiny_hf("qwen36")
    hf["dflash_config"]["target_layer_ids"] = [0, 1, 2]
    hf["num_target_layers"] = 4                    # made for the 4-layer target (check_pair compares the depth)
    draft = tmp_path_factory.mktemp("cli_draft")
    make_reference(draft, hf)
    return target, draft


def test_default_runs_and_says_it_is_random(tmp_path):
    # Without the demo pair (jaxspec/demo, or $JAXSPEC_DEMO_DIR) the default is the tiny random model.
    env = dict(os.environ, JAXSPEC_DEMO_DIR=str(tmp_path / "no-demo"))
    out = subprocess.run([sys.executable, "-m", "jaxspec.generate", "--max-new-tokens", "5"],
                         capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    assert "demo pair is not installed" in out.stderr and "RANDOM-WEIGHT" in out.stderr
    assert out.stdout.startswith("def fibonacci(n):")
    assert "5 tokens" in out.stderr and "tok/s" in out.stderr


def test_compile_cache_keeps_the_programs(tmp_path):
    from jaxspec.generate import compile_cache_dir
    home = {"HOME": "/home/u"}
    assert compile_cache_dir(None, {**home, "XDG_CACHE_HOME": "/c"}) == "/c/jaxspec/xla"
    assert compile_cache_dir(None, {"JAX_COMPILATION_CACHE_DIR": "/j"}) is None     # JAX reads it itself
    assert compile_cache_dir("off", {"JAX_COMPILATION_CACHE_DIR": "/j"}) == ""                # off wins
    assert compile_cache_dir("/d", {"JAX_COMPILATION_CACHE_DIR": "/j"}) == "/d"
    cache = tmp_path / "xla"
    env = dict(os.environ, JAXSPEC_DEMO_DIR=str(tmp_path / "no-demo"), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    out = subprocess.run([sys.executable, "-m", "jaxspec.generate", "--max-new-tokens", "3", "--compile-cache",
                          str(cache)], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    kept = [f.name for f in cache.iterdir()]
    assert any("_run_rounds" in name for name in kept) and any("_prefill_piece" in name for name in kept), kept


def test_demo_comparison_times_each_method_in_turn(dirs, tmp_path, monkeypatch, capsys):
    """The demo's comparison (no --model, no --method) on a pair laid out as jaxspec/demo is: each method compiled,
    then timed --repeats times, AR and DDTree in turn; each line names the median of the runs. The target's lm_head
    keeps 1 of its 256 rows (every other logit 0), so the drafter, which shares it, is accepted and "same tokens as
    AR" is not a given."""
    import re

    import numpy as np

    import jaxspec.engine as E
    from test_convert import rewrite
    target, draft = dirs
    demo = tmp_path / "demo"
    with_small_tokenizer(target, demo / "target")
    rewrite(demo / "target" / "model.safetensors", lambda t: {**t, "lm_head.weight": np.concatenate(
        [t["lm_head.weight"][:1], np.zeros_like(t["lm_head.weight"][1:])])})
    (demo / "drafter").symlink_to(draft)
    monkeypatch.setenv("JAXSPEC_DEMO_DIR", str(demo))
    calls = []
    real = E.Engine.generate
    monkeypatch.setattr(E.Engine, "generate",
                        lambda self, *a, **kw: calls.append(self.spec.name) or real(self, *a, **kw))
    # --ignore-eos: token 0, one of the two the target chooses between, is the tokenizer's <eos>
    assert main(["--prompt", "def f(x):", "--max-new-tokens", "12", "--repeats", "2", "--ignore-eos"]) == 0
    err = capsys.readouterr().err
    assert calls == ["ar", "ddtree", "ar", "ddtree", "ar", "ddtree"]          # compile each, then in turn
    assert err.count("(median of 2 runs)") == 2 and "ddtree speedup over AR" in err
    assert "same tokens as AR: yes" in err
    tau = float(re.search(r"ddtree speedup over AR: [0-9.]+x; tau ([0-9.]+);", err).group(1))
    hist = re.search(r"\[acceptance histogram \(tokens per round: rounds\): ([^\]]*)\]", err).group(1)
    assert tau > 1.5 and any(int(k) >= 2 for k in re.findall(r"(\d+):[1-9]", hist)), err    # 1.83 on this CPU


def test_tokenizer_beyond_the_vocab_is_refused(dirs, capsys):
    target, draft = dirs
    # No tokenizer files in the tiny checkpoint: the Qwen3.6 vocabulary's ids exceed its 256 tokens.
    with pytest.raises(SystemExit):
        main(["--model", str(target), "--prompt", "hello"])
    assert "vocab_size 256" in capsys.readouterr().err


def with_small_tokenizer(target, model_dir):
    """A copy of the tiny target in model_dir with a byte-level tokenizer small enough for its 256-token
    vocabulary, written as tokenizer.json."""
    import shutil
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(["def f(x):\n    return x\n"] * 5, trainers.BpeTrainer(
        vocab_size=256, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<eos>"]))
    shutil.copytree(target, model_dir)
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>").save_pretrained(model_dir)
    return model_dir


def test_end_of_sequence_ids_beyond_the_vocab_are_refused(dirs, tmp_path, capsys):
    """A generation_config.json whose end-of-sequence id the 256-token model can never produce: one line naming it
    and --ignore-eos (the engine refuses stop ids outside the vocabulary); with --ignore-eos it runs."""
    target, _ = dirs
    model = with_small_tokenizer(target, tmp_path / "m")
    (model / "generation_config.json").write_text(json.dumps({"eos_token_id": [300]}))
    args = ["--model", str(model), "--prompt", "def f(x):", "--max-new-tokens", "2"]
    with pytest.raises(SystemExit) as e:
        main(args)
    err = capsys.readouterr().err
    assert e.value.code == 2 and "end-of-sequence ids [300] (from generation_config.json" in err, err
    assert "outside the model's vocabulary [0, 256); pass --ignore-eos" in err
    assert main([*args, "--ignore-eos"]) == 0


def test_dflash_cli(dirs, tmp_path, capsys):
    """Greedy DFlash and DDTree print exactly the AR text, with drafts accepted: the target's lm_head keeps 1 of its
    256 rows (every other logit 0), so target and drafter, which shares it, choose between 2 tokens and rounds emit
    several tokens (a random drafter over the whole vocabulary is almost never accepted, and then any drafts give
    AR's text)."""
    import re

    import numpy as np
    from test_convert import rewrite
    target, draft = dirs
    model_dir = with_small_tokenizer(target, tmp_path / "model")
    rewrite(model_dir / "model.safetensors", lambda t: {**t, "lm_head.weight": np.concatenate(
        [t["lm_head.weight"][:1], np.zeros_like(t["lm_head.weight"][1:])])})

    def accepted(err):
        """The run's tau, after checking that its histogram has rounds of 2 or more tokens."""
        hist = re.search(r"\[acceptance histogram \(tokens per round: rounds\): ([^\]]*)\]", err).group(1)
        assert any(int(k) >= 2 and int(c) > 0 for k, c in (kc.split(":") for kc in hist.split())), err
        return float(re.search(r"tau ([0-9.]+) tokens/round", err).group(1))

    args = ["--model", str(model_dir), "--prompt", "def f(x):", "--max-new-tokens", "12", "--ignore-eos"]
    assert main(args) == 0
    ar = capsys.readouterr()
    assert main(args + ["--method", "dflash", "--draft", str(draft), "--block-size", "4"]) == 0
    dflash = capsys.readouterr()
    assert dflash.out == ar.out               # greedy DFlash prints exactly the AR text
    assert "acceptance histogram" in dflash.err and "12 tokens" in dflash.err
    assert accepted(dflash.err) > 1.5, dflash.err          # 2.20 on this CPU
    # a bfloat16 drafter under the float32 target: it only proposes, so the text is still AR's
    assert main(args + ["--method", "dflash", "--draft", str(draft), "--block-size", "4",
                        "--draft-dtype", "bfloat16"]) == 0
    bf16 = capsys.readouterr()
    assert bf16.out == ar.out and "method dflash (block 4) with a bfloat16 drafter;" in bf16.err
    assert accepted(bf16.err) > 1.5, bf16.err              # 2.20
    assert main(args + ["--method", "ddtree", "--draft", str(draft), "--budget", "9"]) == 0
    ddtree = capsys.readouterr()
    # Without --block-size: the drafter's block, or at most 8 on a CPU (where a verify costs compute per row)
    trained = json.loads((Path(draft) / "config.json").read_text())["block_size"]
    budget, block = {"cpu": (8, min(8, trained))}.get(jax.default_backend(), (63, trained))
    assert ddtree.out == ar.out and f"method ddtree (budget 9, block {block})" in ddtree.err
    assert accepted(ddtree.err) > 1.5, ddtree.err          # 1.83
    if jax.default_backend() == "cpu":          # the drafter in the target's dtype: not named
        assert "drafter" not in ddtree.err.split("method ", 1)[1].split(";")[0]
    # Without --budget either: the backend's default (8 on a CPU; 63 on a GPU)
    assert main(args + ["--method", "ddtree", "--draft", str(draft)]) == 0
    ddtree = capsys.readouterr()
    assert ddtree.out == ar.out and f"method ddtree (budget {budget}, block {block})" in ddtree.err
    assert accepted(ddtree.err) > 1.5, ddtree.err          # 1.83


def test_default_budget_and_block_per_backend():
    """63 nodes beyond the root on a GPU, so that a verify is 64 rows (the tree kernels' 16-row tiles), with the
    drafter's own block; on a CPU, where every row costs compute, 8 nodes and blocks of at most 8 (session 34's demo
    pair: DDTree(8) at block 8 1.07-1.15x AR on 16 prompts, against 0.97x at best with block 16)."""
    from jaxspec.generate import default_block, default_budget
    assert default_budget("gpu") == default_budget("cuda") == 63 and default_budget("cpu") == 8
    assert default_block("gpu", 16) == 16 and default_block("cpu", 16) == 8 and default_block("cpu", 4) == 4


def test_default_draft_dtype_per_backend():
    """A bfloat16 drafter under a float32 target on a GPU (session 35, H200: DFlash 1.13x AR against 0.91x with a fp32
    drafter, same tokens); the target's dtype on a CPU and under any other target dtype."""
    from jaxspec.dflash import default_draft_dtype
    assert default_draft_dtype("gpu", "float32") == "bfloat16"
    assert default_draft_dtype("gpu", "bfloat16") == "bfloat16" and default_draft_dtype("gpu", "float16") == "float16"
    assert default_draft_dtype("cpu", "float32") == "float32" and default_draft_dtype("cpu", "bfloat16") == "bfloat16"
    import jax.numpy as jnp
    assert default_draft_dtype("cuda", jnp.float32) == "bfloat16"    # a config's dtype, not only its name


def test_the_demo_says_why_tokens_may_differ_from_ar():
    """Sampled runs and bf16 runs can differ from AR without a fault (DESIGN.md section 6; bench/results/
    2026-12-03-cpu-s32-bf16/): the demo says so; a greedy fp32 difference is a plain NO."""
    from jaxspec.generate import same_tokens
    assert same_tokens(True, True, "bfloat16") == same_tokens(True, False, "float32") == "yes"
    assert same_tokens(False, True, "float32") == "NO"
    assert same_tokens(False, False, "float32").startswith("NO (sampled:")
    assert same_tokens(False, True, "bfloat16").startswith("NO (in bfloat16") and "--dtype float32" in \
        same_tokens(False, True, "bfloat16")


def test_bad_model_dirs(dirs, tmp_path, capsys):
    target, draft = dirs
    with pytest.raises(SystemExit):
        main(["--model", str(tmp_path)])
    assert "no *.safetensors" in capsys.readouterr().err
    with pytest.raises(SystemExit):   # a drafter is not a target, and the reverse
        main(["--model", str(target), "--method", "dflash", "--draft", str(target)])
    assert "--draft" in capsys.readouterr().err


@pytest.mark.parametrize("argv,words", [
    (["--temperature", "-1"], "temperature"),
    (["--top-p", "0"], "top-p"),
    (["--max-new-tokens", "0"], "max-new-tokens"),
    (["--method", "dflash"], "--draft"),
    (["--block-size", "4"], "--draft/--block-size"),
    (["--budget", "4"], "--budget only"),
    (["--draft-dtype", "bfloat16"], "--draft-dtype only apply"),
    (["--method", "ddtree"], "--draft"),
    (["--repeats", "0"], "--repeats must be >= 1"),
    (["--method", "ar", "--repeats", "2"], "--repeats only applies"),
    (["--rounds-per-call", "0"], "--rounds-per-call must be >= 1"),   # 0 rounds a call never finished
    (["--max-len", "-5"], "--max-len must be >= 1"),
    (["--max-len", "0"], "--max-len must be >= 1"),                  # was taken as the default
    (["--top-k", "20"], "only apply when sampling"),
    (["--top-p", "0.9"], "only apply when sampling"),
    (["--no-thinking"], "--no-thinking only applies with --chat"),
])
def test_flag_errors(argv, words, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("JAXSPEC_DEMO_DIR", str(tmp_path / "no-demo"))   # the demo pair supplies --draft
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and words in capsys.readouterr().err


def test_mtp_on_the_demo_pair_says_to_pass_a_model(dirs, tmp_path, monkeypatch, capsys):
    # The demo's target has no MTP head: the error must not name a --model the user never gave as if it were theirs.
    target, draft = dirs
    demo = tmp_path / "demo"
    with_small_tokenizer(target, demo / "target")
    (demo / "drafter").symlink_to(draft)
    monkeypatch.setenv("JAXSPEC_DEMO_DIR", str(demo))
    with pytest.raises(SystemExit) as e:
        main(["--method", "mtp", "--max-new-tokens", "2"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "the demo pair's target" in err and "pass --model DIR" in err, err


def test_a_misspelt_flag_ends_with_one_line(monkeypatch, capsys):
    monkeypatch.setenv("JAXSPEC_VERIFYY", "xla")
    with pytest.raises(SystemExit) as e:
        main(["--method", "ar", "--max-new-tokens", "2"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "JAXSPEC_VERIFYY is set" in err and "did you mean JAXSPEC_VERIFY?" in err, err


def test_tokenizer_errors_name_the_model(dirs, tmp_path, capsys):
    target, _ = dirs
    model = with_small_tokenizer(target, tmp_path / "m")
    with pytest.raises(SystemExit) as e:        # this tokenizer has no chat template
        main(["--model", str(model), "--chat", "--max-new-tokens", "2"])
    assert e.value.code == 2 and f"--model {model}: tokenizer: --chat needs a chat template" in capsys.readouterr().err
    (model / "tokenizer.json").write_text("{not json")
    with pytest.raises(SystemExit) as e:
        main(["--model", str(model), "--max-new-tokens", "2"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"--model {model}: cannot load or apply its tokenizer" in err, err


def test_interrupt_and_out_of_memory_end_with_one_line(monkeypatch, capsys):
    import jaxspec.generate as cli

    def interrupted(argv):
        raise KeyboardInterrupt
    monkeypatch.setattr(cli, "_main", interrupted)
    assert cli.main([]) == 130 and capsys.readouterr().err.strip() == "interrupted"
    oom = jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 38400000000 bytes.\nSECOND LINE")
    assert cli._decode_error(oom) == 2
    err = capsys.readouterr().err
    assert "38400000000 bytes" in err and "--max-len" in err and "SECOND LINE" not in err
    with pytest.raises(jax.errors.JaxRuntimeError):     # not a memory error: raised as it is
        cli._decode_error(jax.errors.JaxRuntimeError("INTERNAL: something else"))


def test_distributed_passes_the_process_count_and_id(monkeypatch, capsys):
    from jaxspec.generate import distributed_args
    assert distributed_args({}) == {}
    assert distributed_args({"JAX_NUM_PROCESSES": "4", "JAX_PROCESS_ID": "3"}) == dict(num_processes=4, process_id=3)
    for env, words in (({"JAX_NUM_PROCESSES": "two"}, "is not an integer"),
                       ({"JAX_NUM_PROCESSES": "0"}, "must be >= 1"),
                       ({"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "2"}, "must be below JAX_NUM_PROCESSES=2")):
        with pytest.raises(ValueError, match=words):
            distributed_args(env)
    given = []

    class Stop(Exception):
        pass

    def initialize(**kw):
        given.append(kw)
        raise Stop
    monkeypatch.setattr(jax.distributed, "initialize", initialize)
    monkeypatch.setenv("JAX_NUM_PROCESSES", "2")
    monkeypatch.setenv("JAX_PROCESS_ID", "1")
    with pytest.raises(Stop):
        main(["--method", "ar", "--distributed"])
    assert given == [dict(num_processes=2, process_id=1)]
    monkeypatch.setenv("JAX_PROCESS_ID", "-1")
    with pytest.raises(SystemExit) as e:
        main(["--method", "ar", "--distributed"])
    assert e.value.code == 2 and "--distributed: JAX_PROCESS_ID=-1 must be >= 0" in capsys.readouterr().err
