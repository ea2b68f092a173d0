"""The sampler is not the trainer: how far apart they are, and the importance weights that correct for it.

An RL step draws completions with one computation and differentiates another. Here the sampler decodes
token by token against a key/value cache (on a CPU in bfloat16 with sdpa attention and packed weights, see
infra/kernels.py), truncates to a nucleus when --top-p < 1, and with --staleness k is the policy of k
training steps ago; the trainer runs the full sequence through the current weights. Their log-probs of the
same tokens differ, so a loss that assumes the tokens came from the trainer's π takes a gradient that is
not the on-policy one. Every sampling script logs the gap (mismatch_metrics); grpo.py can correct for it
(importance_weights, `--is-correction`, `--is-cap`).

With w = π_train(y_t | ·) / π_sampler(y_t | ·) at a token the sampler drew, E_sampler[w · f] = E_train[f]:
weighting each token's policy-gradient term by w makes the sampler's tokens stand in for the trainer's.
An unbounded w has an unbounded variance, so it is capped:
- truncated (TIS: Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training";
  the truncation of IMPALA's V-trace, Espeholt et al. 2018, arXiv:1802.01561): min(w, C). Biased toward
  the sampler where w > C, variance at most C².
- masked (MIS: Liu et al. 2025, "When Speed Kills Stability: Demystifying RL Collapse from the
  Training-Inference Mismatch"): w where 1/C <= w <= C, else 0, so a token (or sequence) the two
  disagree on by more than a factor C leaves the loss, and the rest keep their w.
Per sequence, w_i = Π_t w_it = π_train(o_i) / π_sampler(o_i), the sequence's own importance ratio, computed in log
space (exp Σ_t log w_it, capped before it can overflow) and given to every token of o_i, so a sequence is kept or
dropped whole: TRL's `sequence_truncate` and `sequence_mask`, verl's sequence level. Only the product makes
E_sampler[w_i · f(o_i)] = E_train[f(o_i)]; the geometric mean exp(mean_t log w_it) (GSPO's ratio) does not, stays
near 1 on a drifted sequence (32 tokens each 0.033 nats off: product 2.87, geometric mean 1.034) and is not built here.
The weight is a constant (no gradient): it rescales each token's ∇ log π, it is not optimised.

Shapes: B sequences, T completion tokens; log-probs float32, mask 1 on the completion's tokens.
"""

from __future__ import annotations

import collections
import math
from typing import Any, Callable, Literal, get_args

import torch

from common import masked_mean, masked_sum

Correction = Literal["none", "token-truncate", "token-mask", "sequence-truncate", "sequence-mask"]
CORRECTIONS = get_args(Correction)
# |log w| beyond which a token counts as mismatched in `mismatch/frac_over_0.1`: w outside [0.905, 1.105]
MISMATCH_THRESHOLD = 0.1


def mismatch_metrics(
    trainer_logprobs: torch.Tensor,  # (B, T) log π_train at the sampled tokens
    sampler_logprobs: torch.Tensor,  # (B, T) log π_sampler of the same tokens, as the sampler drew them
    mask: torch.Tensor,  # (B, T)
) -> dict[str, float]:
    """The gap between trainer and sampler at the tokens the sampler drew, as floats:
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


def importance_weights(
    trainer_logprobs: torch.Tensor,  # (B, T) log π_train
    sampler_logprobs: torch.Tensor,  # (B, T) log π_sampler
    mask: torch.Tensor,  # (B, T)
    correction: str,
    cap: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The weight of each token's policy-gradient term (see the module docstring) and where the cap acted:
    (B, T) each -> weights (B, T), constant, and cut (B, T) bool: the tokens truncated to C, or dropped.

      none                 1
      token-truncate       min(w_t, C)                                  TIS
      token-mask           w_t · 1[1/C <= w_t <= C]                     MIS, per token
      sequence-truncate    min(w_i, C),  w_i = exp(Σ_t log w_it)        for every token of o_i
      sequence-mask        w_i · 1[1/C <= w_i <= C]                     MIS, per sequence
    """
    if correction not in CORRECTIONS:
        raise ValueError(f"unknown correction {correction!r}; one of {CORRECTIONS}")
    # (B, T) log w, a constant: no gradient flows through a weight
    log_w = (trainer_logprobs - sampler_logprobs).detach().float()
    if correction == "none":
        return torch.ones_like(log_w), torch.zeros_like(log_w, dtype=torch.bool)
    level, action = correction.split("-")
    if level == "sequence":  # log Π_t w_it over the sequence's own tokens, padding left out
        log_w = masked_sum(log_w, mask, dim=1)[:, None].expand_as(log_w)
    # e^800 is inf in float32: min(inf, C) is C and a masked inf is 0, so neither reaches the loss
    weights = torch.exp(log_w)
    if action == "truncate":
        cut = log_w > math.log(cap)
        return weights.clamp(max=cap), cut
    cut = log_w.abs() > math.log(cap)  # w outside [1/C, C]
    return weights.masked_fill(cut, 0.0), cut


class StaleQueue:
    """Batches sampled ahead of the trainer: `next()` returns the batch sampled `staleness` training steps
    before the current one (× μ optimizer steps in GRPO), as an asynchronous trainer's queue would. The first
    call samples staleness + 1 batches from the starting policy, each later call one more, and the last
    `staleness` calls none, so a run samples exactly `total` batches, as many as on-policy. Batch t (from 0)
    is drawn by sample(t), by the policy after max(0, t - staleness) training steps."""

    def __init__(self, sample: Callable[[int], Any], staleness: int, total: int):
        self.sample = sample
        self.staleness = staleness
        self.total = total
        self.drawn = 0
        self.queue = collections.deque()

    def next(self):
        while len(self.queue) <= self.staleness and self.drawn < self.total:
            self.queue.append(self.sample(self.drawn))
            self.drawn += 1
        return self.queue.popleft()
