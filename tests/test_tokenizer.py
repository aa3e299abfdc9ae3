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
