"""Model mechanics every algorithm file shares: set-up, LoRA and the reference, log-probs, masks, sampling.

Nothing here is specific to one algorithm or to the task (task/tasks.py), loads a model by name (infra/models.py), or is
run bookkeeping (infra/runs.py). Read an algorithm file first (grpo.py); come here when it calls something you want to
check. infra/kernels.py holds faster versions of two functions here, each reached through one visible seam beside the
plain code it must equal. Shapes: B sequences, P prompts, G samples per prompt, S prompt tokens, T completion
tokens, V vocabulary.

Two conventions used everywhere:
- `mask` is 1 on completion tokens up to and including the first EOS, 0 on prompt, padding
  and anything sampled after EOS. The EOS token is inside the mask: ending is an action.
- Prompts are left-padded and completions right-padded; position ids come from the attention
  mask, so the amount and side of padding never change a log-prob (GPT-2's absolute positions
  would otherwise shift).
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.distributed
import torch.utils.checkpoint
import transformers
from packaging.version import Version


# transformers 5.24 renamed the key/value cache, forward's `past_key_values=` and the output's field, to `cache`, and
# removes the old name in 5.40: passed there, it would fall into **kwargs and the prompt's cache be silently ignored.
CACHE = "cache" if Version(transformers.__version__) >= Version("5.24") else "past_key_values"

# small random models built in memory (infra/models.py), for tests and smoke runs
TINY_MODELS = ("tiny", "tiny-gpt2")


class InputError(Exception):
    """Bad input from the user: reported as one line, before any work is lost (infra/runs.py's run_main)."""


def require(condition: bool, message: str) -> None:
    if not condition:
        raise InputError(message)


def import_peft(needed_by: str = "--lora-r"):
    """The optional peft package (LoRA), or one line that says how to install it."""
    try:
        import peft
    except ImportError:
        raise InputError(f"{needed_by} needs the peft package: pip install peft") from None
    return peft


# ---------------------------------------------------------------------------------------------
# Precision and the kernels' seam: what a loaded model was marked with (infra/models.py)
# ---------------------------------------------------------------------------------------------
def kernels_on(model) -> bool:
    """Whether `model` takes infra/kernels.py's faster versions (set_kernels, from --kernels)."""
    return getattr(model, "kernels_on", False)


def autocast(model: torch.nn.Module):
    """The context every forward of `model` runs in: bfloat16 autocast for a bf16-mixed model, else nothing."""
    device_type = next(model.parameters()).device.type
    return torch.autocast(device_type, dtype=torch.bfloat16, enabled=getattr(model, "bf16_mixed", False))


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A frozen copy (the reference policy): same weights, same precision, no gradients."""
    return copy.deepcopy(model).eval().requires_grad_(False)


def lr_factor(step: int, warmup_steps: int, decay_steps: int = 0) -> float:
    """Update `step`'s (from 0) learning rate over the peak: a linear warm-up over `warmup_steps`, then constant, or
    with decay_steps (decay_steps - step) / (decay_steps - warmup_steps), to 0 after the last (TRL's "linear")."""
    if step < warmup_steps or not decay_steps:
        return min(1.0, (step + 1) / max(1, warmup_steps))
    return max(0.0, (decay_steps - step) / max(1, decay_steps - warmup_steps))


def make_optimizer(
    model: torch.nn.Module, lr: float, weight_decay: float = 0.0, warmup_steps: int = 0, decay_steps: int = 0
):
    """AdamW over the trainable parameters (fused: 0.07 s, not 0.3-0.6 s, a step on 2 CPU cores); lr_factor's rate."""
    device = next(model.parameters()).device
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        params, lr=lr, weight_decay=weight_decay, fused=device.type in ("cpu", "cuda")
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, warmup_steps, decay_steps)
    )
    # The schedule counts batches, a skipped one too (GRPO's dynamic sampling): torch's warning when the scheduler
    # steps before the optimizer has, is then meant.
    warnings.filterwarnings(
        "ignore", r"Detected call of `lr_scheduler\.step\(\)` before `optimizer\.step\(\)`"
    )
    return optimizer, scheduler


# ---------------------------------------------------------------------------------------------
# LoRA (Hu et al. 2021, arXiv:2106.09685), with the optional peft package
# ---------------------------------------------------------------------------------------------
@dataclass
class LoraOptions:
    """LoRA: train low-rank adapters instead of every weight (pip install peft); the reference: adapter off"""

    lora_r: int = 0
    """adapter rank r (0 = off: full fine-tuning); an adapter wants about 10x the full fine-tuning --lr"""
    lora_alpha: float = 32.0
    """α: the adapter's update is scaled by α / r"""
    lora_dropout: float = 0.0
    """dropout on the adapter's input (0: dropout would make old and new log-probs disagree at ratio 1)"""
    lora_targets: str = "all-linear"
    """modules that get adapters: all-linear (every attention and MLP projection), or a list: q_proj,v_proj"""
    merge_lora: bool = False
    """also write the final model with the adapter merged in (run folder/merged: a plain from_pretrained checkpoint)"""


def add_lora(model, base: str, lora: LoraOptions):
    """Freeze `model` and train adapters on `lora.lora_targets`: W x + (α/r)·B A x with B = 0 at the start, so
    the first forward is the base model's. A score head (reward model, critic) stays fully trainable.
    With the adapter switched off the model *is* its base, which is the reference (`reference`): one
    set of base weights, no copy. `base` (the --model it came from) is recorded to load the adapter again."""
    peft = import_peft()
    targets = lora.lora_targets
    targets = targets if targets == "all-linear" else [t.strip() for t in targets.split(",")]
    config = peft.LoraConfig(
        r=lora.lora_r,
        lora_alpha=lora.lora_alpha,
        lora_dropout=lora.lora_dropout,
        target_modules=targets,
        modules_to_save=["score"] if hasattr(model, "score") else None,
    )
    with warnings.catch_warnings():  # gpt2's Conv1D: peft transposes the adapter itself and says so
        warnings.simplefilter("ignore")
        model = peft.get_peft_model(model, config)
    model.peft_config["default"].base_model_name_or_path = base
    return model


def unwrap(model):
    """The transformers model inside a LoRA (peft) wrapper, for its backbone and score head; else the model."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


@contextlib.contextmanager
def reference(policy, ref_model=None):
    """The frozen reference policy: `ref_model` (a frozen copy), or for a LoRA policy the policy itself with
    its adapter switched off: LoRA never changes the base weights, so that is exactly the starting model."""
    if ref_model is not None:
        yield ref_model
    else:
        with policy.disable_adapter():
            yield policy


# ---------------------------------------------------------------------------------------------
# Log-probs and masks
# ---------------------------------------------------------------------------------------------
def token_logprobs(
    logits: torch.Tensor,
    labels: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
    kernels_on: bool = False,
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """log softmax(logits / temperature)[labels] and, with_entropy, the entropy H = -Σ_k p_k log p_k of that softmax.

    logits (B, T', V) in any float dtype, labels (B, T) with T <= T': position t predicts labels[:, t],
    positions from T on are ignored. -> logprobs (B, T) and entropy (B, T) or None, float32, differentiable.
    """
    if labels.shape[1] > logits.shape[1]:
        raise ValueError(f"{labels.shape[1]} labels per row but logits for {logits.shape[1]} positions")
    # kernels_on: the same numbers, slab by slab, by a hand-written backward (a CPU's page faults cost more)
    if kernels_on:
        from infra import kernels  # the seam: imported only when a model takes the kernels

        return kernels.token_logprobs(logits, labels, temperature, with_entropy)
    # A few sequences at a time, each piece computed again in the backward (checkpoint): whole, the float32 copy
    # of the logits / τ and the log-softmax autograd keeps for the backward would be two (B, T, V) temporaries.
    B = labels.shape[0]
    T = labels.shape[1]
    V = logits.shape[-1]
    # sequences a piece: about LOGPROB_PIECE logits, at least one
    rows = max(1, LOGPROB_PIECE // max(1, T * V))
    logprobs = []
    entropy = []
    for start in range(0, B, rows):
        piece_logprobs, piece_entropy = torch.utils.checkpoint.checkpoint(
            _piece_logprobs,
            logits[start : start + rows, :T],  # (rows, T, V), a view
            labels[start : start + rows],
            temperature,
            with_entropy,
            use_reentrant=False,
            preserve_rng_state=False,
        )
        logprobs.append(piece_logprobs)
        entropy.append(piece_entropy)
    if not with_entropy:
        return torch.cat(logprobs), None
    return torch.cat(logprobs), torch.cat(entropy)


# logits in one piece of the plain log-prob path: 16 MiB in float32, never (B, T, V) whole
LOGPROB_PIECE = 2**22


def _piece_logprobs(logits: torch.Tensor, labels: torch.Tensor, temperature: float, with_entropy: bool):
    """token_logprobs of one piece, whole: (rows, T, V), (rows, T) -> logprobs (rows, T), entropy (rows, T) or None."""
    log_p = torch.log_softmax(logits.float() / temperature, dim=-1)  # (rows, T, V)
    logprobs = log_p.gather(-1, labels[..., None]).squeeze(-1)  # (rows, T)
    if not with_entropy:
        return logprobs, None
    # A -inf logit (a masked vocabulary) has p_k log p_k = 0, not 0 · -inf = NaN. exp(-1e4) is 0 in float32 as
    # exp(-inf) is, so the clamp changes no p_k, and keeps the gradient finite (0, not 0 · inf).
    return logprobs, -(log_p.exp() * log_p.clamp(min=-1e4)).sum(-1)


def gather_logprobs(logits: torch.Tensor, labels: torch.Tensor, kernels_on: bool = False) -> torch.Tensor:
    """log softmax(logits)[labels]. (B, T', V), (B, T) -> (B, T), T <= T'"""
    return token_logprobs(logits, labels, kernels_on=kernels_on)[0]


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


def masked_mean(
    x: torch.Tensor, mask: torch.Tensor, dim: Optional[int] = None, all_sum: Optional[Callable] = None
):
    """The mean of the masked entries (along `dim`). With `all_sum`, a sum over the processes (under torchrun,
    infra.distributed.all_sum): the mean of every rank's entries, all of them (no `dim`)."""
    if all_sum:  # Σ over the ranks of each one's sum and count; the plain mean in one process
        return all_sum(masked_sum(x, mask)) / all_sum(mask.sum()).clamp(min=1)
    return masked_sum(x, mask, dim) / (mask.sum() if dim is None else mask.sum(dim)).clamp(min=1)


def masked_whiten(
    x: torch.Tensor,
    mask: torch.Tensor,
    shift_mean: bool = True,
    eps: float = 1e-8,
    all_sum: Optional[Callable] = None,
) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) over masked entries, population variance (divide by N, not N-1); with all_sum:
    one mean and variance for the whole batch under torchrun, from every rank's entries (masked_mean)."""
    mean = masked_mean(x, mask, all_sum=all_sum)
    var = masked_mean((x - mean) ** 2, mask, all_sum=all_sum)
    whitened = (x - mean) * torch.rsqrt(var + eps)
    return whitened if shift_mean else whitened + mean


# |log w| beyond which a token counts as mismatched in `mismatch/frac_over_0.1`: w outside [0.905, 1.105]
MISMATCH_THRESHOLD = 0.1


def mismatch_metrics(
    trainer_logprobs: torch.Tensor,  # (B, T) log π_train at the sampled tokens
    sampler_logprobs: torch.Tensor,  # (B, T) log π_sampler of the same tokens, as the sampler drew them
    mask: torch.Tensor,  # (B, T)
) -> dict[str, float]:
    """The sampler is not the trainer: their log-probs of the tokens the sampler drew, w = π_train / π_sampler.

    The sampler decodes token by token against a key/value cache (on a CPU in bfloat16 with packed weights, see
    infra/kernels.py) and truncates to a nucleus when --top-p < 1; the trainer runs the whole sequence through the
    same weights. Every sampling script logs the gap, as floats:
    mismatch/kl              token mean of k3 = w - 1 - log w (Schulman 2020, "Approximating KL"): >= 0, 0 only
                             where the two agree, low in variance; an unbiased estimate of KL(π_sampler || π_train)
                             only while E_sampler[w] = 1, i.e. the sampler can draw every token the trainer can
    mismatch/k1              token mean of k1 = -log w: unbiased always, noisy, may be < 0. Under a nucleus
                             the sampler never draws the tokens it cut, E_sampler[w] = m (the mass kept) < 1,
                             and k3 reads m - 1 - log m where the KL is -log m: there, read k1
    mismatch/max_log_ratio   the largest |log w| of any token
    mismatch/frac_over_0.1   the share of tokens with |log w| > MISMATCH_THRESHOLD (0.1 nats)
    """
    log_w = (trainer_logprobs - sampler_logprobs).detach().float()  # (B, T) log w
    k3 = torch.exp(log_w) - 1.0 - log_w
    beyond = (log_w.abs() > MISMATCH_THRESHOLD).float()
    largest = log_w.abs().masked_fill(mask == 0, 0.0).max()
    return {
        "mismatch/kl": masked_mean(k3, mask).item(),
        "mismatch/k1": masked_mean(-log_w, mask).item(),
        "mismatch/max_log_ratio": largest.item(),
        "mismatch/frac_over_0.1": masked_mean(beyond, mask).item(),
    }


def reward_scores(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """r(x, y): a score-head model read at the last real token of each prompt + completion row. (B, L) -> (B,) float

    The last real token is found from the attention mask and positions come from it too, so left,
    right or mixed padding of any amount gives the same score. (transformers' own pooling looks
    for the last token that is not the pad id, which skips a final EOS when pad == eos, as in
    SmolLM2 and gpt2; read a reward model's scores with this function.)
    """
    inner = unwrap(model)
    with autocast(model):
        # (B, L, H)
        hidden = inner.base_model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids(attention_mask)
        ).last_hidden_state
        last = attention_mask.shape[1] - 1 - attention_mask.flip(1).argmax(1)  # (B,) index of the last 1
        return inner.score(hidden[torch.arange(len(last), device=last.device), last]).squeeze(-1).float()


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
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
    [prompt, completion] rows (the other branch; the tests check they agree) and costs P*(S-1) +
    B*(T+1) token-forwards instead of B*(S+T). The prompt's last token, whose logits predict y_1,
    starts each completion's forward, so both branches end in one (B, T+1, V) logits tensor.
    Gradient checkpointing drops caches inside transformers, and a sharded model (--fsdp) frees the prompt forward's
    weights before the backward reaches it through the cache, so both take the concatenated branch.
    Returns logprobs (B, T) and entropy (B, T) or None; the entropy carries a gradient only with
    entropy_grad (an entropy bonus in the loss), else it is for logging.
    """
    _check_left_padded(prompt_mask)
    S, T = prompt_ids.shape[1], completion_ids.shape[1]
    # (B, S+T)
    full_mask = torch.cat([prompt_mask.repeat_interleave(repeats, 0), torch.ones_like(completion_ids)], 1)
    positions = position_ids(full_mask)  # (B, S+T)
    with autocast(model):
        checkpointing = model.is_activation_checkpointing and model.training
        # --fsdp: the cache is not shared across the ranks' gathers
        sharded = getattr(model, "sharded", False)
        if share_prompt and not checkpointing and not sharded:
            cache = None  # a one-token prompt has nothing to share
            if S > 1:  # (its logits are not used: logits_to_keep=1 keeps that cheap)
                out = model(
                    input_ids=prompt_ids[:, :-1],
                    attention_mask=prompt_mask[:, :-1],
                    use_cache=True,
                    position_ids=position_ids(prompt_mask)[:, :-1],
                    logits_to_keep=1,
                )
                cache = out[CACHE]
                _repeat_cache(cache, repeats)
            # (B, 1+T)
            input_ids = torch.cat([prompt_ids[:, -1:].repeat_interleave(repeats, dim=0), completion_ids], 1)
            logits = model(
                input_ids=input_ids,
                attention_mask=full_mask,
                position_ids=positions[:, S - 1 :],
                use_cache=True,
                **{CACHE: cache},
            ).logits
        else:
            # (B, S+T)
            input_ids = torch.cat([prompt_ids.repeat_interleave(repeats, dim=0), completion_ids], dim=1)
            logits = model(
                input_ids=input_ids, attention_mask=full_mask, position_ids=positions, logits_to_keep=T + 1
            ).logits
    # logits (B, T+1, V) predict y_1..y_T, then nothing; divided by the temperature the tokens were sampled at
    logprobs, entropy = token_logprobs(logits, completion_ids, temperature, with_entropy, kernels_on(model))
    if entropy is not None and not entropy_grad:
        entropy = entropy.detach()
    return logprobs, entropy


# ---------------------------------------------------------------------------------------------
# Sampling
# ---------------------------------------------------------------------------------------------
def check_fits(model, prompt_tokens: int, max_new_tokens: int) -> None:
    """Refuse a prompt + completion longer than the model's positions (Llama would run past them, GPT-2 crash)."""
    limit = getattr(model.config, "max_position_embeddings", None) or getattr(
        model.config, "n_positions", None
    )
    if limit is not None and prompt_tokens + max_new_tokens > limit:
        raise InputError(
            f"a prompt of {prompt_tokens} tokens plus --max-new-tokens {max_new_tokens} exceeds the "
            "model's "
            f"{limit} positions; lower --max-new-tokens to at most {limit - prompt_tokens}"
        )


def sample_completions(*args, **kwargs) -> torch.Tensor:
    """The completions of sample_with_logprobs alone: (P, S) -> (P*G, T) token ids."""
    return sample_with_logprobs(*args, **kwargs)[0]


@torch.no_grad()
def sample_with_logprobs(
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
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample G completions for each prompt with a key/value cache: (P, S) -> ids (P*G, T), T <= max_new_tokens,
    and the sampler's log-prob of each token it drew (P*G, T), float32, 0 after a row's EOS.

    Completions of prompt p are rows p*G .. p*G+G-1. The prompt is encoded once and its cache
    repeated G times. Sampling is from softmax(logits / temperature), nucleus-truncated when
    top_p < 1, no top-k. Rows that have emitted EOS are padded with pad_token_id; the loop stops
    when every row has finished. The log-probs are those of the distribution each token was drawn
    from (after the temperature and the nucleus's renormalisation), computed by this code path (its
    attention, its cache, its kernels): the trainer's forward may differ from them (common.mismatch_metrics).
    """
    _check_left_padded(prompt_mask)
    check_fits(model, prompt_ids.shape[1], max_new_tokens)
    sampling = (max_new_tokens, eos_token_id, pad_token_id, temperature, top_p, generator)
    if hasattr(model, "decoder"):  # --decode compiled: infra/decoding.py, the same tokens
        return model.decoder.sample(prompt_ids, prompt_mask, num_samples, *sampling)
    rows = prompt_ids.shape[0] * num_samples
    if kernels_on(model):  # kernels.cpu_bf16_decoding: the same tokens, faster on a CPU in bfloat16
        from infra import kernels

        decoding = kernels.cpu_bf16_decoding(model, rows)
    else:  # plain: the model as it is
        decoding = contextlib.nullcontext()
    with autocast(model), decoding:
        return _sample(model, prompt_ids, prompt_mask, num_samples, *sampling)


def _sample(
    model,
    prompt_ids,
    prompt_mask,
    num_samples,
    max_new_tokens,
    eos_token_id,
    pad_token_id,
    temperature,
    top_p,
    generator,
):
    repeats = torch.full((prompt_ids.shape[0],), num_samples, device=prompt_ids.device)
    out = model(
        input_ids=prompt_ids,
        attention_mask=prompt_mask,
        position_ids=position_ids(prompt_mask),
        use_cache=True,
        logits_to_keep=1,
    )
    cache = out[CACHE]
    _repeat_cache(cache, repeats)
    attention_mask = prompt_mask.repeat_interleave(repeats, dim=0)  # (B, S)
    next_logits = out.logits[:, -1].repeat_interleave(repeats, dim=0)  # (B, V)
    finished = torch.zeros(attention_mask.shape[0], dtype=torch.bool, device=prompt_ids.device)
    tokens = []
    logprobs = []
    for _ in range(max_new_tokens):
        token, logprob = _sample_token(next_logits.float(), temperature, top_p, generator)  # (B,), (B,)
        token = torch.where(finished, pad_token_id, token)
        tokens.append(token)
        logprobs.append(torch.where(finished, 0.0, logprob))
        finished |= token == eos_token_id
        if all_finished(model, finished):
            break
        attention_mask = torch.cat([attention_mask, torch.ones_like(attention_mask[:, :1])], dim=1)
        position = attention_mask.sum(1, keepdim=True) - 1  # (B, 1)
        out = model(
            input_ids=token[:, None],
            attention_mask=attention_mask,
            position_ids=position,
            use_cache=True,
            **{CACHE: cache},
        )
        next_logits = out.logits[:, -1]
    return torch.stack(tokens, dim=1), torch.stack(logprobs, dim=1)


def all_finished(model, finished: torch.Tensor) -> bool:
    """Whether every row has finished: this process's rows, or with a sharded model (--fsdp marks it `sharded`) every
    rank's, since each forward gathers the weights from all the ranks: they decode until the last row of any ends."""
    done = finished.all().to(torch.int32)
    if getattr(model, "sharded", False):
        torch.distributed.all_reduce(done, op=torch.distributed.ReduceOp.MIN)
    return bool(done)


def _sample_token(logits: torch.Tensor, temperature: float, top_p: float, generator):
    """One token a row from softmax(logits / temperature), nucleus-truncated when top_p < 1: (B, V) -> token (B,)
    and its log-prob under the distribution it was drawn from (B,): log(p_k / Σ kept p), 0 when greedy (a point mass).
    """
    if temperature == 0:
        token = logits.argmax(-1)
        return token, torch.zeros_like(logits[:, 0])
    # Inverse-CDF sampling: one uniform per row. torch.multinomial draws an exponential per vocabulary
    # entry, which on a CPU cost a third of all generation time at V = 49k.
    return token_from_uniform(
        logits, temperature, top_p, torch.rand(logits.shape[0], 1, device=logits.device, generator=generator)
    )


def token_from_uniform(logits: torch.Tensor, temperature: float, top_p: float, u: torch.Tensor):
    """_sample_token's draw for given uniforms u (B, 1) in [0, 1): (B, V) -> token (B,), its log-prob (B,)."""
    probs = torch.softmax(logits / temperature, dim=-1)  # (B, V)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        drop = sorted_probs.cumsum(-1) - sorted_probs > top_p  # keep the smallest set with mass >= top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    cdf = probs.cumsum(dim=-1)  # (B, V)
    u = u * cdf[:, -1:]
    # The first token whose cumulative mass exceeds u (right=True): at u = 0 exactly, the first with any mass,
    # never a token of zero mass before it (searchsorted's default would return token 0 there).
    token = torch.searchsorted(cdf, u, right=True).clamp(max=cdf.shape[-1] - 1)  # (B, 1)
    # the draw's distribution is p / cdf[-1], the kept mass (1 up to rounding without a nucleus)
    logprob = torch.log(probs.gather(-1, token)) - torch.log(cdf[:, -1:])
    return token.squeeze(-1), logprob.squeeze(-1)
