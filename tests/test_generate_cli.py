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

ERROR = "python -m jaxspec.generate: error: "      # argparse's prefix of the CLI's one error line


def error_line(err: str) -> str:
    """stderr's last line: the one error line, after argparse's usage text where it printed one."""
    return err.strip().splitlines()[-1]


def run_main(argv) -> int:
    """main's status, whether it returns it or exits with it (argparse's errors)."""
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


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


def test_a_compile_cache_that_is_no_directory_is_refused(tmp_path, monkeypatch, capsys):
    """--compile-cache FILE (or a path under a file): one line naming the flag, before anything loads (JAX warned
    FileExistsError at each program it could not keep, and the run went on without a cache)."""
    monkeypatch.setenv("JAXSPEC_DEMO_DIR", str(tmp_path / "no-demo"))
    bad = tmp_path / "f"
    bad.write_text("")
    for path, what in ((bad, "is not a directory"), (bad / "xla", f"{bad} is not a directory")):
        assert run_main(["--method", "ar", "--max-new-tokens", "1", "--compile-cache", str(path)]) == 2
        out, err = capsys.readouterr()
        assert out == "" and error_line(err) == f"{ERROR}--compile-cache {path}: {what}", err
        assert "loaded in" not in err


def test_a_default_compile_cache_under_a_file_is_named_and_the_run_goes_on(tmp_path, monkeypatch, capsys):
    """No --compile-cache, and $XDG_CACHE_HOME is a file: the default place cannot be a directory. The run says so,
    naming the file and the flag, and completes without a cache (JAX alone warned at each program, naming neither)."""
    import jax
    monkeypatch.setenv("JAXSPEC_DEMO_DIR", str(tmp_path / "no-demo"))
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    blocker = tmp_path / "cache-file"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    before = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", str(tmp_path / "set-before"))    # so that None is this run's
    try:
        assert run_main(["--method", "ar", "--max-new-tokens", "2"]) == 0
        after = jax.config.jax_compilation_cache_dir
    finally:
        jax.config.update("jax_compilation_cache_dir", before)
    out, err = capsys.readouterr()
    assert f"[no compile cache: {blocker} is not a directory; pass --compile-cache DIR, or off]" in err.splitlines()
    assert "loaded in" in err and out.strip(), (out, err)
    assert after is None
    assert blocker.is_file() and blocker.read_text() == ""


def test_help_says_what_max_new_tokens_counts():
    """It said only "default: 64"."""
    from jaxspec.generate import parser
    text = " ".join(parser().format_help().split())
    assert "--max-new-tokens MAX_NEW_TOKENS new tokens to generate after the prompt (each sequence's), the " \
        "prefill's first token included;" in text and "unless --ignore-eos (default: 64)" in text, text


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
    # A target is not a drafter. The model has a tokenizer within its vocabulary, so that the run gets as far as
    # the drafter (without one it stopped at the tokenizer's ids, and argparse's usage text named --draft).
    model = with_small_tokenizer(target, tmp_path / "m")
    with pytest.raises(SystemExit):
        main(["--model", str(model), "--method", "dflash", "--draft", str(target)])
    assert error_line(capsys.readouterr().err).startswith(f"{ERROR}--draft {target}: ")


@pytest.mark.parametrize("argv,words", [
    (["--temperature", "-1"], "--temperature must be >= 0"),
    (["--top-p", "0", "--temperature", "1"], "--top-p must be in (0, 1]"),   # sampling: the range check, not greedy's
    (["--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
    (["--method", "dflash"], "--method dflash needs --draft DIR"),
    (["--block-size", "4"], "--draft/--block-size"),
    (["--budget", "4"], "--budget only"),
    (["--draft-dtype", "bfloat16"], "--draft-dtype only apply"),
    (["--method", "ddtree"], "--method ddtree needs --draft DIR"),
    (["--repeats", "0"], "--repeats must be >= 1"),
    (["--method", "ar", "--repeats", "2"], "--repeats only applies"),
    (["--rounds-per-call", "0"], "--rounds-per-call must be >= 1"),   # 0 rounds a call never finished
    (["--max-len", "-5"], "--max-len must be >= 1"),
    (["--max-len", "0"], "--max-len must be >= 1"),                  # was taken as the default
    (["--prefill-chunk", "0"], "--prefill-chunk must be >= 1"),
    (["--top-k", "20"], "only apply when sampling"),
    (["--top-p", "0.9"], "only apply when sampling"),
    (["--no-thinking"], "--no-thinking only applies with --chat"),
    (["--seed", "99999999999999999999"], "--seed must be a 64-bit integer"),    # was an OverflowError
    (["--seed", str(2**63)], "--seed must be a 64-bit integer"),
    (["--seed", str(-2**63 - 1)], "--seed must be a 64-bit integer"),
])
def test_flag_errors(argv, words, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("JAXSPEC_DEMO_DIR", str(tmp_path / "no-demo"))   # the demo pair supplies --draft
    with pytest.raises(SystemExit) as e:
        main(argv)
    line = error_line(capsys.readouterr().err)       # the error line: the usage text above it names every flag
    assert e.value.code == 2 and line.startswith(ERROR) and words in line, line


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
    # No coordinator to be found (jax raises ValueError): one line naming the flag and what to set, no traceback.
    monkeypatch.setenv("JAX_PROCESS_ID", "1")
    monkeypatch.setattr(jax.distributed, "initialize",
                        lambda **kw: (_ for _ in ()).throw(ValueError("coordinator_address should be defined.")))
    with pytest.raises(SystemExit) as e:
        main(["--method", "ar", "--distributed"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--distributed: coordinator_address should be defined." in err, err
    assert "JAX_COORDINATOR_ADDRESS" in err and "Traceback" not in err


def test_a_closed_output_pipe_ends_quietly(monkeypatch, capsys):
    """A reader that closes the output early (`| head`): status 141, as a shell reports SIGPIPE, no traceback."""
    from jaxspec import generate

    def write_after_reader_left(argv):
        raise BrokenPipeError(32, "Broken pipe")
    monkeypatch.setattr(generate, "_main", write_after_reader_left)
    assert generate.main([]) == 141
    assert "Traceback" not in capsys.readouterr().err


def test_context_errors_name_the_flags_and_print_nothing(monkeypatch, capsys, tmp_path):
    """A request that does not fit --max-len or the model's context limit is refused before anything is printed
    (the prompt was echoed first, and left on stdout), in one line naming the flags."""
    import jaxspec.generate as cli
    monkeypatch.setenv("JAXSPEC_DEMO_DIR", str(tmp_path / "no-demo"))
    assert run_main(["--method", "ar", "--max-len", "10", "--max-new-tokens", "8"]) == 2
    out, err = capsys.readouterr()
    line = error_line(err)
    assert out == "" and line.startswith(f"{ERROR}prompt (") and "--max-new-tokens (8)" in line and \
        "exceeds the context of --max-len 10 tokens; raise --max-len" in line, err
    small = cli.tiny_random_config().replace(max_position_embeddings=10)
    monkeypatch.setattr(cli, "tiny_random_config", lambda: small)
    assert run_main(["--method", "ar", "--max-new-tokens", "8"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "--max-new-tokens (8) exceeds the model's context limit (max_position_embeddings 10" in \
        error_line(err), err


def test_a_budget_beyond_the_whole_context_is_the_flags_error(dirs, capsys, tmp_path):
    """A tree of more nodes than the target's whole context (a sanity cap): one line naming the flag and the limit,
    before the drafter is read (before, the tree was taken, and the CPU ran thousands of rows a round for minutes).
    The backend's default budget is named as the default."""
    from jaxspec.generate import default_budget
    target, draft = dirs
    target = with_small_tokenizer(target, tmp_path / "model")
    config = json.loads((target / "config.json").read_text())
    bound = config["max_position_embeddings"] = 24      # room for the prompt and 4 new tokens
    (target / "config.json").write_text(json.dumps(config))
    args = ["--model", str(target), "--method", "ddtree", "--prompt", "def f(x):", "--max-new-tokens", "4"]
    assert run_main(args + ["--draft", str(draft), "--budget", str(bound)]) == 2
    out, err = capsys.readouterr()
    problem = (f"--budget {bound}: a tree of {bound + 1} nodes is more than the target's whole context "
               f"(max_position_embeddings {bound}); DDTree's trees are tens to hundreds of nodes")
    assert out == "" and error_line(err) == ERROR + problem, err
    assert run_main(args + ["--draft", str(draft), "--budget", str(bound - 1)]) == 0    # 24 nodes: taken
    capsys.readouterr()
    bound = config["max_position_embeddings"] = default_budget(jax.default_backend())
    (target / "config.json").write_text(json.dumps(config))
    assert run_main(args + ["--draft", str(tmp_path / "no-drafter")]) == 2      # refused before the drafter's read
    out, err = capsys.readouterr()
    assert out == "" and error_line(err) == (
        f"{ERROR}--budget {bound}: a tree of {bound + 1} nodes is more than the target's whole context "
        f"(max_position_embeddings {bound}); DDTree's trees are tens to hundreds of nodes (this backend's default; "
        "pass a smaller --budget)"), err


def test_out_of_memory_names_the_draft_flags(monkeypatch, capsys, tmp_path):
    """Out of memory with a drafting method: the advice names the flags that size its draft (--budget 100000 asks
    for terabytes), and an error before the first token leaves stdout empty."""
    import jaxspec.engine as E
    import jaxspec.generate as cli
    monkeypatch.setenv("JAXSPEC_DEMO_DIR", str(tmp_path / "no-demo"))
    oom = jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 38400000000 bytes.")

    def generate(self, *a, **kw):
        raise oom
    monkeypatch.setattr(E.Engine, "generate", generate)
    assert run_main(["--method", "mtp", "--max-new-tokens", "4"]) == 2       # the random model's random MTP head
    out, err = capsys.readouterr()
    assert out == "" and error_line(err).startswith("error: out of device memory"), err
    assert "lower --max-len, --max-new-tokens or --mtp-tokens" in error_line(err), err
    assert cli._decode_error(oom, "ddtree") == 2
    assert "lower --max-len, --max-new-tokens, --budget or --block-size" in capsys.readouterr().err
    assert cli._decode_error(oom, "ar") == 2
    assert "lower --max-len or --max-new-tokens, or shard" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["JAXSPEC_LOOP_GRAPHS", "JAXSPEC_VERIFY"])
def test_a_bad_flag_value_ends_with_one_line_before_the_load(flag, monkeypatch, capsys):
    """An op's flag too (it was refused when the model was first traced, after the load)."""
    monkeypatch.setenv(flag, "bogus")
    assert run_main(["--method", "ar", "--max-new-tokens", "2"]) == 2
    out, err = capsys.readouterr()
    assert error_line(err).startswith(f"{ERROR}{flag}='bogus': expected one of ") and "Traceback" not in err, err
    assert "loaded in" not in out + err


def fake_result(tokens, rounds, hist, decode_s=1.0):
    import numpy as np

    from jaxspec.engine import Result
    return Result(tokens, 0.5, decode_s, np.asarray(rounds), np.asarray(hist), None)


def test_counts_are_per_sequence(monkeypatch, capsys, tmp_path):
    """With --dp the line gives each sequence's tokens and rate and the rounds the loop ran (not sums over the
    batch); the rate counts the tokens decoded in rounds (the prefill chooses the first); with one new token, no
    rounds ran."""
    import jaxspec.engine as E
    monkeypatch.setenv("JAXSPEC_DEMO_DIR", str(tmp_path / "no-demo"))
    assert main(["--method", "ar", "--max-new-tokens", "1", "--ignore-eos"]) == 0
    err = capsys.readouterr().err
    assert "[1 token from the prefill (" in err and "; no decode rounds]" in err and "tok/s" not in err, err
    assert main(["--method", "ar", "--max-new-tokens", "2", "--ignore-eos"]) == 0
    err = capsys.readouterr().err
    assert "[2 tokens: prefill " in err and "tau 1.00 tokens/round over 1 round]" in err, err

    def generate(self, prompts, max_new, *, on_tokens, **kw):     # 5 tokens in each of 2 rows, 4 rounds each
        on_tokens([[11]] * len(prompts))
        on_tokens([[12, 13, 14, 15]] * len(prompts))
        return fake_result([[11, 12, 13, 14, 15]] * len(prompts), [4] * len(prompts), [0, 4 * len(prompts)], 2.0)
    monkeypatch.setattr(E.Engine, "generate", generate)
    assert main(["--method", "ar", "--max-new-tokens", "5", "--dp", "2"]) == 0
    err = capsys.readouterr().err
    assert "[5 tokens per sequence (batch of 2): " in err and "(2.0 tok/s per sequence after the first" in err, err
    assert "tau 1.00 tokens/round over 4 rounds]" in err, err


def fake_demo(dirs, tmp_path, monkeypatch):
    """A demo pair (the tiny checkpoints) whose Engine.generate decodes 64 tokens with AR and 16 with DDTree (a
    stop token) in one second each; returns the rounds_per_call each call was given."""
    import jaxspec.engine as E
    target, draft = dirs
    demo = tmp_path / "demo"
    with_small_tokenizer(target, demo / "target")
    (demo / "drafter").symlink_to(draft)
    monkeypatch.setenv("JAXSPEC_DEMO_DIR", str(demo))
    given = []

    def generate(self, prompts, max_new, **kw):
        given.append(kw.get("rounds_per_call"))
        if self.spec.name == "ar":
            return fake_result([[5] * 65], [64], [0, 64])
        return fake_result([[5] * 17], [4], [0, 0, 0, 0, 4])
    monkeypatch.setattr(E.Engine, "generate", generate)
    return given


def test_demo_speedup_is_the_ratio_of_decode_rates(dirs, tmp_path, monkeypatch, capsys):
    """A run that stops early is not faster for taking less time: 16 decoded tokens a second against 64 is 0.25x."""
    fake_demo(dirs, tmp_path, monkeypatch)
    assert main(["--prompt", "def f(x):", "--max-new-tokens", "64", "--repeats", "1"]) == 0
    err = capsys.readouterr().err
    assert "ddtree speedup over AR: 0.25x;" in err and "(16.0 tok/s after the first;" in err, err


def test_demo_passes_rounds_per_call(dirs, tmp_path, monkeypatch, capsys):
    """--rounds-per-call reaches the comparison's runs; without it they run all their rounds in one call."""
    given = fake_demo(dirs, tmp_path, monkeypatch)
    assert main(["--prompt", "def f(x):", "--max-new-tokens", "64", "--repeats", "1", "--rounds-per-call", "3"]) == 0
    assert given == [3, 3, 3, 3]
    given.clear()
    assert main(["--prompt", "def f(x):", "--max-new-tokens", "64", "--repeats", "1"]) == 0
    assert given == [None] * 4


def test_prefill_chunk_reaches_every_engine(dirs, tmp_path, monkeypatch, capsys):
    """--prefill-chunk sizes the prefill's pieces of the one engine, and of both engines of the demo's comparison;
    without it they take the engine's PREFILL_CHUNK, the number --help names."""
    import jaxspec.engine as E
    from jaxspec.generate import parser
    chunks = []

    def generate(self, prompts, max_new, **kw):
        chunks.append(self.prefill_chunk)
        if kw.get("on_tokens"):
            kw["on_tokens"]([[11]])
        return fake_result([[11]], [0], [0, 0])
    monkeypatch.setattr(E.Engine, "generate", generate)
    monkeypatch.setenv("JAXSPEC_DEMO_DIR", str(tmp_path / "no-demo"))
    assert main(["--method", "ar", "--max-new-tokens", "1", "--prefill-chunk", "32"]) == 0
    assert main(["--method", "ar", "--max-new-tokens", "1"]) == 0
    assert chunks == [32, E.PREFILL_CHUNK]
    assert f"(default: {E.PREFILL_CHUNK}, the engine's PREFILL_CHUNK)" in " ".join(parser().format_help().split())
    fake_demo(dirs, tmp_path, monkeypatch)
    monkeypatch.setattr(E.Engine, "generate", generate)
    chunks.clear()
    assert main(["--prompt", "def f(x):", "--max-new-tokens", "4", "--repeats", "1", "--prefill-chunk", "64"]) == 0
    assert chunks == [64] * 4


@pytest.mark.parametrize("seed", [2**63 - 1, -2**63])
def test_the_int64_seeds_are_taken(seed, monkeypatch, capsys, tmp_path):
    """Both ends of --seed's range run: the random model's MTP head, seeded with --seed + 1, wraps within int64."""
    import jaxspec.engine as E
    monkeypatch.setenv("JAXSPEC_DEMO_DIR", str(tmp_path / "no-demo"))

    def generate(self, prompts, max_new, *, seed, on_tokens, **kw):
        jax.random.key(seed)                                  # as the engine's prefill does
        on_tokens([[11]])
        return fake_result([[11]], [0], [0, 0, 0, 0, 0])
    monkeypatch.setattr(E.Engine, "generate", generate)
    assert main(["--method", "mtp", "--max-new-tokens", "1", "--seed", str(seed)]) == 0


def test_a_cache_the_device_cannot_hold_ends_with_one_line(monkeypatch, capsys, tmp_path):
    """Where the device's pool cannot hold the KV cache and GDN state (a GPU reports its free bytes), generate
    stops with one line giving the sizes, the pool's fraction and the flags that size the cache, status 2, instead
    of allocating."""
    from jaxspec import sharding
    monkeypatch.setenv("JAXSPEC_DEMO_DIR", str(tmp_path / "no-demo"))
    monkeypatch.setattr(sharding, "device_room", lambda devices: (1000, 2000))
    assert run_main(["--method", "ar", "--max-new-tokens", "2"]) == 2
    line = error_line(capsys.readouterr().err)
    assert line.startswith("error: the KV cache and GDN state of 1 sequence(s) of max_len ") and \
        "GiB per device, but 0.00 GiB of the device's 0.00 GiB pool is free" in line, line
    assert line.endswith("the cache grows with --max-len (by default what the prompt and --max-new-tokens need) "
                         "and the batch (--dp): lower them, or shard over more devices (--tp)"), line


def test_streamed_text_is_the_whole_decode(capsys):
    """Streaming decodes each segment from the last printed line's end, not the whole output again: printed a token
    at a time, the demo pair's multi-line completion is exactly the text printed from one segment of all of it."""
    args = ["--method", "ar", "--max-new-tokens", "80", "--ignore-eos"]
    assert main(args + ["--rounds-per-call", "1"]) == 0
    streamed = capsys.readouterr().out
    assert main(args + ["--rounds-per-call", "1000"]) == 0
    whole = capsys.readouterr().out
    assert streamed == whole and whole.count("\n") >= 4, whole
