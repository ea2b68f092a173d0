"""grpo_tools.py and task/tools.py: the calculator by hand, a call cut at its closing token, the environment's tokens
out of the loss and its normaliser, the sampler's multi-turn log-probs against one forward over the transcript, the
reward on the model's own words, bad input and the command line."""

import math
import os
import random

import pytest
import torch

import common
import grpo
import grpo_tools
from infra import models
from infra import runs
from task import tasks, tools
from conftest import assert_one_line_error, metrics_of, run_script, run_script_here
from fixed_completions import sampler_from
from grpo_tools import Args, Transcript, cut_at_call, main, sample_with_tool, tool_stats, transcript_tensors
from test_grpo import tiny_args as grpo_tiny_args


def tiny_args(tmp_path, **overrides) -> Args:
    return grpo_tiny_args(tmp_path, args_class=Args, **{"max_new_tokens": 24, **overrides})


# ---- the calculator and the task ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "expression, value",
    [
        ("347 + 589 + 1024", "1960"),
        ("2 + 3 × 4", "14"),  # × before +
        ("3 * 4 - 2 * 5", "2"),
        ("7x6", "42"),
        ("12 - 20", "-8"),
        (" 5 ", "5"),
        ("2 ** 8", "error"),  # not an operator it reads
        ("1 +", "error"),
        ("1 + 2 apples", "error"),  # text it cannot read anywhere, not only at the start
        ("", "error"),
        ("__import__('os')", "error"),  # never evaluated
        ("1" * 13 + " + 1", "error"),  # a number too long to be the model's arithmetic
        ("١٢ + ٣", "error"),  # Arabic-Indic digits: int() reads them, the calculator does not
        (" × ".join(["999999999999"] * 400), "error"),  # a product of 4,800 digits: str() would raise
        (" × ".join(["10"] * 100), "1" + "0" * 100),  # 10^100: the largest product it computes
        (" × ".join(["10"] * 101), "error"),
    ],
)
def test_the_calculator_by_hand(expression, value):
    assert tools.calculate(expression) == value


def test_a_result_a_demonstration_and_the_problems():
    assert tools.tool_result("so <calc>1 + 2</calc>") == " <result>3</result>"
    assert (
        tools.tool_result("<calc>1 + 2</calc> and <calc>oops</calc>") == " <result>error</result>"
    )  # the last call
    problem = tools.make_tool_problem(random.Random(0))
    numbers = [int(n) for n in problem.prompt.split("?")[0].removeprefix("What is ").split(" + ")]
    assert (
        len(numbers) == 3 and all(100 <= n <= 9999 for n in numbers) and problem.answer == str(sum(numbers))
    )
    assert problem.prompt.endswith(tools.TOOL_INSTRUCTION)
    expression = " + ".join(map(str, numbers))
    answer = problem.answer
    demo = f"<calc>{expression}</calc> <result>{answer}</result> The answer is {answer}."
    assert tools.tool_demonstration(problem) == demo
    heldout = tasks.heldout_problems(16, make=tools.make_tool_problem)
    stream = tasks.train_problems(0, heldout, make=tools.make_tool_problem)
    assert not {next(stream).prompt for _ in range(200)} & {p.prompt for p in heldout}


def test_the_demonstrations_are_training_problems_sft_reads(tmp_path):
    out = tmp_path / "tools.jsonl"
    proc = run_script("scripts/tool_demonstrations.py", "--out", str(out), "--count", "50")
    assert proc.returncode == 0, proc.stderr
    rows = tasks.read_rows(str(out), ("prompt", "completion"))
    heldout = {
        p.prompt for p in tasks.heldout_problems(tasks.DEFAULT_EVAL_SIZE, make=tools.make_tool_problem)
    }
    assert len(rows) == 50 and not {r["prompt"] for r in rows} & heldout
    assert all(tools.calculate(tools.CALL.findall(r["completion"])[0]) == r["answer"] for r in rows)


def test_a_turn_is_cut_at_the_token_that_closes_the_call(tokenizer):
    tokens = tokenizer("ab<calc>1+2</calc>cd", add_special_tokens=False).input_ids  # a token a character
    assert cut_at_call(tokenizer, tokens) == len("ab<calc>1+2</calc>")
    assert cut_at_call(tokenizer, tokens[:5]) == 5  # no call: every token kept


# ---- the transcript: the environment's tokens, the sampler's log-probs ----------------------------------------------
def three_tokens_a_turn(tokenizer, tokens: list[int]) -> int:
    """A stand-in for cut_at_call: every turn a call after its third token."""
    return min(3, len(tokens))


def scripted_turns(tokenizer, turns: list[str]):
    """A sampler whose k-th call answers every row with turns[k] (then EOS if it does not end with a call)."""
    calls = iter(turns)

    def completions(model, prompt_ids, prompt_mask, num_samples, max_new_tokens, eos, pad, *a, **k):
        text = next(calls)
        ids = tokenizer(text, add_special_tokens=False).input_ids + (
            [] if text.endswith("</calc>") else [eos]
        )
        ids = (ids + [pad] * max_new_tokens)[:max_new_tokens]
        return torch.tensor([ids] * (len(prompt_ids) * num_samples))

    return sampler_from(completions)


def test_the_environments_tokens_are_context_not_policy(tmp_path, monkeypatch, tokenizer):
    # every transcript: "<calc>1+2</calc>" (model, 16 tokens), " <result>3</result>" (environment, 19), "7" and EOS
    # (model, 2): the loss sees a mask of 18 ones, and 0 on the result's 19 tokens
    monkeypatch.setattr(
        common, "sample_with_logprobs", scripted_turns(tokenizer, ["<calc>1+2</calc>", "7"] * 50)
    )
    masks = []
    original = grpo.grpo_loss
    monkeypatch.setattr(grpo, "grpo_loss", lambda *a, **k: masks.append(a[4]) or original(*a, **k))
    seen = []
    rows = metrics_of(
        main(tiny_args(tmp_path, steps=1), reward_fn=lambda text, answer: seen.append(text) or 0.5)
    )
    expected = torch.tensor([1] * 16 + [0] * 19 + [1] * 2)
    assert all(torch.equal(m, expected.repeat(len(m), 1)) for m in masks)
    # the normaliser: the model's 18 tokens a row, never the environment's
    assert rows[0]["completion_length"] == 18 and rows[0]["transcript_length"] == 37
    assert rows[0]["tool/use"] == 1.0 and rows[0]["tool/well_formed"] == 1.0
    # the reward reads the model's last turn: "7", not the environment's 3
    assert set(seen) == {"7"}


@pytest.mark.parametrize("max_calls, length, last_turn", [(0, 16, "<calc>1+2</calc>"), (1, 37, "7")])
def test_with_the_calculator_off_a_call_ends_the_transcript_unanswered(
    monkeypatch, tokenizer, prompts, max_calls, length, last_turn
):
    # the model writes "<calc>1+2</calc>" (16 tokens), then "7": at --max-calls 0 the call is the whole transcript,
    # no result follows, and the verifier reads the call; at 1 the result (19 tokens) and "7" and EOS (2) follow
    monkeypatch.setattr(
        common, "sample_with_logprobs", scripted_turns(tokenizer, ["<calc>1+2</calc>", "7"] * 2)
    )
    model = models.load_model("tiny", len(tokenizer), torch.device("cpu"), "fp32")
    transcripts = sample_with_tool(model, tokenizer, *prompts, 1, Args(max_calls=max_calls), None, 1.0)
    assert [len(t.tokens) for t in transcripts] == [length, length]
    assert [t.calls for t in transcripts] == [max_calls, max_calls]
    assert {t.last_turn for t in transcripts} == {last_turn}
    assert all(sum(t.policy) == (16 if max_calls == 0 else 18) for t in transcripts)


def test_the_samplers_turns_agree_with_one_forward_over_the_transcript(tokenizer, prompts, monkeypatch):
    # The random tiny model never writes </calc>: let every turn be a call after its third token, so that each
    # transcript has results in it. Sampled turn by turn, each from the prompt and the transcript so far, the model's
    # log-probs must be the trainer's over the whole transcript at the model's tokens (fp32 on a CPU: rounding only).
    monkeypatch.setattr(grpo_tools, "cut_at_call", three_tokens_a_turn)
    model = models.load_model("tiny", len(tokenizer), torch.device("cpu"), "fp32")
    args = Args(max_new_tokens=24, max_calls=2)
    generator = torch.Generator().manual_seed(0)
    transcripts = sample_with_tool(model, tokenizer, *prompts, 3, args, generator, 1.0)
    assert sum(t.calls for t in transcripts) >= 6 and all(sum(t.policy) <= 24 for t in transcripts)
    ids, policy_mask, sampler = transcript_tensors(transcripts, tokenizer.pad_token_id, "cpu")
    trainer, _ = common.completion_logprobs(model, *prompts, ids, torch.tensor([3, 3]), 1.0)
    assert (policy_mask == 0).any()  # results are in the transcripts
    torch.testing.assert_close(trainer * policy_mask, sampler, atol=1e-4, rtol=0)


def test_the_loop_trains_on_the_model_tokens_across_turns(tmp_path, monkeypatch):
    monkeypatch.setattr(grpo_tools, "cut_at_call", three_tokens_a_turn)
    rows = metrics_of(main(tiny_args(tmp_path, steps=2), reward_fn=lambda text, answer: float(len(text) % 2)))
    assert all(row["tool/use"] > 0 and row["mismatch/max_log_ratio"] < 1e-4 for row in rows)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(max_calls=-1), "--max-calls must be 0"),
        (dict(dataset="tests/data/pairs.jsonl"), "the tool task has its own problems"),
        (dict(rewards=("correct", "format")), "the tool task has its own problems"),
        (dict(group_size=1), "--group-size must be at least 2"),  # grpo.py's checks too
    ],
)
def test_bad_arguments_are_one_clear_error(tmp_path, overrides, message):
    with pytest.raises(runs.InputError, match=message):
        main(tiny_args(tmp_path, **overrides))
    assert not os.listdir(tmp_path)


def test_cli_tiny_run_and_help(tmp_path):
    proc = run_script(
        "grpo_tools.py", "--model", "tiny", "--steps", "2", "--eval-size", "4", "--output-dir", str(tmp_path)
    )
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = os.listdir(tmp_path)
    assert run_dir.startswith("grpo-tools-tiny-0-") and "with the tool" in proc.stdout
    assert "--max-calls" in run_script_here("grpo_tools.py", "--help").stdout
    assert_one_line_error(
        run_script_here("grpo_tools.py", "--model", "tiny", "--max-calls", "-1"), "--max-calls"
    )


def test_transcript_tensors_and_tool_stats_by_hand():
    # two transcripts: the first called the tool twice (one call unreadable), its result tokens 8, 9 are the
    # environment's; the second wrote one token and no call
    first = Transcript(
        tokens=[5, 6, 8, 9, 7],
        policy=[1, 1, 0, 0, 1],
        logprobs=[-1.0, -2.0, 0.0, 0.0, -3.0],
        calls=2,
        errors=1,
    )
    second = Transcript(tokens=[4], policy=[1], logprobs=[-0.5])
    ids, policy_mask, logprobs = transcript_tensors([first, second], 0, "cpu")
    assert ids.tolist() == [[5, 6, 8, 9, 7], [4, 0, 0, 0, 0]]
    assert policy_mask.tolist() == [[1, 1, 0, 0, 1], [1, 0, 0, 0, 0]]  # padding is nobody's
    assert logprobs.tolist() == [[-1.0, -2.0, 0.0, 0.0, -3.0], [-0.5, 0.0, 0.0, 0.0, 0.0]]
    assert tool_stats([first, second]) == {"tool/use": 0.5, "tool/calls": 1.0, "tool/well_formed": 0.5}
    assert math.isnan(tool_stats([second])["tool/well_formed"])  # no call: no share to report
