"""A model from its architecture alone: a transformers config.json file (configs/qwen2.5-0.5b.json), random weights,
and the embedded model's tokenizer. What a 0.5B or 1.5B model costs in time and memory, before any download: the
weights are noise, so its accuracy means nothing, but every tensor has the size and every step the work of the real
one (its vocabulary too: ids past the tokenizer's decode to nothing)."""

from __future__ import annotations

import torch
import transformers

from common import InputError, require


def config_of(path: str) -> transformers.PretrainedConfig:
    """The architecture in a config.json file; a file transformers cannot read is one line."""
    try:
        return transformers.AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InputError(f"--model {path}: not a transformers config ({first})") from None


def random_model(path: str, vocab_size: int, head: str, device: torch.device, dtype: torch.dtype):
    """The architecture of `path` with random weights, as a language model (head "lm") or with a scalar score head.
    One fixed model whatever the seed, as a checkpoint is, built where it will run (1.5B in float32 is 6 GB)."""
    config = config_of(path)
    require(
        config.vocab_size >= vocab_size,
        f"--model {path}: its vocab_size {config.vocab_size} is smaller than the tokenizer's {vocab_size} "
        "(the embedded model's); raise it to at least that",
    )
    config.num_labels = 1
    auto = (
        transformers.AutoModelForCausalLM if head == "lm" else transformers.AutoModelForSequenceClassification
    )
    with torch.random.fork_rng(), torch.device(device):
        torch.manual_seed(0)
        return auto.from_config(config, dtype=dtype)
