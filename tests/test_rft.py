"""rft.py: the filter and the loss on hand-made examples, the completion-only forward, one round's effect on the kept
completions, exact resume mid-round, and the CLI."""

import json
import os
import subprocess
import sys

import pytest
import torch

import common
from infra import models
from task import tasks
from conftest import (
    REPO,
    args_of,
    assert_one_line_error,
    assert_resume_is_exact,
    metrics_of,
    run_script,
    run_script_here,
)
from fixed_completions import fixed_completions
from rft import Args, kept_logprobs, main, rft_loss, select_verified


def has_a_digit(completion: str, answer: str) -> float:
    """A 0/1 verdict the random tiny model passes about half the time: its completion holds a digit."""
    return float(any(c.isdigit() for c in completion))


@pytest.fixture(autouse=True)
def completions_that_end(monkeypatch):
    """The random tiny model rarely samples EOS within a few tokens, so nearly all it says would be cut off and
    rejected: these tests sample fixed completions that end (tests/fixed_completions.py), varied by prompt."""
    monkeypatch.setattr(common, "sample_completions", fixed_completions)


def tiny_args(tmp_path, **overrides) -> Args:
    defaults = dict(
        model="tiny",
        steps=4,
        steps_per_round=2,
        prompts_per_round=4,
        samples_per_prompt=4,
        max_per_prompt=3,
        batch_size=4,
        max_new_tokens=8,
        eval_size=8,
        output_dir=str(tmp_path / "runs"),
        lr=1e-3,
        warmup_steps=1,
    )
    return args_of(Args, **{**defaults, **overrides})


def read_kept(result: dict) -> list[dict]:
    with open(os.path.join(result["run_dir"], "kept.jsonl")) as f:
        return [json.loads(line) for line in f]


@torch.no_grad()
def mean_token_logprob(model, tokenizer, rows: list[dict]) -> float:
    """The mean log-prob of a kept token, summed by hand (not by rft_loss, which is under test)."""
    logprobs, mask = kept_logprobs(model, tokenizer, rows)
    return ((logprobs * mask).sum() / mask.sum()).item()


# ---- the filter and the loss ---------------------------------------------------------------------------------------
def test_the_filter_keeps_exactly_the_verified_finished_distinct_samples_up_to_the_cap():
    prompts = ["a"] * 7 + ["b"] * 3
    completions = ["1", "2", "2", "1", "3", "4", "5", "x", "y", "z"]
    verified = [1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.5, 1.0]
    finished = [True] * 9 + [False]
    kept = select_verified(prompts, completions, verified, finished, max_per_prompt=3)
    # a: "1" kept; "2" rejected, then "2" verified and kept; "1" again is a duplicate; "3" kept, and the cap (3)
    # stops "4" and "5". b: "x" kept; "y" half-right is not verified; "z" was cut off (no EOS).
    assert kept == [
        {"prompt": "a", "completion": "1"},
        {"prompt": "a", "completion": "2"},
        {"prompt": "a", "completion": "3"},
        {"prompt": "b", "completion": "x"},
    ]
    # the same completion under two prompts is two rows: distinct means per prompt
    assert len(select_verified(["a", "b"], ["7", "7"], [1.0, 1.0], [True, True], 1)) == 2


def test_the_loss_is_a_token_mean_over_the_batch():
    logprobs = torch.tensor([[-1.0, -2.0, -9.0], [-3.0, -9.0, -9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    # (1 + 2 + 3) / 3 = 2.0; a mean of per-sequence means would give 2.25
    assert rft_loss(logprobs, mask).item() == pytest.approx(2.0)


def test_only_completion_tokens_are_targets_whatever_the_padding(tiny_model_and_tokenizer):
    """Each kept completion's log-probs equal a forward on its row alone, unpadded; its EOS is a target, its prompt
    is not (on tiny-gpt2 too, where pad = EOS)."""
    tiny_model, tokenizer = tiny_model_and_tokenizer
    rows = [
        {"prompt": "What is 3 + 4?", "completion": "3 + 4 = 7"},
        {"prompt": "What is 12 + 45? Show it.", "completion": "57"},
    ]
    with torch.no_grad():
        logprobs, mask = kept_logprobs(tiny_model, tokenizer, rows)
        for i, row in enumerate(rows):
            p = tasks.tokenize_prompts(tokenizer, [row["prompt"]], "cpu")[0][0]
            c = tokenizer(row["completion"], add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
            assert mask[i].sum() == len(c)
            logits = tiny_model(torch.cat([p, torch.tensor(c)])[None]).logits[0, len(p) - 1 : -1]
            expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(c)[:, None]).squeeze(-1)
            torch.testing.assert_close(logprobs[i][: len(c)], expected, atol=1e-5, rtol=0)


# ---- a round, and the run ------------------------------------------------------------------------------------------
def test_a_round_raises_the_likelihood_of_what_it_kept(tmp_path):
    """One round (8 steps on its kept set): every kept row passed the verdict, came from a training prompt, and is
    more likely after the round than before."""
    result = main(
        tiny_args(tmp_path, steps=8, steps_per_round=8, prompts_per_round=6, lr=3e-3), reward_fn=has_a_digit
    )
    kept = read_kept(result)
    assert kept and all(has_a_digit(r["completion"], "") == 1.0 and r["round"] == 1 for r in kept)
    assert not {r["prompt"] for r in kept} & {p.prompt for p in tasks.heldout_problems(8)}
    rows = metrics_of(result)
    assert rows[0]["kept"] == len(kept) and rows[0]["round"] == 1 and "kept" not in rows[1]
    assert 0 < rows[0]["kept/fraction"] < 1
    tokenizer = models.load_tokenizer("tiny")
    cpu = torch.device("cpu")
    start = models.load_model("tiny", len(tokenizer), cpu, "fp32", seed=0)
    trained = models.load_model(os.path.join(result["run_dir"], "model"), len(tokenizer), cpu, "fp32", seed=0)
    before = mean_token_logprob(start, tokenizer, kept)
    after = mean_token_logprob(trained, tokenizer, kept)
    assert after > before + 0.5, (before, after)  # -4.61 -> -3.63 measured


def test_a_round_that_keeps_nothing_makes_no_update(tmp_path):
    result = main(tiny_args(tmp_path, steps=2), reward_fn=lambda completion, answer: 0.0)
    assert [row.get("skipped") for row in metrics_of(result)] == [1, 1] and read_kept(result) == []


def test_resume_mid_round_continues_exactly(tmp_path):
    """6 steps of 2-step rounds, and 3 steps then --resume: step 4 trains on round 2's kept set from the checkpoint."""
    assert_resume_is_exact(
        tmp_path, main, lambda out, **kw: tiny_args(out, eval_every=3, **kw), steps=6, reward_fn=has_a_digit
    )


def test_cli_bad_input_is_one_line_and_exit_2(tmp_path):
    proc = run_script(  # rft.py's one true command line
        "rft.py", "--model", "tiny", "--steps", "3", "--temperature", "0", "--output-dir", str(tmp_path)
    )
    assert_one_line_error(proc, "--temperature must be > 0")
    proc = run_script_here(
        "rft.py", "--model", "tiny", "--max-per-prompt", "0", "--output-dir", str(tmp_path)
    )
    assert_one_line_error(proc, "--max-per-prompt must be at least 1")


FAKE_PYTHON = """#!/usr/bin/env bash
# Records each stage's command and leaves what a finished run leaves; the table's own python runs for real.
# A script that writes --out (scripts/policy_pairs.py) gets two lines there.
value() {  # the word after the flag $1 in the rest, or nothing
  python3 -c 'import sys; f, a = sys.argv[1], sys.argv[2:]; print(a[a.index(f) + 1] if f in a else "")' "$@"
}
case "$1" in
  *.py)
    echo "$@" >> "$STAGES_LOG"
    out=$(value --output-dir "$@")
    file=$(value --out "$@")
    if [ -n "$out" ]; then
      mkdir -p "$out/run/model"
      echo '{"accuracy_before": 0.25, "accuracy_after": 0.5, "wall_time_s": 60}' > "$out/run/eval.json"
    fi
    if [ -n "$file" ]; then printf '{}\n{}\n' > "$file"; fi ;;
  *) exec "$REAL_PYTHON" "$@" ;;
esac
"""


def recorded_stages(tmp_path, script: str, *argv: str, **env: str) -> list[list[str]]:
    """Run a shell pipeline of the project's scripts with each stage recorded instead of run (FAKE_PYTHON); the
    stages' commands, in order."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(FAKE_PYTHON)
    (bin_dir / "python").chmod(0o755)
    log = tmp_path / "stages.log"
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "STAGES_LOG": str(log),
        "REAL_PYTHON": sys.executable,
        **env,
    }
    proc = subprocess.run(
        ["bash", script, *argv], cwd=REPO, capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [line.split() for line in log.read_text().splitlines()]


def test_the_r1_recipe_chains_its_four_stages_each_command_valid(tmp_path):
    """scripts/r1_recipe.sh with each stage recorded instead of run: every stage starts from the model the stage
    before it left, every command parses as its script's own Args, and the table has a row per stage."""
    import tyro

    import grpo
    import rft
    import sft

    out = tmp_path / "r1"
    commands = recorded_stages(tmp_path, "scripts/r1_recipe.sh", str(out), "--seed", "3", MODEL="tiny")
    assert [c[0] for c in commands] == ["sft.py", "grpo.py", "rft.py", "grpo.py"]
    modules = {"sft.py": sft, "grpo.py": grpo, "rft.py": rft}
    parsed = [tyro.cli(modules[c[0]].Args, args=c[1:]) for c in commands]
    assert parsed[0].model == "tiny" and all(args.seed == 3 for args in parsed)
    for before, after in zip(parsed, parsed[1:]):
        assert after.model == f"{before.run.output_dir}/run/model"
    assert parsed[2].steps == parsed[2].steps_per_round  # one round of rejection sampling
    assert (out / "stages.md").read_text().count("| 0.250 -> 0.500 |") == 4
