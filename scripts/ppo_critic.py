"""What a PPO run's critic has learned: its values against the returns by position in the completion, and how often
the advantage's sign agrees with the outcome, on a fresh batch from the run's own policy.

    python scripts/ppo_critic.py runs/ppo-smollm2-0-<time>                  # the run's saved policy and critic
    python scripts/ppo_critic.py runs/ppo-smollm2-0-<time> --batch-size 256 --seed 1000

The batch is drawn as ppo.py draws it (training problems, one completion each at the run's temperature) and scored by
the verifier; returns and advantages are ppo.py's (kl_penalized_rewards, compute_gae at the run's γ and λ,
masked_whiten), without the KL term: at the run's β it is a small part of a return (its size is printed), and
leaving it out needs no reference model. Prints, by position bucket, the mean return, the mean value and the
explained variance; then the share of tokens, and of first tokens, whose advantage has the sign of their
completion's outcome less the batch's mean outcome (a critic that knows nothing: the sign of the outcome alone).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import common  # noqa: E402
import ppo  # noqa: E402
from infra import models  # noqa: E402
from task import tasks  # noqa: E402


def by_position(values, returns, mask, width: int = 8) -> list[dict]:
    """Per bucket of `width` completion positions: tokens, mean return, mean value, explained variance. (B, T) each."""
    rows = []
    for start in range(0, mask.shape[1], width):
        part = slice(start, start + width)
        m = mask[:, part]
        if m.sum() == 0:
            break
        rows.append(
            {
                "positions": f"{start + 1}-{start + m.shape[1]}",
                "tokens": int(m.sum()),
                "return": common.masked_mean(returns[:, part], m).item(),
                "value": common.masked_mean(values[:, part], m).item(),
                "explained_variance": ppo.explained_variance(values[:, part], returns[:, part], m),
            }
        )
    return rows


def sign_agreement(advantages, outcomes, mask) -> tuple[float, float]:
    """The share of tokens, and of first tokens, whose advantage (B, T) has the sign of outcome - mean outcome (B,)."""
    centred = (outcomes - outcomes.mean()).unsqueeze(1)  # (B, 1)
    agrees = (torch.sign(advantages) == torch.sign(centred)).float()  # (B, T)
    return common.masked_mean(agrees, mask).item(), agrees[:, 0].mean().item()


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="a ppo.py run folder (its model/ and model/critic)")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument(
        "--seed", type=int, default=1000, help="problems and sampling (not the run's: fresh ones)"
    )
    args = parser.parse_args(argv)
    run = json.loads((args.run_dir / "args.json").read_text())
    device = torch.device("cpu")
    models.set_seed(args.seed)
    tokenizer = models.load_tokenizer(str(args.run_dir / "model"))
    policy = models.load_model(str(args.run_dir / "model"), len(tokenizer), device)
    critic = models.load_model(str(args.run_dir / "model" / "critic"), len(tokenizer), device, head="value")
    train_stream, _ = tasks.load_problems(None, args.seed, 200, args.batch_size)
    problems = [next(train_stream) for _ in range(args.batch_size)]
    prompt_ids, prompt_mask = tasks.tokenize_prompts(tokenizer, [p.prompt for p in problems], device)
    generator = torch.Generator().manual_seed(args.seed)
    with torch.no_grad():
        completion_ids, logprobs = common.sample_with_logprobs(
            policy,
            prompt_ids,
            prompt_mask,
            1,
            run["max_new_tokens"],
            tokenizer.eos_token_id,
            tokenizer.pad_token_id,
            run["temperature"],
            1.0,
            generator,
        )
        mask = common.completion_mask(completion_ids, tokenizer.eos_token_id)
        texts = tasks.decode_completions(tokenizer, completion_ids, mask)
        outcomes = torch.tensor([tasks.verify(t, p.answer) for t, p in zip(texts, problems)])
        values = ppo.token_values(critic, prompt_ids, prompt_mask, completion_ids) * mask
        rewards, _ = ppo.kl_penalized_rewards(outcomes, logprobs, logprobs, mask, 0.0)
        raw, returns = ppo.compute_gae(rewards, values, mask, run["gamma"], run["lam"])
        advantages = common.masked_whiten(raw, mask) * mask
    tokens, first = sign_agreement(advantages, outcomes, mask)
    result = {
        "run_dir": str(args.run_dir),
        "outcome": outcomes.mean().item(),
        "explained_variance": ppo.explained_variance(values, returns, mask),
        "by_position": by_position(values, returns, mask),
        "sign_agreement_tokens": tokens,
        "sign_agreement_first_token": first,
        "kl_term_left_out": run["kl_coef"],
    }
    print(
        f"{args.run_dir}: verifier {result['outcome']:.3f} on {args.batch_size} samples, explained variance "
        f"{result['explained_variance']:.3f}; β = {run['kl_coef']} (the KL term, left out)"
    )
    print("| positions | tokens | mean return | mean value | explained variance |")
    print("| --- | --- | --- | --- | --- |")
    for row in result["by_position"]:
        print(
            f"| {row['positions']} | {row['tokens']} | {row['return']:.3f} | {row['value']:.3f} | "
            f"{row['explained_variance']:.3f} |"
        )
    print(f"advantage's sign = outcome's sign: {tokens:.3f} of tokens, {first:.3f} of first tokens")
    return result


if __name__ == "__main__":
    main()
