"""The tiny random models, for smoke runs and the tests: `--model tiny` (Llama-like, rotary positions) and
`--model tiny-gpt2` (absolute positions, no chat template), with a character-level tokenizer built in memory. No
files and no hub: a test suite that runs anywhere."""

from __future__ import annotations

import transformers


def make_tiny_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """A character-level tokenizer with a ChatML template, built in memory (no files, no hub)."""
    from tokenizers import Tokenizer, decoders
    from tokenizers.models import BPE

    specials = ["<pad>", "<|im_start|>", "<|im_end|>", "<unk>"]
    chars = [chr(c) for c in range(32, 127)] + ["\n"]
    vocab = {tok: i for i, tok in enumerate(specials + chars)}
    backend = Tokenizer(BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.add_special_tokens(specials)
    backend.decoder = decoders.Fuse()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<|im_end|>", unk_token="<unk>"
    )
    tokenizer.chat_template = (
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    )
    return tokenizer


def make_tiny_model(vocab_size: int, arch: str = "llama", head: str = "lm") -> transformers.PreTrainedModel:
    """A randomly initialised 2-layer model: Llama (rotary positions) or GPT-2 (absolute positions),
    with a language-model head (head="lm") or a scalar score head (head="score", a reward model)."""
    if arch == "llama":
        config = transformers.LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=512,
            tie_word_embeddings=True,
            num_labels=1,
        )
        return (
            transformers.LlamaForCausalLM if head == "lm" else transformers.LlamaForSequenceClassification
        )(config)
    config = transformers.GPT2Config(
        vocab_size=vocab_size,
        n_embd=64,
        n_layer=2,
        n_head=4,
        n_positions=512,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        num_labels=1,
    )
    return (transformers.GPT2LMHeadModel if head == "lm" else transformers.GPT2ForSequenceClassification)(
        config
    )
