"""A step's metrics, gathered one call per concern so that the loops keep only their algorithm: the wall time and memory
of each phase (PhaseClock), PPO's means over its minibatches (MinibatchMeans), GRPO's token-weighted sums over its
micro-batches and iterations (MicroBatchSums), where its clip binds (clip_fractions). Each is exact: the numbers a
loop would get by summing by hand."""

from __future__ import annotations

import collections
import time

import torch

import common
from common import masked_mean
from infra import distributed
from infra import metrics
from infra.runs import peak_memory_gb


class PhaseClock:
    """A step's cost, phase by phase: lap(name) at the end of each phase records its wall time (time/<name>) and the
    peak memory by then (memory/<name>_gb); stats(tokens) adds time/step and tokens_per_second since start()."""

    def __init__(self, device: torch.device):
        self.device = device

    def start(self) -> None:
        self.begun = self.last = time.time()
        self.laps = {}

    def lap(self, name: str) -> None:
        now = time.time()
        self.laps[f"time/{name}"] = now - self.last
        self.laps[f"memory/{name}_gb"] = peak_memory_gb(self.device)
        self.last = now

    def stats(self, tokens: float) -> dict:
        step = time.time() - self.begun
        return {**self.laps, "time/step": step, "tokens_per_second": tokens / step}


class MinibatchMeans:
    """A step's metrics over its minibatches, each added once: `token_means` (a loss, a ratio: token means over this
    rank's rows of a minibatch) weighted by `share`, this rank's part of the minibatch's tokens, × the ranks, so that
    their mean over the ranks (distributed.mean_over_ranks) is the whole minibatch's token mean; the `plain` ones
    (gradient norms) as they are. mean() -> the mean over the minibatches, as floats."""

    def __init__(self):
        self.rows = []

    def add(self, share: float, token_means: dict, plain: dict) -> None:
        scale = share * distributed.world_size()
        # a loss still holding its graph: detached, and as a float
        self.rows.append(
            {**{k: float(torch.as_tensor(v).detach()) * scale for k, v in token_means.items()}, **plain}
        )

    def mean(self) -> dict:
        return {k: sum(float(row[k]) for row in self.rows) / len(self.rows) for k in self.rows[0]}


class MicroBatchSums:
    """A GRPO update's metrics over the whole batch, every rank's: each micro-batch's token means (kl, clip_ratio)
    weighted by its share of the batch's tokens, and its loss by its weight (micro_batch_weight), summed over the
    micro-batches and averaged over the μ iterations; the entropy is the first iteration's, the sampling policy's
    (add it with entropy, (rows, T), then, and None after). totals() -> floats, summed over the ranks."""

    def __init__(self, batch_tokens: torch.Tensor, iterations: int):
        self.batch_tokens = batch_tokens  # every rank's
        self.iterations = iterations
        self.sums = collections.defaultdict(float)
        self.entropy = 0.0

    def add(
        self, token_means: dict, mask: torch.Tensor, loss: torch.Tensor, weight: float, entropy=None
    ) -> None:
        share = (mask.sum() / self.batch_tokens).item()
        for k, v in token_means.items():
            self.sums[k] += v * share
        self.sums["loss"] += loss.item() * weight
        if entropy is not None:
            self.entropy += masked_mean(entropy, mask).item() * share

    def totals(self) -> dict:
        # an iteration's shares (and loss weights) sum to 1: ÷ μ averages them; Σ the ranks' parts
        means = {k: distributed.all_sum(v) / self.iterations for k, v in self.sums.items()}
        return {**means, "entropy": distributed.all_sum(self.entropy)}


def add_ppo_minibatch(
    means: MinibatchMeans,
    share: float,
    policy_metrics: dict,
    pg_loss: torch.Tensor,
    policy_loss: torch.Tensor,
    vf_loss: torch.Tensor,
    value_clip_ratio: float,
    entropy: torch.Tensor,
    grad_norm: torch.Tensor,
    critic_grad_norm: torch.Tensor,
) -> None:
    """One PPO minibatch into `means`: its token means (ppo_policy_loss's metrics, the losses, the value clip ratio,
    the entropy) weighted by `share`, and the two gradient norms as they are."""
    token_means = {
        **policy_metrics,
        "pg_loss": pg_loss,
        "policy_loss": policy_loss,
        "vf_loss": vf_loss,
        "value_clip_ratio": value_clip_ratio,
        "entropy": entropy,
    }
    means.add(share, token_means, {"grad_norm": grad_norm, "critic/grad_norm": critic_grad_norm})


def ppo_step_stats(
    scores: torch.Tensor,  # (B,) r_θ(x, y)
    penalised: torch.Tensor,  # (B,) the scores less --missing-eos-penalty: what the rewards add
    verified: torch.Tensor,  # (B,) the verifier's 0/1 of the same completions
    kl: torch.Tensor,  # (B, T) the KL in the rewards, per token, 0 on padding
    kl_per_completion: float,  # Σ_t KL_t, the whole batch's mean
    kl_coef: float,  # the β the rewards used
    minibatch_means: dict,  # the update's (MinibatchMeans.mean)
    explained_variance: float,
    completion_ids: torch.Tensor,  # (B, T)
    mask: torch.Tensor,  # (B, T)
    finished: torch.Tensor,  # (B,) ended with EOS
    old_logprobs: torch.Tensor,  # (B, T) π_old's, the trainer's, at the sampled tokens
    sampler_logprobs: torch.Tensor,  # (B, T) the same tokens' as the sampler drew them
    clock: PhaseClock,
) -> dict:
    """PPO's line of metrics.jsonl under TRL's names, as floats averaged over the ranks: the score, the verifier and
    the KL part of the reward (non_score_reward = -β Σ_t KL_t), the update's means, the completions, the sampler
    against the trainer and the phases' times."""
    non_score = (-kl_coef * kl).sum(1)  # (B,)
    stats = {
        "score": scores.mean().item(),
        "score_penalised": penalised.mean().item(),
        "verifier": verified.mean().item(),  # the true reward of the same samples: over-optimisation shows
        "kl": kl_per_completion,
        "kl_coef": kl_coef,
        "non_score_reward": non_score.mean().item(),
        "rlhf_reward": (penalised + non_score).mean().item(),
        **minibatch_means,
        "explained_variance": explained_variance,
        "completion_length": mask.sum(1).float().mean().item(),
        "completion_finished": finished.float().mean().item(),
        # the batch (a rank's share)
        "completions/distinct": metrics.distinct_fraction(completion_ids, mask, len(completion_ids)),
        # the sampler against the trainer (π_old), at the sampled tokens
        **common.mismatch_metrics(old_logprobs, sampler_logprobs, mask),
        **clock.stats(tokens=mask.sum().item()),
    }
    # the batch's (but distinct: within a rank's share; timings)
    return distributed.mean_over_ranks(stats)


def clip_fractions(
    ratio: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, eps_low: float, eps_high: float
) -> dict:
    """The share of the masked tokens where GRPO's clip binds, as TRL logs it: below 1 - eps_low where Â < 0 (where it
    lowers J), above 1 + eps_high where Â > 0, and either. (B, T) ρ, (B, 1) or (B, T) Â, (B, T) mask -> floats"""
    low = (ratio < 1.0 - eps_low) & (adv < 0)
    high = (ratio > 1.0 + eps_high) & (adv > 0)
    return {
        "clip_ratio": masked_mean((low | high).float(), mask).item(),
        "clip_ratio/low": masked_mean(low.float(), mask).item(),
        "clip_ratio/high": masked_mean(high.float(), mask).item(),
    }
