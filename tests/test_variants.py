"""variants.py: every loss and advantage on hand-computed numbers, the conventions, learning, the CLI."""

import copy
import math
import os

import pytest
import torch

from infra import models
from infra import runs
from task import tasks
import variants
from conftest import (
    PAIRS,
    RUN_FILES,
    args_of,
    assert_checkpointing_changes_nothing,
    assert_one_line_error,
    assert_resume_is_exact,
    digit_fraction,
    metrics_of,
    run_script,
    run_script_here,
)
from variants import (
    Args,
    ipo_loss,
    kto_loss,
    main,
    offline_loss,
    orpo_loss,
    reinforce_pp_advantages,
    reinforce_pp_loss,
    remax_advantages,
    rloo_advantages,
    sequence_logps,
    simpo_loss,
)


def tiny_args(tmp_path, algo, **overrides) -> Args:
    defaults = dict(
        algo=algo,
        model="tiny",
        dataset=PAIRS if algo in ("ipo", "kto", "simpo", "orpo") else None,
        steps=2,
        batch_size=4,
        max_new_tokens=8,
        eval_size=8,
        output_dir=str(tmp_path / "runs"),
        lr=1e-3,
        warmup_steps=1,
    )
    return args_of(Args, **{**defaults, **overrides})


# ---- the losses ---------------------------------------------------------------------------------------------------
def test_ipo_loss_by_hand():
    # log-ratios 1 (chosen) and 0 (rejected): h = 1; τ = 0.1: (h - 1/(2τ))² = (1 - 5)² = 16; rewards τ·1 = 0.1 and 0
    losses, chosen_rewards, rejected_rewards = ipo_loss(
        torch.tensor([-1.0]), torch.tensor([-3.0]), torch.tensor([-2.0]), torch.tensor([-3.0]), 0.1
    )
    assert losses.item() == pytest.approx(16.0)
    assert (chosen_rewards.item(), rejected_rewards.item()) == pytest.approx((0.1, 0.0))


def test_kto_loss_by_hand():
    # β = 0.1; mismatched log-ratios [1, 0] → z0 = 0.5.
    # Desirable r = 2: 1 - σ(0.1·(2 - 0.5)) = 1 - σ(0.15) = 1 - 0.537430 = 0.462570
    # undesirable r = -1: λ_U · (1 - σ(0.1·(0.5 + 1))) = 2 · 0.462570 = 0.925140
    losses, rewards, z0 = kto_loss(
        torch.tensor([2.0, -1.0]),
        torch.zeros(2),
        torch.tensor([True, False]),
        torch.tensor([1.0, 0.0]),
        torch.zeros(2),
        beta=0.1,
        undesirable_weight=2.0,
    )
    assert z0.item() == pytest.approx(0.5)
    assert losses.tolist() == pytest.approx([0.462570, 0.925140], abs=1e-6)
    assert rewards.tolist() == pytest.approx([0.2, -0.1])


def test_kto_reference_point_is_clamped_at_zero_and_detached():
    policy_kl = torch.tensor([-1.0, -2.0], requires_grad=True)
    losses, _, z0 = kto_loss(
        torch.tensor([0.0]), torch.tensor([0.0]), torch.tensor([True]), policy_kl, torch.zeros(2), beta=0.1
    )
    assert z0.item() == 0.0 and not z0.requires_grad  # mean -1.5 clamps to 0
    assert losses.item() == pytest.approx(0.5)  # 1 - σ(0) = 0.5


def test_simpo_loss_by_hand_with_gamma_in_reward_units():
    # β = 2, γ = 0.5. chosen: log π = -4 over 4 tokens → β·(-1) = -2; rejected: -9 over 3 tokens → β·(-3) = -6
    # -log σ(-2 - (-6) - 0.5) = log(1 + e^-3.5) = 0.029750  (γ/β inside the bracket would give 3.75 instead)
    losses, chosen_rewards, rejected_rewards = simpo_loss(
        torch.tensor([-4.0]), torch.tensor([-9.0]), torch.tensor([4.0]), torch.tensor([3.0]), 2.0, 0.5
    )
    assert losses.item() == pytest.approx(0.029750, abs=1e-6)
    assert (chosen_rewards.item(), rejected_rewards.item()) == pytest.approx((-2.0, -6.0))


def test_orpo_loss_by_hand_with_odds_from_mean_token_logprobs():
    # chosen: mean log-prob log 0.5 (sum 2·log 0.5 over 2 tokens): odds 1, log odds 0; NLL = 0.693147
    # rejected: mean log-prob log 0.2 over 3 tokens: odds 0.25, log odds -1.386294
    # λ = 0.1: 0.693147 + 0.1 · log(1 + e^-1.386294) = 0.693147 + 0.1 · log 1.25 = 0.693147 + 0.022314 = 0.715461
    losses, _, _ = orpo_loss(
        torch.tensor([2 * math.log(0.5)]),
        torch.tensor([3 * math.log(0.2)]),
        torch.tensor([2.0]),
        torch.tensor([3.0]),
        0.1,
    )
    assert losses.item() == pytest.approx(0.715461, abs=1e-6)


def test_rloo_leave_one_out_by_hand():
    # [1, 0, 0, 1]: the baseline of a 1 is (0 + 0 + 1)/3 = 1/3, of a 0 is 2/3, so A = ±2/3
    assert rloo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), 4).tolist() == pytest.approx(
        [2 / 3, -2 / 3, -2 / 3, 2 / 3]
    )
    assert rloo_advantages(torch.full((4,), 0.5), 4).abs().max() == 0  # an all-equal group has no signal
    # two groups of 2, consecutive: [3, 1] → ±2; [0, 0] → 0
    assert rloo_advantages(torch.tensor([3.0, 1.0, 0.0, 0.0]), 2).tolist() == pytest.approx(
        [2.0, -2.0, 0.0, 0.0]
    )


def test_remax_greedy_baseline_by_hand():
    # two prompts, two samples each: [1, 0 | 0, 1] minus greedy [1 | 0]
    assert remax_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.tensor([1.0, 0.0])).tolist() == [
        0.0,
        -1.0,
        0.0,
        1.0,
    ]
    rewards = torch.tensor([0.3, 0.7])
    # greedy reward equal to the sample reward gives zero
    assert remax_advantages(rewards, rewards).abs().max() == 0


# Two prompts × k = 2 samples, a ragged mask (3, 2, 1, 2 tokens: 8 in all), β = 0.5, log π_ref = 0, and
# log π - log π_ref = 5 on every padding position: it must count nowhere.
RAGGED_MASK = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 0]])
RAGGED_LOG_RATIOS = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 5.0], [0.0, 5.0, 5.0], [-1.0, 0.0, 5.0]])


def test_reinforce_pp_whitens_the_kl_penalised_reward_to_go_over_the_whole_batch():
    # r_t = -0.5·(log-ratio), + the score on the last token; scores [1, 0 | 1, 1]:
    #   row 0: r = [-0.5, 0, 1]  -> G = [0.5, 1, 1]      row 1: r = [0, 0]  -> G = [0, 0]
    #   row 2: r = [1]           -> G = [1]              row 3: r = [0.5, 1] (the negative log-ratio is a bonus)
    #                                                            -> G = [1.5, 1]
    # over the 8 tokens: mean 6/8 = 0.75; deviations ±0.25 (five) and ±0.75 (three): population variance
    # (5·0.0625 + 3·0.5625)/8 = 2/8 = 0.25, std 0.5 (the sample std √(2/7) = 0.5345 would give ±0.4677, ±1.4031)
    advantages = reinforce_pp_advantages(
        torch.tensor([1.0, 0.0, 1.0, 1.0]), RAGGED_LOG_RATIOS, torch.zeros(4, 3), RAGGED_MASK, beta=0.5
    )
    assert advantages.tolist() == [
        pytest.approx(row, abs=1e-6)
        for row in [[-0.5, 0.5, 0.5], [-1.5, -1.5, 0.0], [0.5, 0.0, 0.0], [1.5, 0.5, 0.0]]
    ]
    # whitened per prompt instead, prompt 0's five tokens [0.5, 1, 1, 0, 0] would have mean 0.5 and std √0.2


def test_reinforce_pp_baseline_subtracts_the_prompts_mean_score_before_the_kl():
    # scores [1, 1 | 0, 0]: each prompt's samples scored alike, so the centred scores are all 0 and only the KL
    # is left: G = row 0 [-0.5, 0, 0], row 3 [0.5, 0], 0 elsewhere; mean 0, variance (0.25 + 0.25)/8 = 0.0625,
    # std 0.25: A = ±2 on the first tokens of rows 0 and 3. (Without the baseline, the scores would stay:
    # G = [0.5, 1, 1], [1, 1], [0], [0.5, 0].)
    advantages = reinforce_pp_advantages(
        torch.tensor([1.0, 1.0, 0.0, 0.0]),
        RAGGED_LOG_RATIOS,
        torch.zeros(4, 3),
        RAGGED_MASK,
        beta=0.5,
        group_size=2,
    )
    assert advantages.tolist() == [
        pytest.approx(row, abs=1e-6)
        for row in [[-2.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [2.0, 0.0, 0.0]]
    ]


def reinforce_pp_loss_and_gradient(kl_placement: str) -> tuple[float, list]:
    # A = 1 on every token, log π_ref = 0: log π - log π_ref is RAGGED_LOG_RATIOS (5 on padding), β = 0.5
    logprobs = RAGGED_LOG_RATIOS.clone().requires_grad_()
    loss = reinforce_pp_loss(torch.ones(4, 3), logprobs, torch.zeros(4, 3), RAGGED_MASK, 0.5, kl_placement)
    loss.backward()
    return loss.item(), logprobs.grad.tolist()


def test_reinforce_pp_loss_with_the_kl_in_the_loss_adds_beta_times_k2_by_hand():
    # -A_t log π_t over the 8 tokens: the valid log-ratios sum to 1 + (-1) = 0, so its token mean is 0.
    # k2 = ½ d²: ½ on the first tokens of rows 0 and 3, 0 on the other six: token mean 1/8, loss 0.5 · 1/8 = 0.0625
    # (k1 = d: 0.5 · 0/8 = 0; a mean of sequence means: 0.5 · (0.5/3 + 0.5/2)/4 = 0.052; padding's k2 = 12.5 counted:
    # 0.5 · 51/8 = 3.19). Gradient (-A_t + β d_t)/8: row 0's first token (-1 + 0.5)/8 = -0.0625, row 3's
    # (-1 - 0.5)/8 = -0.1875, the other valid tokens -1/8, padding 0 (k1's would be (-1 + 0.5)/8 on every token).
    loss, grad = reinforce_pp_loss_and_gradient("loss")
    assert loss == pytest.approx(0.0625, abs=1e-7)
    assert grad == [
        pytest.approx(row, abs=1e-7)
        for row in [
            [-0.0625, -0.125, -0.125],
            [-0.125, -0.125, 0.0],
            [-0.125, 0.0, 0.0],
            [-0.1875, -0.125, 0.0],
        ]
    ]


def test_reinforce_pp_loss_with_the_kl_in_the_reward_adds_nothing_by_hand():
    # the advantages already hold the KL (test_reinforce_pp_whitens_...): the loss is the token mean of -A_t log π_t,
    # (1 + (-1))/8 = 0, and its gradient -A_t/8 = -0.125 on the 8 valid tokens, 0 on padding. A k2 term here too
    # would give loss 0.0625 and -0.0625, -0.1875 on the first tokens of rows 0 and 3.
    loss, grad = reinforce_pp_loss_and_gradient("reward")
    assert loss == pytest.approx(0.0, abs=1e-7)
    assert grad == [
        pytest.approx(row, abs=1e-7)
        for row in [
            [-0.125, -0.125, -0.125],
            [-0.125, -0.125, 0.0],
            [-0.125, 0.0, 0.0],
            [-0.125, -0.125, 0.0],
        ]
    ]


# ---- the conventions in the loop ------------------------------------------------------------------------------------
ROWS = [
    {"prompt": "What is 3 + 4?", "chosen": "7", "rejected": "3 + 4 = 8, I think"},
    {"prompt": "What is 12 + 45?", "chosen": "12 + 45 = 57", "rejected": "58"},
]


def test_sequence_logps_are_sums_and_lengths_count_eos(tiny_model_and_tokenizer):
    tiny_model, tokenizer = (
        tiny_model_and_tokenizer  # on tiny-gpt2 pad = EOS: the EOS still counts, and is scored
    )
    logps, lengths = sequence_logps(tiny_model, tokenizer, ["What is 3 + 4?"], ["7", "3 + 4 = 8"], 256)
    assert lengths.tolist() == [2.0, 10.0]  # characters + EOS
    # By hand, one unpadded row at a time: the model on prompt + completion + EOS, and the sum of
    # log softmax(logits at t-1)[token t] over the completion tokens and the EOS, never the prompt's.
    prompt = tokenizer(tasks.format_prompt(tokenizer, "What is 3 + 4?"), add_special_tokens=False).input_ids
    for text, summed in zip(["7", "3 + 4 = 8"], logps.tolist()):
        ids = torch.tensor(
            [prompt + tokenizer(text, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]]
        )
        with torch.no_grad():
            token_logps = (
                torch.log_softmax(tiny_model(input_ids=ids).logits[0, :-1], -1)
                .gather(-1, ids[0, 1:, None])
                .squeeze(-1)
            )
        assert summed == pytest.approx(token_logps[len(prompt) - 1 :].sum().item(), abs=1e-4), text
    one, _ = sequence_logps(tiny_model, tokenizer, ["What is 3 + 4?"], ["7"], 256)
    # the padding of a longer neighbour changes nothing
    assert logps[0].item() == pytest.approx(one.item(), abs=1e-5)


def test_ipo_uses_summed_log_probs_and_simpo_orpo_the_length_normalised_ones(tokenizer):
    policy = models.load_model("tiny", len(tokenizer), torch.device("cpu"), "fp32", seed=0)
    ref = copy.deepcopy(policy)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    texts = [t for r in ROWS for t in (r["chosen"], r["rejected"])]
    prompts = [r["prompt"] for r in ROWS]
    with torch.no_grad():
        logps, lengths = sequence_logps(policy, tokenizer, prompts, texts, 256)
        ref_logps, _ = sequence_logps(ref, tokenizer, prompts, texts, 256)
        for algo, expected in (
            ("ipo", ipo_loss(logps[0::2], logps[1::2], ref_logps[0::2], ref_logps[1::2], 0.1)[0]),
            ("simpo", simpo_loss(logps[0::2], logps[1::2], lengths[0::2], lengths[1::2], 2.0, 0.5)[0]),
            ("orpo", orpo_loss(logps[0::2], logps[1::2], lengths[0::2], lengths[1::2], 0.1)[0]),
        ):
            beta = {"ipo": 0.1, "simpo": 2.0, "orpo": 0.1}[algo]
            loss, _ = offline_loss(args_of(Args, algo=algo), beta, policy, ref, tokenizer, ROWS)
            assert loss.item() == pytest.approx(expected.mean().item(), rel=1e-5), algo


def test_kto_reference_point_pairs_each_prompt_with_the_next_pairs_completions(tokenizer):
    # ref is the perturbed model here, so that the KL estimates come out positive and z0 is not clamped
    # to 0 whichever pairs it is taken from: only then can the test tell mismatched pairs from matched ones.
    policy = models.load_model("tiny", len(tokenizer), torch.device("cpu"), "fp32", seed=0)
    ref = copy.deepcopy(policy)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.05 * torch.randn_like(p))
    texts = [t for r in ROWS for t in (r["chosen"], r["rejected"])]
    prompts = [r["prompt"] for r in ROWS]
    shifted = texts[2:] + texts[:2]  # prompt 0 with pair 1's chosen and rejected, prompt 1 with pair 0's
    with torch.no_grad():
        logps, _ = sequence_logps(policy, tokenizer, prompts, texts, 256)
        ref_logps, _ = sequence_logps(ref, tokenizer, prompts, texts, 256)
        kl_logps, _ = sequence_logps(policy, tokenizer, prompts, shifted, 256)
        ref_kl_logps, _ = sequence_logps(ref, tokenizer, prompts, shifted, 256)
        expected, _, z0 = kto_loss(
            logps, ref_logps, torch.tensor([True, False, True, False]), kl_logps, ref_kl_logps, 0.1
        )
        matched_z0 = (logps - ref_logps).mean().item()
        # the two are told apart
        assert z0.item() > 0 and matched_z0 > 0 and abs(z0.item() - matched_z0) > 0.05
        loss, metrics = offline_loss(args_of(Args, algo="kto"), 0.1, policy, ref, tokenizer, ROWS)
        # imbalanced: half the pairs' desirable samples count, the first pair's; every undesirable one does
        imbalanced, _ = offline_loss(
            args_of(Args, algo="kto", desirable_fraction=0.5), 0.1, policy, ref, tokenizer, ROWS
        )
    assert metrics["kl"] == pytest.approx(z0.item(), rel=1e-5)
    assert loss.item() == pytest.approx(expected.mean().item(), rel=1e-5)
    assert imbalanced.item() == pytest.approx(expected[[0, 1, 3]].mean().item(), rel=1e-5)
    assert metrics["lengths/chosen"] == (2 + 13) / 2  # "7" and "12 + 45 = 57", each with its EOS


def test_simpo_and_orpo_load_no_reference_model(tmp_path):
    for algo in ("simpo", "orpo", "ipo"):
        result = main(tiny_args(tmp_path, algo, steps=1))
        assert result["models_in_memory"] == (1 if algo != "ipo" else 2)
        # none of the three measures a KL, so none is logged (not a 0.0)
        assert "kl" not in metrics_of(result)[0], algo


# ---- the online loop ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("algo", ["rloo", "remax", "reinforce_pp", "reinforce_pp_baseline"])
def test_online_baseline_cancels_a_constant_reward_in_the_loop(tmp_path, algo):
    # Step 1: the policy is the reference, so KL = 0 and every reward is 1 - β·0 = 1. RLOO's baseline (the
    # mean of the other k-1 samples) and ReMax's (the greedy completion's score) are 1 too: A = 1 - 1 = 0,
    # so the loss -A·log π(y|x) is 0. Without a baseline A would be 1. REINFORCE++: every token's reward to go
    # is 1, and so is the batch's mean.
    (row,) = metrics_of(main(tiny_args(tmp_path, algo, steps=1), reward_fn=lambda completion, answer: 1.0))
    assert row["kl"] == 0.0 and row["reward"] == 1.0 and row["rlhf_reward"] == 1.0
    assert row["advantage_abs"] == 0.0 and row["loss"] == 0.0


@pytest.mark.parametrize("algo", ["rloo", "remax", "reinforce_pp"])
def test_online_runs_log_the_sampler_against_the_trainer(tmp_path, algo):
    # float32 at temperature 0.7: the sampler's log-probs are the trainer's to rounding, also after an update
    rows = metrics_of(main(tiny_args(tmp_path, algo, steps=2, temperature=0.7), reward_fn=digit_fraction))
    assert all(row["mismatch/max_log_ratio"] < 1e-4 and row["mismatch/kl"] < 1e-8 for row in rows)
    assert all(row["mismatch/frac_over_0.1"] == 0.0 for row in rows)


@pytest.mark.parametrize("algo", ["kto", "rloo", "remax"])
def test_resume_continues_exactly(tmp_path, algo):
    assert_resume_is_exact(
        tmp_path,
        main,
        lambda out, **kw: args_of(
            Args,
            **{
                **dict(
                    algo=algo,
                    model="tiny",
                    dataset=PAIRS if algo == "kto" else None,
                    batch_size=4,
                    group_size=2,
                    max_new_tokens=8,
                    eval_size=8,
                    eval_every=2,
                    output_dir=str(out),
                    lr=1e-3,
                    warmup_steps=1,
                ),
                **kw,
            },
        ),
        reward_fn=digit_fraction,
    )


@pytest.mark.parametrize("algo", ["rloo", "remax"])
def test_online_kl_is_subtracted_from_the_reward_the_baseline_sees(tmp_path, algo, monkeypatch):
    seen = []  # the mean reward each step hands to rloo_advantages / remax_advantages
    for name in ("rloo_advantages", "remax_advantages"):
        real = getattr(variants, name)
        monkeypatch.setattr(
            variants,
            name,
            lambda rewards, *rest, real=real: seen.append(rewards.mean().item()) or real(rewards, *rest),
        )
    # β = 1 so that the KL term shows in the logged decimals; step 2 comes after one update, so its KL is not 0.
    # The reward is the completion's length: it differs between samples, and between a sample and the greedy
    # answer, from step 1 on (the random model writes no digits, so digit_fraction would leave step 1 without
    # a gradient, policy = reference, and step 2's KL exactly 0).
    rows = metrics_of(
        main(
            tiny_args(tmp_path, algo, beta=1.0, lr=1e-2, temperature=1.0),
            reward_fn=lambda completion, answer: len(completion) / 100,
        )
    )
    assert rows[0]["advantage_abs"] > 0 and abs(rows[1]["kl"]) > 1e-3
    # a penalty: mean(score - 1·KL) = mean score - mean KL; a bonus would give mean score + mean KL
    assert rows[1]["rlhf_reward"] == pytest.approx(rows[1]["reward"] - rows[1]["kl"], abs=1e-5)
    assert seen[1] == pytest.approx(rows[1]["reward"] - rows[1]["kl"], abs=1e-5)


@pytest.mark.parametrize(
    "algo, kl_placement",
    [
        ("reinforce_pp", None),
        ("reinforce_pp_baseline", None),
        ("reinforce_pp_baseline", "reward"),
        ("reinforce_pp", "loss"),
    ],
)
def test_reinforce_pp_in_the_loop_gets_the_kl_per_token_and_takes_the_token_mean(
    tmp_path, algo, kl_placement, monkeypatch
):
    seen = []  # what the loop hands to reinforce_pp_advantages, and what it gets back, each step

    def spy(scores, logprobs, ref_logprobs, mask, beta, group_size):
        advantages = reinforce_pp_advantages(scores, logprobs, ref_logprobs, mask, beta, group_size)
        seen.append(
            dict(
                logprobs=logprobs,
                ref_logprobs=ref_logprobs,
                mask=mask,
                advantages=advantages,
                beta=beta,
                group_size=group_size,
            )
        )
        return advantages

    monkeypatch.setattr(variants, "reinforce_pp_advantages", spy)
    rows = metrics_of(
        main(
            tiny_args(tmp_path, algo, beta=1.0, lr=1e-2, temperature=1.0, kl_placement=kl_placement),
            reward_fn=lambda completion, answer: len(completion) / 100,
        )
    )
    # after one update the log-ratio is not 0: it must arrive as log π - log π_ref, not reversed
    step2 = seen[1]
    lp, ref_lp, mask, advantages = (
        step2["logprobs"],
        step2["ref_logprobs"],
        step2["mask"],
        step2["advantages"],
    )
    kl = ((lp - ref_lp) * mask).sum(1).mean().item()
    assert abs(kl) > 1e-3 and kl == pytest.approx(rows[1]["kl"], abs=1e-5)
    # by default the baseline form's KL is in the loss (OpenRLHF's scripts), plain REINFORCE++'s in the reward
    in_loss = kl_placement == "loss" or (kl_placement is None and algo == "reinforce_pp_baseline")
    assert step2["beta"] == (0.0 if in_loss else 1.0)  # the KL in the reward to go only where it is placed
    k2 = ((0.5 * (lp - ref_lp) ** 2 * mask).sum() / mask.sum()).item()
    assert k2 > 1e-4  # large enough to show in the loss
    # the token mean over the batch, Σ A_t log π_t / (completion tokens); a mean of sequence sums would be larger;
    # with the KL in the loss, + β (= 1) × the token mean of k2
    policy_loss = -((advantages * lp * mask).sum() / mask.sum()).item()
    assert rows[1]["loss"] == pytest.approx(policy_loss + (k2 if in_loss else 0.0), abs=1e-5)
    # the k samples of a prompt
    assert step2["group_size"] == (4 if algo == "reinforce_pp_baseline" else None)


@pytest.mark.parametrize(
    "algo, first_bad_call, step",
    [
        ("rloo", 0, 1),
        ("remax", 0, 1),
        # calls 0-3 score the 4 samples, 4-7 the greedy completions: only the baseline is NaN
        ("remax", 4, 1),
        ("rloo", 16, 2),  # 4 prompts × 4 samples are scored per step: the 17th call is step 2's first
    ],
)
def test_a_non_finite_reward_is_reported_as_the_reward_functions_fault(tmp_path, algo, first_bad_call, step):
    calls = iter(range(10**6))

    def reward_fn(completion, answer):
        return float("nan") if next(calls) >= first_bad_call else 0.0

    with pytest.raises(
        runs.InputError,
        match=rf"reward became nan at step {step}: "
        r"the reward function returned a non-finite score",
    ) as error:
        main(tiny_args(tmp_path, algo), reward_fn=reward_fn)
    assert "--lr" not in str(error.value)  # the loss's message would blame the learning rate


# ---- learning --------------------------------------------------------------------------------------------------------
def test_simpo_raises_the_chosen_minus_rejected_margin_on_the_tiny_model(tmp_path):
    rows = metrics_of(main(tiny_args(tmp_path, "simpo", steps=60, batch_size=8, lr=3e-3)))
    first, last = rows[:5], rows[-10:]
    assert sum(r["rewards/margins"] for r in last) / 10 > sum(r["rewards/margins"] for r in first) / 5 + 0.3
    assert sum(r["loss"] for r in last) / 10 < sum(r["loss"] for r in first) / 5 - 0.2


def test_rloo_raises_a_dense_reward_on_the_tiny_model(tmp_path):
    args = tiny_args(
        tmp_path, "rloo", steps=30, batch_size=4, group_size=8, lr=3e-3, temperature=1.0, beta=0.01
    )
    rows = metrics_of(main(args, reward_fn=digit_fraction))
    assert sum(r["reward"] for r in rows[-5:]) / 5 > sum(r["reward"] for r in rows[:5]) / 5 + 0.1


def test_reinforce_pp_raises_a_dense_reward_on_the_tiny_model(tmp_path):
    args = tiny_args(
        tmp_path,
        "reinforce_pp_baseline",
        steps=30,
        batch_size=4,
        group_size=8,
        lr=3e-3,
        temperature=1.0,
        beta=0.01,
    )
    rows = metrics_of(main(args, reward_fn=digit_fraction))
    assert sum(r["reward"] for r in rows[-5:]) / 5 > sum(r["reward"] for r in rows[:5]) / 5 + 0.1


# ---- bad input, the command line -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "algo, overrides, message",
    [
        ("rloo", dict(group_size=1), "--group-size must be at least 2 for RLOO"),
        (
            "reinforce_pp_baseline",
            dict(group_size=1),
            "--group-size must be at least 2 for reinforce_pp_baseline",
        ),
        ("reinforce_pp", dict(group_size=0), "--group-size must be at least 1"),
        ("rloo", dict(kl_placement="loss"), "--kl-placement is for reinforce_pp and reinforce_pp_baseline"),
        ("kto", dict(batch_size=1), "--batch-size must be at least 2 for KTO"),
        ("ipo", dict(beta=0.0), "--beta must be > 0"),
        ("simpo", dict(dataset="/nonexistent.jsonl"), "no such file"),
    ],
)
def test_bad_arguments_are_one_clear_error(tmp_path, algo, overrides, message):
    with pytest.raises(runs.InputError, match=message):
        main(tiny_args(tmp_path, algo, **overrides))
    assert not os.path.exists(tmp_path / "runs")


@pytest.mark.parametrize(
    "algo", ["ipo", "kto", "simpo", "orpo", "rloo", "remax", "reinforce_pp", "reinforce_pp_baseline"]
)
def test_cli_tiny_run_for_every_algo(tmp_path, algo):
    dataset = ["--dataset", PAIRS] if algo in ("ipo", "kto", "simpo", "orpo") else ["--max-new-tokens", "8"]
    # one algorithm through a new Python, the rest in this one (the same __main__ block, 4 s of imports less each)
    run = run_script if algo == "rloo" else run_script_here
    proc = run(
        "variants.py",
        "--algo",
        algo,
        "--model",
        "tiny",
        *dataset,
        "--steps",
        "2",
        "--eval-size",
        "8",
        "--output-dir",
        str(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr
    assert "held-out accuracy" in proc.stdout
    (run_dir,) = os.listdir(tmp_path)
    assert run_dir.startswith(f"{algo}-tiny-0-")
    assert sorted(os.listdir(tmp_path / run_dir)) == RUN_FILES


def test_cli_needs_an_algo_and_reports_bad_input_in_one_line(tmp_path):
    assert run_script_here("variants.py", "--model", "tiny").returncode != 0  # --algo is required
    assert_one_line_error(
        run_script_here("variants.py", "--algo", "rloo", "--model", "tiny", "--group-size", "1"),
        "--group-size must be at least 2 for RLOO",
    )
    help_text = run_script_here("variants.py", "--help").stdout
    for flag in (
        "--algo",
        "--beta",
        "--simpo-gamma",
        "--desirable-weight",
        "--undesirable-weight",
        "--group-size",
        "--kl-placement",
    ):
        assert flag in help_text, flag
    # the online loop scores with full-softmax log-probs, so it must sample from them
    assert "--top-p" not in help_text


@pytest.mark.parametrize("algo", ["kto", "rloo"])
def test_gradient_checkpointing_changes_nothing(tmp_path, monkeypatch, algo):
    assert_checkpointing_changes_nothing(
        tmp_path,
        monkeypatch,
        main,
        lambda out, **kw: tiny_args(out, algo, save_model=False, **kw),
        **({"reward_fn": digit_fraction} if algo == "rloo" else {}),
    )
