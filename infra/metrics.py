"""What a run logs and no loss reads: metrics.jsonl (and TensorBoard or Weights & Biases), curves.png, a batch's
reward metrics (reward_stats), and what a step's sampled completions look like: their length, how many the limit cut,
how many of a group are alike (mode collapse), and how fast they came (speeds)."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch


def distinct_fraction(completion_ids: torch.Tensor, mask: torch.Tensor, group_size: int | list[int]) -> float:
    """Mode collapse, measured (logged as completions/distinct): the fraction of distinct completions in each
    group of `group_size` consecutive rows, averaged over the groups; group_size = B for the whole batch, a list
    for groups of several sizes (each group's, in order). Completions compare by their tokens up to and including
    EOS, never by what follows. (B, T) -> float"""
    rows = [tuple(ids[m.bool()].tolist()) for ids, m in zip(completion_ids, mask)]
    groups = [[rows[i] for i in g] for g in torch.arange(len(rows)).split(group_size)]
    return sum(len(set(g)) / len(g) for g in groups) / len(groups)


def completion_stats(
    completion_ids: torch.Tensor, mask: torch.Tensor, eos: int, group_size: int | list[int], seconds: float
) -> dict[str, float]:
    """TRL's names for the completions (B, T) sampled in `seconds`, as floats."""
    lengths = mask.sum(1)  # (B,)
    return {
        "completion_length": lengths.float().mean().item(),
        # 1/G: a group all alike
        "completions/distinct": distinct_fraction(completion_ids, mask, group_size),
        "completion_truncated": (~(completion_ids == eos).any(1)).float().mean().item(),  # cut: no EOS
        "time/generate": seconds,
        "tokens_per_second/generate": lengths.sum().item() / seconds,
    }


def reward_stats(rewards, scores, scored, names: tuple[str, ...], group_size: int, learned: bool) -> dict:
    """TRL's reward metrics of a batch, as floats: the reward (B,) and its spread within the groups, the score (B,)
    before any overlong penalty, each of --rewards (scored: tasks.Scored), and with a learned reward the verifier
    beside it (the true one)."""
    grouped = rewards.view(-1, group_size)  # (P, G)
    stats = {
        "reward": rewards.mean().item(),
        "reward_std": grouped.std(dim=1, unbiased=False).mean().item(),
        "frac_reward_zero_std": (grouped.amax(1) == grouped.amin(1)).float().mean().item(),
        "score": scores.mean().item(),
        **{f"rewards/{name}/mean": scored.rewards[:, k].mean().item() for k, name in enumerate(names)},
        "reward/unearned": sum(scored.unearned) / len(scored.unearned),
    }
    if learned:
        stats["verifier"] = scored.verified.mean().item()
    return stats


def speeds(start: float, time_train: float, sampled_tokens, trained_tokens) -> dict:
    """A step's wall time since `start` (time.time()) and its training phase's, and the tokens a second of each: the
    completion tokens sampled over the whole step, and those the update read (μ passes over a batch); the counts as
    numbers or one-element tensors."""
    step = time.time() - start
    return {
        "time/train": time_train,
        "time/step": step,
        "tokens_per_second": float(sampled_tokens) / step,
        "tokens_per_second/train": float(trained_tokens) / time_train,
    }


class MetricsLog:
    """Appends one JSON line per step to metrics.jsonl and, with --report-to, sends the same numbers to TensorBoard or
    Weights & Biases under TRL's names (train/reward, eval/accuracy, ...). Resuming from step k drops the lines after
    k (steps the interrupted run logged but never checkpointed), so no step is logged twice in metrics.jsonl."""

    def __init__(self, path: Path, resume_step: int = 0, report_to: str = "none", args=None):
        self.path = path
        self.start = time.time()
        if resume_step and path.exists():
            rows = [
                line for line in path.read_text().splitlines(True) if json.loads(line)["step"] <= resume_step
            ]
            path.write_text("".join(rows))
        self.tensorboard = self.wandb = None
        if report_to == "tensorboard":
            from torch.utils.tensorboard import SummaryWriter

            self.tensorboard = SummaryWriter(
                str(path.parent / "tensorboard"), purge_step=resume_step + 1 if resume_step else None
            )
        elif report_to == "wandb":
            import wandb

            from infra import hub  # its network probe, needed only here

            # Offline (files in the run folder, `wandb sync` them later) unless WANDB_MODE says otherwise
            # and the service can be reached: a machine without a network must not hang or fail here.
            mode = os.environ.get("WANDB_MODE") or ("online" if hub.reachable("api.wandb.ai") else "offline")
            self.wandb = wandb.init(
                project="minimal-rlhf",
                name=path.parent.name,
                dir=str(path.parent),
                mode=mode,
                id=re.sub(r"[^\w-]", "-", path.parent.name),
                resume="allow",
                config=asdict(args) if args is not None else None,
            )

    def write(self, step: int, metrics: dict) -> None:
        """metrics.jsonl gets 6 significant digits (an lr of 2e-7 stays 2e-7), the trackers the values as they are."""
        row = {"step": step, "time/elapsed": round(time.time() - self.start, 2), **metrics}
        with open(self.path, "a") as f:
            f.write(
                json.dumps({k: float(f"{v:.6g}") if isinstance(v, float) else v for k, v in row.items()})
                + "\n"
            )
        self.track(step, {f"train/{k}": v for k, v in row.items() if k != "step"})

    def track(self, step: int, metrics: dict) -> None:
        numbers = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
        if self.tensorboard is not None:
            for k, v in numbers.items():
                self.tensorboard.add_scalar(k, v, step)
            self.tensorboard.flush()  # a killed run keeps every step it logged
        if self.wandb is not None:
            self.wandb.log(numbers, step=step)

    def write_eval(self, evaluation: dict) -> dict:
        """An evaluation's numbers to the tracker as eval/... (eval.json keeps them, not metrics.jsonl)."""
        self.track(
            evaluation["step"],
            {k if k.startswith("eval/") else f"eval/{k}": v for k, v in evaluation.items() if k != "step"},
        )
        return evaluation

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()
        if self.wandb is not None:
            self.wandb.finish()


def plot_curves(run_dir: Path, evals: list[dict], accuracy_key: str = "accuracy") -> None:
    """curves.png: reward (or loss), KL and held-out accuracy against step; skipped, with a note, without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: curves.png skipped (pip install matplotlib to draw it)", file=sys.stderr)
        return
    rows = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    first = "reward" if any("reward" in r for r in rows) else "loss"
    panels = [
        (first, [(r["step"], r[first]) for r in rows if first in r]),
        ("kl", [(r["step"], r["kl"]) for r in rows if "kl" in r]),
        (f"held-out {accuracy_key}", [(e["step"], e[accuracy_key]) for e in evals if accuracy_key in e]),
    ]
    panels = [(name, points) for name, points in panels if points]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.2), squeeze=False)
    for ax, (name, points) in zip(axes[0], panels):
        ax.plot(*zip(*points), marker="o" if name.startswith("held-out") else None, markersize=4)
        ax.set(title=name, xlabel="step")
        ax.grid(alpha=0.3)
    fig.suptitle(run_dir.name, fontsize=9)
    fig.tight_layout()
    fig.savefig(run_dir / "curves.tmp.png", dpi=110)
    plt.close(fig)
    (run_dir / "curves.tmp.png").replace(run_dir / "curves.png")
