"""A step's metrics, gathered one call per concern so that the loops keep only their algorithm: the wall time and
memory of each phase (PhaseClock), PPO's means over its minibatches (MinibatchMeans), GRPO's token-weighted sums over
its micro-batches and iterations (MicroBatchSums). Each is exact: the numbers a loop would get by summing by hand."""

from __future__ import annotations

import collections
import time

import torch

from common import masked_mean
from infra import distributed
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
