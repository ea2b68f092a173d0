"""task/tasks.py: the verifier, the problems, prompt formatting, data files and preference data."""

import dataclasses
import json
from types import SimpleNamespace
from typing import Optional

import pytest
import torch

import common
import grpo_options
from infra import models
from infra import runs
from task import preferences, rewards, tasks


# ---- the task -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "completion, reward",
    [
        ("85", 1.0),
        ("The answer is 85.", 1.0),
        ("47 + 38 = 85", 1.0),  # restated question: the final number counts
        ("What is 47 + 38? 85", 1.0),
        ("47 + 38 = 80 + 5 = 85", 1.0),  # '=' chain
        ("85 is the sum of 47 and 38", 0.0),  # the final number is 38
        ("The answer is 85, I am sure.", 1.0),  # trailing text after the number
        ("The answer is 85.0", 1.0),
        ("I don't know", 0.0),  # no number
        ("", 0.0),
        ("The answer is 86.", 0.0),
        ("-85", 0.0),
        ("The total is 1,085.", 0.0),  # comma is a thousands separator: 1085, not 85
        ("8 5", 0.0),
    ],
)
def test_verifier_table(completion, reward):
    assert tasks.verify(completion, "85") == reward


def test_verifier_reads_the_answer_the_same_way():
    assert (
        tasks.verify("so 1234", "1,234") == 1.0
        and tasks.verify("-3", "-3.0") == 1.0
        and tasks.verify("7", "seven") == 0.0
    )


@pytest.mark.parametrize(
    "completion, last_number, strict",
    [
        ("0 + 24 = 24", 1.0, 1.0),
        ("The sum of 0 and 24.", 1.0, 0.0),  # restates an operand: the last-number verifier pays for it
        ("The sum of 0 and 24 is 24.", 1.0, 1.0),
        ("24", 1.0, 0.0),  # strict: a bare number is not a stated result
        ("The answer is **24**.", 1.0, 1.0),
        ("Answer: 24", 1.0, 1.0),
        ("It is 0 + 24 = 24, done.", 1.0, 1.0),  # the last stated number counts, not 'is 0'
        ("0 + 24 = 25, not 24", 1.0, 0.0),  # the stated result is 25
        ("24 is the sum of 0 and 24", 1.0, 0.0),
        ("0 plus 24 equals 24.0", 1.0, 1.0),
        ("0 + 24 = 42", 0.0, 0.0),
        # common ways of stating the result: a colon, a currency sign, a contraction, 'equal to'
        ("The answer is: 24", 1.0, 1.0),
        ("The total is $24.", 1.0, 1.0),
        ("It's 24", 1.0, 1.0),
        ("That\u2019s 24.", 1.0, 1.0),  # curly apostrophe
        ("0 + 24 is equal to 24", 1.0, 1.0),
        ("**Answer:** $24", 1.0, 1.0),
        ("The total is $25.", 0.0, 0.0),
        # a restated question is still no stated result: the marker is followed by an operand, or by none
        ("0 + 24", 1.0, 0.0),
        ("What is 0 + 24?", 1.0, 0.0),  # 'is 0' is the stated number
        ("It's 0 + 24", 1.0, 0.0),
        ("The answer is: 0 + 24", 1.0, 0.0),
        ("the sum of 0 and 24", 1.0, 0.0),
        ("It's the sum of 0 and 24.", 1.0, 0.0),
    ],
)
def test_strict_verifier_pays_only_a_stated_result(completion, last_number, strict):
    assert tasks.verify(completion, "24") == last_number
    assert tasks.verify_strict(completion, "24") == strict


@pytest.mark.parametrize(
    "completion, last_number, strict",
    [
        # well formed and right: stated by the tag
        ("<think>14 + 10 = 24</think><answer>24</answer>", 1.0, 1.0),
        # the tag says 23; the reasoning is not read
        ("<think>14 + 10 = 24</think><answer>23</answer>", 0.0, 0.0),
        ("<think>14 + 10 = 23</think><answer>24</answer>", 1.0, 1.0),
        ("<answer>**24**.</answer>", 1.0, 1.0),  # one number alone, in bold, before a full stop
        ("<think>so</think><answer>The sum is 24</answer>", 1.0, 1.0),
        ("<think>so</think><answer>14 + 10</answer>", 0.0, 0.0),  # a restated question, even inside the tag
        # its last number is 24, but nothing is stated
        ("<think>so</think><answer>0 + 24</answer>", 1.0, 0.0),
        ("<answer>23</answer> or rather <answer>24</answer>", 1.0, 1.0),  # the last tag counts
        ("<answer>24</answer> so it is 23", 1.0, 1.0),  # only the tag is read
        ("<think>14 + 10 = 24</think>", 1.0, 1.0),  # no answer tag: as without tags
        ("<think>14 + 10 = 24</think><answer>24", 1.0, 1.0),  # an unclosed tag is no tag
    ],
)
def test_verifiers_read_the_answer_tag_when_there_is_one(completion, last_number, strict):
    assert tasks.verify(completion, "24") == last_number
    assert tasks.verify_strict(completion, "24") == strict


@pytest.mark.parametrize(
    "completion, penalty",
    [
        # words 14 + 95 = 14 + 95 = 14 + 96: 3-grams (14 + 95) (+ 95 =) (95 = 14) (= 14 +), the same four again,
        # (14 + 96): 4 of 9 repeat an earlier one
        ("14 + 95 = 14 + 95 = 14 + 96", -4 / 9),
        ("47 + 38 = 85", 0.0),  # 3 distinct 3-grams
        ("85", 0.0),  # fewer than 3 words: no 3-gram
        ("a b c a b c a b c", -4 / 7),  # 7 3-grams, the 3 distinct ones first: the other 4 repeat
        ("a b c d a b", 0.0),  # (a b) returns, but no 3 words in a row
    ],
)
def test_repetition_penalty_by_hand(completion, penalty):
    assert rewards.repetition_penalty(completion, "85") == pytest.approx(penalty)
    # as grpo.py --rewards correct repetition scores it: one column each
    scored = tasks.score_completions([completion], ["85"], ("correct", "repetition"), tasks.verify, "cpu")
    assert scored.rewards[0, 1].item() == pytest.approx(penalty)


@pytest.mark.parametrize(
    "completion, reward",
    [
        ("<think>3 + 5 = 8</think><answer>8</answer>", 1.0),
        ("<think>\n3 < 5, so 3 + 5 = 8\n</think>\n<answer>\n8\n</answer>\n", 1.0),  # whitespace, a '<' inside
        ("<think>3 + 5 = 8</think> 8", 0.0),  # no answer tags
        ("3 + 5 = 8 <answer>8</answer>", 0.0),  # no think tags
        ("<think>3 + 5 = 8</think><answer>8</answer> so the answer is 8", 0.0),  # answer outside the tags
        ("The sum: <think>3 + 5</think><answer>8</answer>", 0.0),  # text before the tags
        ("<answer>8</answer><think>3 + 5 = 8</think>", 0.0),  # the wrong order
        ("<think>3 + 5 = 8</think><answer></answer>", 0.0),  # an empty answer
        ("<think> </think><answer> </answer>", 0.0),  # only spaces inside the tags
        ("<think>3 + 5 = 8</think><answer>\n</answer>", 0.0),  # an answer of whitespace
        ("<think>\t</think><answer>8</answer>", 0.0),  # reasoning of whitespace
        ("<think>3 + 5</think><answer>8</answer><answer>9</answer>", 0.0),  # two answers
        ("<think>3 + 5 <think>= 8</think><answer>8</answer>", 0.0),  # a tag inside
        # the form only: a wrong answer in it is the verifier's
        ("<think>3 + 5 = 9</think><answer>9</answer>", 1.0),
    ],
)
def test_format_reward_table(completion, reward):
    assert rewards.format_reward(completion, "8") == reward


@pytest.mark.parametrize(
    "completion, reward",
    [
        ("14 + 95 = 109.", 1.0),  # 5 words
        ("The sum of 14 and 95 is 109.", 1.0),  # 8 words: the limit pays
        ("The sum of 14 and 95 is 109 exactly.", 0.0),  # 9 words
        ("  109\n", 1.0),  # one word, whitespace around it
        ("", 0.0),  # saying nothing is not a short answer
        (" \n ", 0.0),
    ],
)
def test_concise_reward_pays_one_to_eight_words(completion, reward):
    assert rewards.concise_reward(completion, "109") == reward


def test_summed_correct_and_concise_tie_right_but_long_with_wrong_but_short_and_gdpo_splits_them():
    """One group of G = 4 scored as grpo.py --rewards correct concise does: right and short (1, 1), right and long
    (1, 0), wrong and short twice (0, 1). Summed at weights 1 and 1 the two middle completions both score 1: one
    advantage for two different behaviours. GDPO normalises each term in the group first:
    correct (1, 1, 0, 0): mean 0.5, std 0.5 -> ±0.5 / 0.5001 = ±0.999800
    concise (1, 0, 1, 1): mean 0.75, std √(0.75 · 0.25) = 0.433013 -> 0.25 / 0.433113 = 0.577217, -0.75 / 0.433113 =
    -1.731651; so right-but-long sums to 0.999800 - 1.731651 = -0.731851 and wrong-but-short to -0.999800 +
    0.577217 = -0.422583: missing the term most of the group meets costs more than missing the rarer one."""
    texts = [
        "14 + 95 = 109.",
        "Adding the ones and then the tens of 14 and 95 gives 109.",
        "14 + 95 = 108.",
        "It is 119.",
    ]
    scored = tasks.score_completions(texts, ["109"] * 4, ("correct", "concise"), tasks.verify, "cpu")
    assert scored.rewards.tolist() == [[1.0, 1.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0]]
    weights = torch.tensor([1.0, 1.0])
    assert (scored.rewards @ weights).tolist() == [2.0, 1.0, 1.0, 1.0]
    gdpo = grpo_options.normalised_sum(scored.rewards, weights, 4)
    assert gdpo.tolist() == pytest.approx([1.577017, -0.731851, -0.422583, -0.422583], abs=1e-5)


def test_r1_prompt_style_asks_every_question_for_the_format_held_out_too():
    stream, heldout = tasks.load_problems(None, 0, 4, 2)
    assert tasks.with_prompt_style("question", stream, heldout) == (stream, heldout)
    r1_stream, r1_heldout = tasks.with_prompt_style("r1", *tasks.load_problems(None, 0, 4, 2))
    first = next(stream)
    assert next(r1_stream) == tasks.Problem(first.prompt + tasks.R1_INSTRUCTION, first.answer)
    assert r1_heldout == [tasks.Problem(p.prompt + tasks.R1_INSTRUCTION, p.answer) for p in heldout]
    assert tasks.R1_INSTRUCTION.endswith(
        "i.e., <think> reasoning process here </think><answer> answer here </answer>."
    )
    # a completion in the asked-for form earns the format reward, and the verifier reads the number in <answer>
    done = "<think>1 + 2 = 3</think><answer>3</answer>"
    assert rewards.format_reward(done, "3") == 1.0 and tasks.verify(done, "3") == 1.0


@pytest.mark.parametrize(
    "n, c, k, expected",
    [
        (8, 0, 8, 0.0),
        (8, 1, 8, 1.0),  # n = k: pass@k is 1 if any sample is correct
        (5, 1, 1, 0.2),  # pass@1 = c / n
        (10, 2, 3, 1 - 56 / 120),  # 1 − C(8,3)/C(10,3) = 1 − 56/120 = 0.533333
        (10, 8, 3, 1.0),  # n − c < k: every draw of k contains a correct one
    ],
)
def test_pass_at_k_is_chens_unbiased_estimator(n, c, k, expected):
    assert tasks.pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_refuses_fewer_samples_than_k():
    with pytest.raises(ValueError, match="pass@8 needs at least 8 samples"):
        tasks.pass_at_k(4, 0, 8)


def test_evaluate_pass_at_k_groups_each_problems_k_samples(tiny_model, tokenizer, monkeypatch):
    # a reward the random tiny model sometimes earns, tied to the problem: Σ ord(completion) ≡ answer (mod 5).
    # Checked against a plain recount of the same samples (same seed, temperature 1), the k samples of
    # problem i being rows i·k .. i·k + k − 1 of its batch.
    reward = lambda text, answer: float(sum(map(ord, text)) % 5 == int(answer) % 5)  # noqa: E731
    monkeypatch.setattr(tasks, "verify", reward)
    problems, k = tasks.heldout_problems(12), 4
    got = tasks.evaluate_pass_at_k(tiny_model, tokenizer, problems, k, 6, seed=3, prompts_per_batch=4)
    generator, texts = torch.Generator().manual_seed(3), []
    for start in range(0, 12, 4):
        ids, mask = tasks.tokenize_prompts(tokenizer, [p.prompt for p in problems[start : start + 4]], "cpu")
        completion_ids = common.sample_completions(
            tiny_model, ids, mask, k, 6, tokenizer.eos_token_id, tokenizer.pad_token_id, 1.0, 1.0, generator
        )
        texts += tasks.decode_completions(
            tokenizer, completion_ids, common.completion_mask(completion_ids, tokenizer.eos_token_id)
        )
    solved = [any(reward(t, p.answer) for t in texts[k * i : k * i + k]) for i, p in enumerate(problems)]
    assert got == pytest.approx(sum(solved) / 12) and 0 < got < 1


def test_evaluate_accuracy_counts_unearned_rewards(tiny_model, tokenizer, monkeypatch):
    texts = ["The sum of 0 and 24.", "0 + 24 = 24", "25"]
    monkeypatch.setattr(tasks, "decode_completions", lambda tok, ids, mask: texts[: len(ids)])
    result = tasks.evaluate_accuracy(tiny_model, tokenizer, [tasks.Problem("What is 0 + 24?", "24")] * 3, 4)
    assert result["accuracy"] == pytest.approx(2 / 3) and result["unearned"] == pytest.approx(1 / 3)


def test_evaluate_policy_times_pass_at_k_alone(tiny_model, tokenizer, monkeypatch):
    # a clock moved only by the two stand-in evaluations: greedy 3 s, pass@k 7 s. Run's expected duration counts
    # the pass@k seconds in the last evaluation only, so they must not include the greedy pass.
    clock = SimpleNamespace(now=100.0)

    def taking(seconds, result):
        def evaluation(*args, **kwargs):
            clock.now += seconds
            return result()

        return evaluation

    monkeypatch.setattr(tasks, "time", SimpleNamespace(perf_counter=lambda: clock.now))
    monkeypatch.setattr(tasks, "evaluate_accuracy", taking(3.0, lambda: {"accuracy": 0.25}))
    monkeypatch.setattr(tasks, "evaluate_pass_at_k", taking(7.0, lambda: 0.5))
    problems = tasks.heldout_problems(4)
    monkeypatch.setattr(tasks, "general_text_nll", lambda model, tokenizer: 3.5)
    assert tasks.evaluate_policy(tiny_model, tokenizer, problems, 4, seed=0, step=0, pass_k=2) == {
        "accuracy": 0.25,
        "pass@2": 0.5,
        "pass_k_seconds": 7.0,
        "general_nll": 3.5,
    }
    assert "pass_k_seconds" not in tasks.evaluate_policy(tiny_model, tokenizer, problems, 4, seed=0, step=0)


def test_general_text_nll_is_the_mean_over_every_token_of_every_paragraph(tiny_model, tokenizer):
    # transformers' own shifted loss, paragraph by paragraph, weighted by the tokens each predicts
    paragraphs = tasks.GENERAL_TEXT.read_text().split("\n\n")
    assert len(paragraphs) == 10
    total, count = 0.0, 0
    with torch.no_grad():
        for paragraph in paragraphs:
            ids = torch.tensor([tokenizer(paragraph.strip(), add_special_tokens=False).input_ids])
            total += tiny_model(ids, labels=ids).loss.item() * (ids.shape[1] - 1)
            count += ids.shape[1] - 1
    assert tasks.general_text_nll(tiny_model, tokenizer) == pytest.approx(total / count, rel=1e-5)


def test_without_the_general_text_evaluation_says_so_once_and_leaves_its_nll_out(
    tiny_model, tokenizer, monkeypatch, tmp_path, capsys
):
    # an algorithm file copied alone, without data/
    @dataclasses.dataclass
    class Args:
        model: str = "tiny"
        eval_size: Optional[int] = None
        pass_k: Optional[int] = None

    monkeypatch.setattr(tasks, "GENERAL_TEXT", tmp_path / "data" / "general.txt")
    monkeypatch.setattr(tasks, "evaluate_accuracy", lambda *args, **kwargs: {"accuracy": 0.25})
    tasks.evaluation_for_model(Args())
    before = tasks.evaluate_policy(tiny_model, tokenizer, tasks.heldout_problems(4), 4, seed=0, step=0)
    after = tasks.evaluate_policy(tiny_model, tokenizer, tasks.heldout_problems(4), 4, seed=0, step=2)
    assert before == after == {"accuracy": 0.25}
    assert tasks.before_and_after(before, after) == {"accuracy_before": 0.25, "accuracy_after": 0.25}
    out = capsys.readouterr().out
    assert (
        out.count("data/general.txt not found: skipping the general-text NLL (the forgetting measure)") == 1
    )
    assert "general text NLL" not in out


def test_before_and_after_pairs_the_comparable_numbers():
    before = {
        "accuracy": 0.25,
        "unearned": 0.0,
        "pass@8": 0.5,
        "samples": [],
        "score": 1.0,
        "general_nll": 3.0,
    }
    after = {
        "accuracy": 0.75,
        "unearned": 0.1,
        "pass@8": 0.625,
        "samples": [],
        "score": 2.0,
        "general_nll": 3.5,
    }
    assert tasks.before_and_after(before, after) == {
        "accuracy_before": 0.25,
        "accuracy_after": 0.75,
        "unearned_before": 0.0,
        "unearned_after": 0.1,
        "general_nll_before": 3.0,
        "general_nll_after": 3.5,
        "pass@8_before": 0.5,
        "pass@8_after": 0.625,
    }


@pytest.mark.parametrize(
    "text, number",
    [
        ("12 - 20 = -8", -8.0),
        ("5-3=2", 2.0),
        ("5-3", 3.0),
        ("1,234", 1234.0),
        ("pi is 3.14.", 3.14),
        ("x", None),
        ("1e5", 5.0),
    ],
)
def test_extract_final_number(text, number):
    assert tasks.extract_final_number(text) == number


def test_heldout_set_is_fixed_distinct_and_never_trained_on():
    heldout = tasks.heldout_problems(200)
    assert heldout == tasks.heldout_problems(200) and len({p.prompt for p in heldout}) == 200
    stream = tasks.train_problems(seed=3, exclude=heldout)
    train = [next(stream) for _ in range(3000)]
    assert not {p.prompt for p in train} & {p.prompt for p in heldout}
    assert all(int(p.answer) == sum(int(x) for x in p.prompt[8:-1].split(" + ")) for p in train[:50])


def test_multistep_chains_have_their_own_heldout_set_and_worked_answers():
    train, heldout = tasks.multistep_problems(seed=3, num_train=2000, eval_size=32)
    # fixed whatever the seed
    assert heldout == tasks.multistep_problems(seed=5, num_train=1, eval_size=32)[1]
    assert len({p.prompt for p in heldout}) == 32
    default = {p.prompt for p in tasks.heldout_problems(200, make=tasks.make_multistep_problem)}
    # nor the default 200
    assert len({p.prompt for p in train}) == 2000 and not {p.prompt for p in train} & default
    assert {len(p.prompt.split()) for p in train} == {5, 7, 9}  # "What is" and 2, 3 or 4 operands
    # 23 + 45 = 68, 68 - 17 = 51: one step a line, the verifier reads the final number
    worked = tasks.worked_demonstration(tasks.Problem("What is 23 + 45 - 17?", "51"))
    assert worked == "23 + 45 = 68\n68 - 17 = 51" and tasks.verify(worked, "51") == 1.0
    for p in train[:50]:
        assert tasks.verify(tasks.worked_demonstration(p), p.answer) == 1.0 and int(p.answer) >= 0
    with pytest.raises(tasks.InputError, match="not a chain"):
        tasks.worked_demonstration(tasks.Problem("What is 2 * 3?", "6"))


def test_prompt_format_with_and_without_chat_template(tokenizer):
    assert tasks.format_prompt(tokenizer, "What is 1 + 2?") == (
        "<|im_start|>user\nWhat is 1 + 2?<|im_end|>\n<|im_start|>assistant\n"
    )
    plain = models.make_tiny_tokenizer()
    plain.chat_template = None
    assert tasks.format_prompt(plain, "What is 1 + 2?") == "Question: What is 1 + 2?\nAnswer:"


# ---- data files and checkpoints -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "lines, message",
    [
        (['{"prompt": "a", "answer": "1"}', "{not json"], "data.jsonl:2: not valid JSON"),
        (['{"prompt": "a", "answer": "1"}', "", '{"prompt": "b"}'], "data.jsonl:3: field 'answer' missing"),
        (['["prompt", "answer"]'], "data.jsonl:1: expected a JSON object"),
        ([""], "data.jsonl: the dataset is empty"),
    ],
)
def test_read_jsonl_reports_file_and_line(tmp_path, lines, message):
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(runs.InputError, match=message):
        tasks.read_rows(str(path), ("prompt", "answer"))


def test_read_jsonl_reads_valid_rows(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps({"prompt": "a", "answer": "1", "extra": 3}) + "\n")
    assert tasks.read_rows(str(path), ("prompt", "answer")) == [{"prompt": "a", "answer": "1", "extra": 3}]


def test_a_byte_that_is_not_utf8_is_named_by_its_line_in_a_long_file(tmp_path):
    """400 rows of 33 bytes, a BOM and Windows line ends before it: past a text-mode read's first 8 KiB chunk, whose
    error counts bytes from the chunk's start (line 136 here, not 401)."""
    path = tmp_path / "data.jsonl"
    row = b'{"prompt": "a", "answer": "1"}\r\n'
    path.write_bytes(b"\xef\xbb\xbf" + row * 400 + b'{"prompt": "caf\xe9", "answer": "2"}\r\n')
    with pytest.raises(runs.InputError, match=r"data.jsonl:401: not UTF-8 text \(byte 0xe9\)"):
        tasks.read_rows(str(path), ("prompt", "answer"))
    path.write_bytes(b"\xef\xbb\xbf" + row * 400)  # the same file read: BOM dropped, \r\n a line end
    assert tasks.read_rows(str(path), ("prompt", "answer")) == [{"prompt": "a", "answer": "1"}] * 400


# ---- preference data ----------------------------------------------------------------------------------------------
def test_pair_samples_pairs_each_correct_with_an_incorrect_once():
    samples = [
        {"prompt": "p", "answer": "7", "completion": "7", "label": 1},
        {"prompt": "p", "answer": "7", "completion": "8 and more", "label": 0, "finished": False},
        {"prompt": "p", "answer": "7", "completion": "6", "label": 0},
        {"prompt": "p", "answer": "7", "completion": "= 7", "label": 1},
        {"prompt": "p", "answer": "7", "completion": "   ", "label": 0},  # empty: skipped
        {"prompt": "q", "answer": "1", "completion": "1", "label": 1},  # all correct: no pair
    ]
    assert preferences.pair_samples(samples) == [
        {
            "prompt": "p",
            "chosen": "7",
            "rejected": "8 and more",
            "answer": "7",
            "chosen_finished": True,
            "rejected_finished": False,
        },
        {
            "prompt": "p",
            "chosen": "= 7",
            "rejected": "6",
            "answer": "7",
            "chosen_finished": True,
            "rejected_finished": True,
        },
    ]


def test_preference_data_is_built_once_and_holds_out_whole_prompts(
    tokenizer, preference_cache, digits_are_correct, monkeypatch
):
    data, folder = preferences.preference_data(
        "tiny", tokenizer, 0, 32, 4, 8, 1.0, torch.device("cpu"), "fp32"
    )
    assert len(data["heldout_samples"]) == 4 * 4  # an eighth of the 32 prompts, 4 samples each
    assert {p["prompt"] for p in data["train"]}.isdisjoint({p["prompt"] for p in data["heldout"]})
    assert {p["prompt"] for p in data["train"]}.isdisjoint({p.prompt for p in tasks.heldout_problems()})
    assert all(
        any(ch.isdigit() for ch in p["chosen"]) and not any(ch.isdigit() for ch in p["rejected"])
        for p in data["train"]
    )
    monkeypatch.setattr(preferences, "label_samples", None)  # the second call must not sample again
    again, same_folder = preferences.preference_data(
        "tiny", tokenizer, 0, 32, 4, 8, 1.0, torch.device("cpu"), "fp32"
    )
    assert again == data and same_folder == folder
    # v2: samples record `finished`
    assert folder.name == "v2-tiny-seed0-prompts32-samples4-tokens8-temp1-fp32"
    assert tasks.read_jsonl(str(folder / "train.jsonl"), ("prompt", "chosen", "rejected")) == data["train"]


def test_tokenize_completions_appends_eos_and_masks_by_length_when_pad_is_eos(tokenizer):
    plain = models.make_tiny_tokenizer()
    plain.pad_token = plain.eos_token  # like gpt2 and SmolLM2
    ids, mask = tasks.tokenize_completions(plain, ["12", "abcd"], "cpu")
    eos = plain.eos_token_id
    assert (
        ids[0].tolist()[:3] == plain("12", add_special_tokens=False).input_ids + [eos]
        and ids[0, 3:].eq(eos).all()
    )
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    cut_ids, cut_mask = tasks.tokenize_completions(tokenizer, ["abcd"], "cpu", max_tokens=3)
    # cut: no EOS
    assert cut_ids.tolist() == [tokenizer("abc", add_special_tokens=False).input_ids] and cut_mask.sum() == 3


def test_epoch_batches_visit_every_item_once_per_epoch():
    batches = tasks.epoch_batches(10, 4, 5, seed=0)  # 20 items = 2 epochs
    assert [len(b) for b in batches] == [4] * 5
    flat = [i for b in batches for i in b]
    assert sorted(flat[:10]) == list(range(10)) and sorted(flat[10:20]) == list(range(10))
    assert (
        tasks.epoch_batches(10, 4, 5, seed=0) == batches and tasks.epoch_batches(10, 4, 5, seed=1) != batches
    )


def test_truncated_samples_keep_no_eos_in_the_preference_data(
    tokenizer, preference_cache, digits_are_correct
):
    # 8 new tokens from a random model: most samples are cut off, a few end with EOS.
    data, _ = preferences.preference_data("tiny", tokenizer, 0, 32, 4, 8, 1.0, torch.device("cpu"), "fp32")
    samples = data["heldout_samples"]
    assert {s["finished"] for s in samples} == {True, False}, "the fixture should sample both kinds"
    texts = [s["completion"] for s in samples]
    ids, mask = tasks.tokenize_completions(tokenizer, texts, "cpu", finished=[s["finished"] for s in samples])
    last = ids.gather(1, (mask.sum(1, keepdim=True) - 1)).squeeze(1)  # the last real token of each row
    assert ((last == tokenizer.eos_token_id) == torch.tensor([s["finished"] for s in samples])).all()
    pairs = data["train"] + data["heldout"]
    texts, finished = preferences.pair_completions(pairs)
    assert (
        finished == [p[k] for p in pairs for k in ("chosen_finished", "rejected_finished")]
        and False in finished
    )


def test_pair_completions_of_a_users_pairs_are_finished():
    texts, finished = preferences.pair_completions([{"prompt": "p", "chosen": "a", "rejected": "b"}])
    assert texts == ["a", "b"] and finished == [True, True]
