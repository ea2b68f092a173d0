"""Does RL teach, or sharpen? pass@k from k = 1 to 256 on held-out problems, for several models.

    python scripts/pass_at_k_curve.py --models smollm2 runs/sft-…/model runs/grpo-…/model runs/rft-…/model \
        --labels start SFT GRPO RFT --out pass_at_k.json
    python scripts/pass_at_k_curve.py --models tiny --problems 2 --samples 4      # plumbing, in seconds

For each model: n samples of each of the first --problems held-out problems at temperature 1 (tasks.heldout_problems:
no training run sees them), c of them right by the verifier, and pass@k for every power of two k ≤ n by Chen et
al.'s unbiased estimator (tasks.pass_at_k, eq. 1) averaged over the problems. Yue et al. 2025 (arXiv:2504.13837)
report that RL-trained models beat their base at small k and fall under it at large k: RL sharpens what the base
can already sample rather than teaching it something new. The curves here say whether that holds at 135M on this
task. Each model draws from its own generator seeded by --seed, so every model meets the same random numbers.
Prints a markdown table; --out FILE writes the counts and the curves as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import common  # noqa: E402
from infra import models  # noqa: E402
from infra import runs  # noqa: E402
from task import tasks  # noqa: E402


def powers_of_two(n: int) -> list[int]:
    """1, 2, 4, ... up to n."""
    ks = [1]
    while ks[-1] * 2 <= n:
        ks.append(ks[-1] * 2)
    return ks


def pass_at_k_curve(correct: list[int], n: int) -> dict[int, float]:
    """{k: pass@k averaged over problems} for k = 1, 2, 4, ... ≤ n, from each problem's count of right samples
    among n (the unbiased estimator, not the share of problems with a right one among the first k)."""
    return {k: sum(tasks.pass_at_k(n, c, k) for c in correct) / len(correct) for k in powers_of_two(n)}


@torch.no_grad()
def correct_counts(
    model, tokenizer, problems, samples: int, chunk: int, max_new_tokens: int, seed: int
) -> list[int]:
    """For each problem, how many of `samples` completions at temperature 1 the verifier accepts; sampled `chunk`
    rows at a time from one prompt."""
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    eos = tokenizer.eos_token_id
    counts = []
    bar = runs.progress(len(problems) * samples, "samples")
    for problem in problems:
        ids, mask = tasks.tokenize_prompts(tokenizer, [problem.prompt], device)
        right = 0
        for start in range(0, samples, chunk):
            rows = min(chunk, samples - start)
            completion_ids = common.sample_completions(
                model, ids, mask, rows, max_new_tokens, eos, tokenizer.pad_token_id, generator=generator
            )
            texts = tasks.decode_completions(
                tokenizer, completion_ids, common.completion_mask(completion_ids, eos)
            )
            right = right + int(sum(tasks.verify(text, problem.answer) for text in texts))
            bar.update(rows)
        counts.append(right)
    bar.close()
    return counts


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--models", nargs="+", required=True, help="model names or checkpoint folders")
    parser.add_argument("--labels", nargs="*", default=[], help="one per model (default: the names)")
    parser.add_argument("--problems", type=int, default=50, help="the first N held-out problems")
    parser.add_argument("--samples", type=int, default=256, help="samples of each problem: n, the largest k")
    parser.add_argument("--chunk", type=int, default=128, help="samples drawn in one call")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--precision", default="auto", help="auto, fp32, bf16-mixed or bf16-true")
    parser.add_argument("--out", type=Path, help="write the counts and curves here as JSON")
    args = parser.parse_args(argv)
    labels = args.labels or args.models
    runs.require(len(labels) == len(args.models), "--labels: give one per model, or none")
    runs.require(
        args.problems >= 1 and args.samples >= 1 and args.chunk >= 1,
        "--problems, --samples and --chunk must be >= 1",
    )
    device = models.resolve_device(args.device)
    problems = tasks.heldout_problems(max(args.problems, tasks.DEFAULT_EVAL_SIZE))[: args.problems]
    result = {"problems": args.problems, "samples": args.samples, "seed": args.seed, "models": {}}
    for label, name in zip(labels, args.models):
        tokenizer = models.load_tokenizer(name)
        precision = models.resolve_precision(args.precision, device, name)
        kernels_on = models.resolve_kernels("auto", device)
        model = models.load_model(name, len(tokenizer), device, precision, kernels_on=kernels_on).eval()
        counts = correct_counts(
            model, tokenizer, problems, args.samples, args.chunk, args.max_new_tokens, args.seed
        )
        curve = pass_at_k_curve(counts, args.samples)
        result["models"][label] = {"model": name, "correct": counts, "pass_at_k": curve}
        del model
    ks = powers_of_two(args.samples)
    print("| model | " + " | ".join(f"pass@{k}" for k in ks) + " |")
    print("| --- |" + " --- |" * len(ks))
    for label, row in result["models"].items():
        print(f"| {label} | " + " | ".join(f"{row['pass_at_k'][k]:.3f}" for k in ks) + " |")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    runs.run_main(main, sys.argv[1:])
