"""The sampler against the trainer on one model before any update: the gap grpo.py logs as `mismatch/*`, per
precision, kernels and nucleus, and under a nucleus the gap predicted beside the gap measured.

For each setting, P prompts × G samples of the training stream (grpo.py's defaults: 16 × 8, 32 tokens, temperature
1) are drawn by common.sample_with_logprobs, which returns each token's log-prob as the sampler drew it. The same
tokens then go through the trainer's forward (common.completion_logprobs, the model in train mode as in an update)
and common.mismatch_metrics compares the two: mismatch/kl (k3, an estimate of KL(π_sampler ‖ π_train) per
token), the largest |log w| and the share of tokens beyond 0.1 nats, with w = π_train / π_sampler.

A nucleus (--top-p p < 1) samples from p_k / m over the kept tokens, m the mass kept, and the trainer reads the
full softmax p_k: log w = log m at every token, so KL(π_sampler ‖ π_train) = E[-log m]. The `predicted` column is
that mean of -log m over the sampled tokens, m computed from the trainer's own softmax at each position; the
measured mismatch/k1 should equal it in float32, and exceed it by the precision's own gap in bfloat16 (k3,
mismatch/kl, reads m - 1 - log m a token there: see common.mismatch_metrics).

Run:
    python scripts/mismatch.py                               # fp32, bf16-mixed with kernels on and off, top-p 1 and 0.9
    python scripts/mismatch.py --device cuda --settings bf16-mixed:off:1.0 bf16-mixed:off:0.9   # the GPU check's
    python scripts/mismatch.py --model tiny --prompts 2 --group-size 2 --batches 1 --settings fp32:off:0.9

Prints a markdown table; --out FILE also writes the rows as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import common  # noqa: E402
from infra import models  # noqa: E402
from task import tasks  # noqa: E402

DEFAULT_SETTINGS = [
    "fp32:off:1.0",
    "bf16-mixed:on:1.0",
    "bf16-mixed:off:1.0",
    "fp32:off:0.9",
    "bf16-mixed:on:0.9",
]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--model", default="smollm2", help="smollm2 (embedded), tiny, or a checkpoint")
    parser.add_argument(
        "--settings",
        nargs="+",
        default=DEFAULT_SETTINGS,
        help="PRECISION:KERNELS:TOP_P each (precision fp32 or bf16-mixed, kernels on or off)",
    )
    parser.add_argument(
        "--prompts", type=int, default=16, help="prompts a batch (grpo.py's --prompts-per-step)"
    )
    parser.add_argument("--group-size", type=int, default=8, help="samples a prompt")
    parser.add_argument(
        "--batches", type=int, default=2, help="batches a setting, the same ones in every setting"
    )
    parser.add_argument("--max-new-tokens", type=int, default=32, help="the longest sample, in tokens")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--seed", type=int, default=0, help="the problems' and the samples' seed")
    parser.add_argument("--out", default=None, help="also write the rows here, as JSON")
    args = parser.parse_args(argv)
    for setting in args.settings:
        parts = setting.split(":")
        ok = len(parts) == 3 and parts[0] in ("fp32", "bf16-mixed") and parts[1] in ("on", "off")
        if not ok:
            parser.error(f"--settings {setting!r}: PRECISION:KERNELS:TOP_P, e.g. bf16-mixed:on:0.9")
        try:
            top_p = float(parts[2])
        except ValueError:
            top_p = -1.0
        if not 0 < top_p <= 1:
            parser.error(f"--settings {setting!r}: TOP_P must be in (0, 1]")
    if min(args.prompts, args.group_size, args.batches, args.max_new_tokens) < 1:
        parser.error("--prompts, --group-size, --batches and --max-new-tokens must be at least 1")
    return args


def kept_mass(logits: torch.Tensor, labels: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """The mass m the nucleus keeps at each position, from these logits: (B, T', V), (B, T) -> (B, T), float32."""
    masses = []
    for row in range(labels.shape[0]):  # a row at a time: (T, V) sorted is the largest temporary
        probs = torch.softmax(logits[row, : labels.shape[1]].float() / temperature, dim=-1)
        ordered = probs.sort(dim=-1, descending=True).values
        keep = ordered.cumsum(-1) - ordered <= top_p  # the same rule as common._sample_token
        masses.append((ordered * keep).sum(-1))
    return torch.stack(masses)


def measure(args, setting: str, device: torch.device) -> dict:
    precision, kernels, top_p = setting.split(":")
    top_p = float(top_p)
    tokenizer = models.load_tokenizer(args.model)
    policy = models.load_model(
        args.model, len(tokenizer), device, precision, args.seed, kernels_on=kernels == "on"
    )
    stream, _ = tasks.load_problems(None, args.seed, 1, args.prompts)
    generator = torch.Generator(device=device).manual_seed(args.seed)
    eos = tokenizer.eos_token_id
    sums = {"mismatch/kl": 0.0, "mismatch/frac_over_0.1": 0.0, "mean_log_ratio": 0.0, "predicted": 0.0}
    largest = 0.0
    tokens = 0
    t0 = time.time()
    for _ in range(args.batches):
        problems = [next(stream) for _ in range(args.prompts)]
        prompt_ids, prompt_mask = tasks.tokenize_prompts(tokenizer, [p.prompt for p in problems], device)
        policy.eval()
        completion_ids, sampler_logprobs = common.sample_with_logprobs(
            policy,
            prompt_ids,
            prompt_mask,
            args.group_size,
            args.max_new_tokens,
            eos,
            tokenizer.pad_token_id,
            args.temperature,
            top_p,
            generator,
        )
        mask = common.completion_mask(completion_ids, eos)
        repeats = torch.full((args.prompts,), args.group_size, device=device)
        policy.train()  # as an update reads them
        with torch.no_grad():
            trainer_logprobs, _ = common.completion_logprobs(
                policy, prompt_ids, prompt_mask, completion_ids, repeats, args.temperature
            )
        metrics = common.mismatch_metrics(trainer_logprobs, sampler_logprobs, mask)
        count = int(mask.sum())
        tokens += count
        sums["mismatch/kl"] += metrics["mismatch/kl"] * count
        sums["mismatch/frac_over_0.1"] += metrics["mismatch/frac_over_0.1"] * count
        sums["mean_log_ratio"] += common.masked_sum(sampler_logprobs - trainer_logprobs, mask).item()
        largest = max(largest, metrics["mismatch/max_log_ratio"])
        if top_p < 1:  # -log m at each sampled token, m from a full-sequence float32 forward
            with torch.no_grad(), common.autocast(policy):
                logits = full_logits(policy, prompt_ids, prompt_mask, completion_ids, repeats)
            sums["predicted"] += common.masked_sum(
                -torch.log(kept_mass(logits, completion_ids, args.temperature, top_p)), mask
            ).item()
    row = {"setting": setting, "tokens": tokens, **{k: v / tokens for k, v in sums.items()}}
    row["mismatch/max_log_ratio"] = largest
    row["seconds"] = time.time() - t0
    return row


def full_logits(policy, prompt_ids, prompt_mask, completion_ids, repeats) -> torch.Tensor:
    """The logits that predict each completion token, one forward on [prompt, completion]: (B, T+1, V)."""
    T = completion_ids.shape[1]
    full_mask = torch.cat([prompt_mask.repeat_interleave(repeats, 0), torch.ones_like(completion_ids)], 1)
    input_ids = torch.cat([prompt_ids.repeat_interleave(repeats, 0), completion_ids], 1)
    return policy(
        input_ids=input_ids,
        attention_mask=full_mask,
        position_ids=common.position_ids(full_mask),
        logits_to_keep=T + 1,
    ).logits


def table(rows: list[dict]) -> str:
    lines = [
        "| precision : kernels : top-p | tokens | mismatch/kl (k3) | mismatch/k1 | predicted -log m "
        "| largest abs log w | share beyond 0.1 nats |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        predicted = "0" if row["setting"].endswith(":1.0") else f"{row['predicted']:.5f}"
        lines.append(
            f"| {row['setting']} | {row['tokens']} | {row['mismatch/kl']:.2e} | {row['mean_log_ratio']:.2e} | "
            f"{predicted} | {row['mismatch/max_log_ratio']:.2e} | {row['mismatch/frac_over_0.1']:.4f} |"
        )
    return "\n".join(lines)


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    device = models.resolve_device(args.device)
    rows = []
    for setting in args.settings:
        rows.append(measure(args, setting, device))
        print(f"{setting}: {json.dumps({k: v for k, v in rows[-1].items() if k != 'setting'})}", flush=True)
    print(table(rows))
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")
    return rows


if __name__ == "__main__":
    main()
