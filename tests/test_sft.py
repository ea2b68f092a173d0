"""sft.py: the loss on hand-computed numbers, the completion-only forward, learning, the run, the pipeline and the
CLI."""

import json
import os

import pytest
import torch

from infra import models
from infra import runs
from task import tasks
from conftest import (
    PAIRS,
    RUN_FILES,
    args_of,
    assert_checkpointing_changes_nothing,
    assert_one_line_error,
    assert_resume_is_exact,
    metrics_of,
    run_script,
    run_script_here,
    write,
)
from sft import Args, batch_logprobs, completion_logprobs_and_hits, load_demonstrations, main, sft_loss


def tiny_args(tmp_path, **overrides) -> Args:
    defaults = dict(
        model="tiny",
        steps=2,
        batch_size=4,
        num_demonstrations=40,
        max_new_tokens=8,
        eval_size=8,
        output_dir=str(tmp_path / "runs"),
        lr=1e-3,
        warmup_steps=1,
    )
    return args_of(Args, **{**defaults, **overrides})


# ---- the loss ------------------------------------------------------------------------------------------------------
def test_sft_loss_is_a_token_mean_over_the_batch():
    logprobs = torch.tensor([[-1.0, -2.0, -9.0], [-3.0, -9.0, -9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    # three completion tokens: (1 + 2 + 3) / 3 = 2.0. A mean of per-sequence means would give (1.5 + 3) / 2 = 2.25;
    # counting the padding (-9) would give more still.
    assert sft_loss(logprobs, mask).item() == pytest.approx(2.0)


def test_only_completion_tokens_are_targets_whatever_the_padding(tiny_model_and_tokenizer):
    """Each completion token's log-prob equals a forward on that row alone, unpadded; prompt tokens are never scored.
    On tiny-gpt2 too, where pad = EOS: the EOS that ends a completion is a target there as well."""
    tiny_model, tokenizer = tiny_model_and_tokenizer
    completions = ["3 + 4 = 7", "57"]
    prompt_ids, prompt_mask = tasks.tokenize_prompts(
        tokenizer, ["What is 3 + 4?", "What is 12 + 45? Show it."], "cpu"
    )
    completion_ids, mask = tasks.tokenize_completions(tokenizer, completions, "cpu")
    with torch.no_grad():
        logprobs, hits = completion_logprobs_and_hits(tiny_model, prompt_ids, prompt_mask, completion_ids)
        for i in range(2):
            p = prompt_ids[i][prompt_mask[i].bool()]
            c = completion_ids[i][mask[i].bool()]  # EOS included
            # the positions that predict c
            logits = tiny_model(torch.cat([p, c])[None]).logits[0, len(p) - 1 : -1]
            expected = torch.log_softmax(logits, -1).gather(-1, c[:, None]).squeeze(-1)
            torch.testing.assert_close(logprobs[i][: len(c)], expected, atol=1e-5, rtol=0)
            assert hits[i][: len(c)].tolist() == (logits.argmax(-1) == c).tolist()
    _, _, mask, _ = batch_logprobs(
        tiny_model, tokenizer, [{"prompt": "What is 12 + 45?", "completion": "57"}], 256
    )
    assert mask.sum() == len(tokenizer("57", add_special_tokens=False).input_ids) + 1  # the EOS is a target


def test_default_demonstrations_never_touch_the_heldout_problems():
    train, heldout = load_demonstrations(None, 500, seed=0, eval_size=200)
    assert len(train) + len(heldout) == 500 and len(heldout) == 50
    held_prompts = {p.prompt for p in tasks.heldout_problems()}
    assert not held_prompts & {r["prompt"] for r in train + heldout}
    row = train[0]
    a, b = row["prompt"].removeprefix("What is ").removesuffix("?").split(" + ")
    assert (
        row["completion"] == f"{a} + {b} = {int(a) + int(b)}"
        and tasks.verify(row["completion"], str(int(a) + int(b))) == 1.0
    )


# ---- learning and the run -------------------------------------------------------------------------------------------
def test_a_tiny_model_learns_a_fixed_mapping(tmp_path):
    colours = {"red": "apple", "yellow": "banana", "green": "pear", "purple": "plum"}
    data = write(
        tmp_path,
        "demos.jsonl",
        "".join(
            json.dumps({"prompt": k, "completion": v}) + "\n" for k, v in colours.items() for _ in range(10)
        ),
    )
    result = main(tiny_args(tmp_path, dataset=data, steps=40, batch_size=8, lr=3e-3, save_model=False))
    rows = metrics_of(result)
    assert (
        result["evals"][0]["eval/mean_token_accuracy"] < 0.3
        and result["evals"][-1]["eval/mean_token_accuracy"] == 1.0
    )
    assert (
        result["eval_loss_after"] < 0.1 * result["eval_loss_before"]
        and rows[-1]["loss"] < 0.1 * rows[0]["loss"]
    )
    # num_tokens is cumulative (TRL): each step adds the prompt + completion tokens it trained on
    assert [b["num_tokens"] - a["num_tokens"] for a, b in zip(rows, rows[1:])] == pytest.approx(
        [b["tokens_per_second"] * b["time/step"] for b in rows[1:]], rel=1e-3
    )


def test_a_run_leaves_its_files_and_a_checkpoint_grpo_can_start_from(tmp_path):
    import grpo

    result = main(tiny_args(tmp_path))
    assert sorted(os.listdir(result["run_dir"])) == RUN_FILES
    assert set(metrics_of(result)[0]) >= {
        "loss",
        "mean_token_accuracy",
        "num_tokens",
        "grad_norm",
        "lr",
        "time/step",
        "memory/peak_gb",
    }
    rl = grpo.main(
        args_of(
            grpo.Args,
            model=os.path.join(result["run_dir"], "model"),
            steps=1,
            prompts_per_step=2,
            group_size=2,
            max_new_tokens=4,
            eval_size=4,
            output_dir=str(tmp_path / "rl"),
            save_model=False,
        )
    )
    assert rl["steps"] == 1


def test_resume_continues_exactly(tmp_path):
    assert_resume_is_exact(tmp_path, main, lambda out, **kw: tiny_args(out, eval_every=2, **kw))


def test_the_plain_prompt_pipeline_runs_on_tiny_gpt2(tmp_path):
    """tiny-gpt2 (no chat template, pad = eos, absolute positions): sft.py -> reward_model.py -> ppo.py, each from
    the last."""
    sft = run_script(
        "sft.py",
        "--model",
        "tiny-gpt2",
        "--steps",
        "2",
        "--num-demonstrations",
        "20",
        "--eval-size",
        "4",
        "--output-dir",
        str(tmp_path / "sft"),
    )
    assert sft.returncode == 0, sft.stderr
    sft_model = str(next((tmp_path / "sft").iterdir()) / "model")
    assert (
        json.loads(open(os.path.join(sft_model, "tokenizer_config.json")).read()).get("chat_template") is None
    )
    rm = run_script_here(
        "reward_model.py",
        "--model",
        sft_model,
        "--dataset",
        PAIRS,
        "--steps",
        "2",
        "--batch-size",
        "4",
        "--output-dir",
        str(tmp_path / "rm"),
    )
    assert rm.returncode == 0, rm.stderr
    rm_model = str(next((tmp_path / "rm").iterdir()) / "model")
    # named after the run it starts from
    assert os.path.basename(os.path.dirname(rm_model)).startswith("rm-sft-tiny-gpt2-0-")
    ppo = run_script_here(
        "ppo.py",
        "--model",
        sft_model,
        "--reward-model",
        rm_model,
        "--steps",
        "1",
        "--batch-size",
        "2",
        "--minibatch-size",
        "2",
        "--max-new-tokens",
        "4",
        "--eval-size",
        "4",
        "--no-save-model",
        "--output-dir",
        str(tmp_path / "ppo"),
    )
    assert ppo.returncode == 0, ppo.stderr
    assert "held-out accuracy" in ppo.stdout


def test_prompt_format_plain_drops_the_template_and_chat_requires_one():
    plain = models.load_tokenizer("tiny", "plain")
    assert tasks.format_prompt(plain, "What is 1 + 2?") == "Question: What is 1 + 2?\nAnswer:"
    assert tasks.format_prompt(models.load_tokenizer("tiny"), "What is 1 + 2?").startswith(
        "<|im_start|>user\n"
    )
    with pytest.raises(runs.InputError, match="has no chat template"):
        models.load_tokenizer("tiny-gpt2", "chat")


def test_cli_bad_input_is_one_line_and_exit_2(tmp_path):
    bad = write(tmp_path, "bad.jsonl", json.dumps({"prompt": "What is 1 + 1?", "answer": "2"}) + "\n")
    proc = run_script_here("sft.py", "--model", "tiny", "--dataset", bad, "--output-dir", str(tmp_path))
    assert_one_line_error(proc, "field 'completion' missing")
    assert os.listdir(tmp_path) == ["bad.jsonl"]  # no half-made run folder


def test_gradient_checkpointing_changes_nothing(tmp_path, monkeypatch):
    assert_checkpointing_changes_nothing(
        tmp_path, monkeypatch, main, lambda out, **kw: tiny_args(out, save_model=False, **kw)
    )
