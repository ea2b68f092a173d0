"""grpo_async.py: the importance weights of each correction and the queue of stale batches on hand-computed numbers;
the loop against grpo.py's, the correction and the staleness in it, resume, bad input and the command line. (The
sampler-trainer mismatch it logs, common.mismatch_metrics, is tested in test_common.py.)"""

import math
import os

import pytest
import torch

import grpo
import grpo_async
from infra import runs
from conftest import (
    TIMING,
    assert_one_line_error,
    assert_resume_is_exact,
    digit_fraction,
    metrics_of,
    run_script,
    run_script_here,
)
from grpo_async import Args, main
from test_grpo import shifted_sampler
from test_grpo import tiny_args as grpo_tiny_args


def tiny_args(tmp_path, **overrides) -> Args:
    """test_grpo.py's tiny run, with this file's options."""
    return grpo_tiny_args(tmp_path, args_class=Args, **overrides)


def steady_rows(result: dict) -> list[dict]:
    """metrics.jsonl's rows without their timings."""
    return [{k: v for k, v in row.items() if not k.startswith(TIMING)} for row in metrics_of(result)]


# w = π_train / π_sampler per token, as trainer and sampler log-probs of a sampler probability 0.2. Row 0 has three
# tokens (2, 1/2, 1), row 1 two (4, 1/4), row 2 two (4, 4), row 3 two (1/4, 1/2); the last column of rows 1-3 is
# padding with a wild ratio (e^5), which no weight of a real token may depend on.
W = [[2.0, 0.5, 1.0], [4.0, 0.25, 1.0], [4.0, 4.0, 1.0], [0.25, 0.5, 1.0]]
SAMPLER = torch.full((4, 3), math.log(0.2))
TRAINER = torch.log(0.2 * torch.tensor(W))
TRAINER[1:, 2] = math.log(0.2) + 5.0
MASK = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 0], [1, 1, 0]])
CAP = 3.0


def weights(correction: str) -> list[float]:
    """The weights of `correction`, flattened, padding's at 0 (it is never read)."""
    w, _ = grpo_async.importance_weights(TRAINER, SAMPLER, MASK, correction, CAP)
    return (w * MASK).flatten().tolist()


def flat(rows: list[list[float]]) -> list[float]:
    return [x for row in rows for x in row]


def test_no_correction_weighs_every_token_1():
    assert weights("none") == MASK.flatten().float().tolist()


def test_token_truncation_caps_above_and_keeps_below():
    # min(w, 3): 4 -> 3; 1/4 stays (TIS has no lower cap)
    expected = [[2.0, 0.5, 1.0], [3.0, 0.25, 0.0], [3.0, 3.0, 0.0], [0.25, 0.5, 0.0]]
    assert weights("token-truncate") == pytest.approx(flat(expected))


def test_token_masking_drops_both_sides_and_keeps_the_weight_inside():
    # inside [1/3, 3] w stays; 4 > 3 and 1/4 < 1/3 go to 0
    expected = [[2.0, 0.5, 1.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.5, 0.0]]
    assert weights("token-mask") == pytest.approx(flat(expected))


def test_sequence_weights_are_the_product_of_the_real_tokens():
    # row 0: 2 · 1/2 · 1 = 1; row 1: 4 · 1/4 = 1; row 2: 4 · 4 = 16; row 3: 1/4 · 1/2 = 0.125.
    # With the padding's e^5 counted, row 1 would be e^5 = 148, not 1; the geometric mean would give row 2 4 and
    # row 3 0.354, which masking at 1/3 would keep.
    truncated = [[1.0] * 3, [1.0, 1.0, 0.0], [3.0, 3.0, 0.0], [0.125, 0.125, 0.0]]
    masked = [[1.0] * 3, [1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    assert weights("sequence-truncate") == pytest.approx(flat(truncated), abs=1e-6)
    # 16 > 3 and 0.125 < 1/3 both go
    assert weights("sequence-mask") == pytest.approx(flat(masked), abs=1e-6)


def test_a_drifted_sequence_is_truncated_or_masked_by_its_product():
    # 32 tokens, each 0.033 nats more likely under the trainer: w_i = e^(32 · 0.033) = e^1.056 = 2.874849, where the
    # geometric mean is e^0.033 = 1.033551 and no cap near 2 would touch it. One padding token after them.
    mask = torch.tensor([[1] * 32 + [0]])
    sampler = torch.full((1, 33), -2.0)
    trainer = sampler + 0.033 * mask
    for correction, cap, expected in [
        ("sequence-truncate", 2.0, 2.0),
        ("sequence-mask", 2.0, 0.0),
        ("sequence-truncate", 3.0, 2.874849),
        ("sequence-mask", 3.0, 2.874849),
    ]:
        w, cut = grpo_async.importance_weights(trainer, sampler, mask, correction, cap)
        assert w[0, :32].tolist() == pytest.approx([expected] * 32, abs=1e-5), (correction, cap)
        assert cut[0, :32].all() == (cap == 2.0)


def test_a_long_sequence_s_product_overflows_to_no_nan():
    # 400 tokens 2 nats off each: e^800 is inf in float32; truncated it is C, masked it is 0, never NaN
    mask = torch.ones(1, 400)
    sampler = torch.full((1, 400), -5.0)
    for shift, truncated, masked in [(2.0, 2.0, 0.0), (-2.0, 0.0, 0.0)]:
        trainer = sampler + shift
        w, _ = grpo_async.importance_weights(trainer, sampler, mask, "sequence-truncate", 2.0)
        assert w.unique().tolist() == [truncated]
        w, _ = grpo_async.importance_weights(trainer, sampler, mask, "sequence-mask", 2.0)
        assert w.unique().tolist() == [masked]


def test_the_cut_marks_what_the_cap_changed():
    _, cut = grpo_async.importance_weights(TRAINER, SAMPLER, MASK, "token-truncate", CAP)
    assert (cut & MASK.bool()).tolist() == [
        [False] * 3,
        [True, False, False],
        [True, True, False],
        [False] * 3,
    ]
    _, cut = grpo_async.importance_weights(TRAINER, SAMPLER, MASK, "token-mask", CAP)
    assert (cut & MASK.bool()).tolist() == [
        [False] * 3,
        [True, True, False],
        [True, True, False],
        [True, False, False],
    ]


@pytest.mark.parametrize("correction", grpo_async.CORRECTIONS)
def test_the_weight_is_a_constant_of_the_gradient(correction):
    # loss = Σ w · log π_train: its gradient in log π_train is w itself, not w + w · log π_train (w's own gradient)
    trainer = TRAINER.clone().requires_grad_()
    w, _ = grpo_async.importance_weights(trainer, SAMPLER, MASK, correction, CAP)
    (w * trainer * MASK).sum().backward()
    assert torch.allclose(trainer.grad, w * MASK)


def test_an_unknown_correction_is_refused():
    with pytest.raises(ValueError, match="unknown correction"):
        grpo_async.importance_weights(TRAINER, SAMPLER, MASK, "token-clip", CAP)


def test_the_stale_queue_trains_each_step_on_the_batch_sampled_k_updates_earlier():
    updates = 0
    drawn_at = []

    def sample(index):
        drawn_at.append(index)
        return updates  # a batch remembers the policy that drew it: the number of updates it had seen

    queue = grpo_async.StaleQueue(sample, staleness=2, total=5)
    trained_on = []
    for _ in range(5):
        trained_on.append(queue.next())
        updates += 1
    # batch t is drawn after max(0, t - 1 - 2) updates: three by the starting policy, then one per step
    assert trained_on == [0, 0, 0, 1, 2]
    assert drawn_at == [0, 1, 2, 3, 4]  # as many batches as at staleness 0, none wasted at the end, in order


def test_staleness_zero_is_on_policy():
    updates = 0
    queue = grpo_async.StaleQueue(lambda index: updates, staleness=0, total=3)
    trained_on = []
    for _ in range(3):
        trained_on.append(queue.next())
        updates += 1
    assert trained_on == [0, 1, 2]


# ---- the loop ------------------------------------------------------------------------------------------------------
def test_on_policy_and_uncorrected_it_is_grpo(tmp_path):
    # the copied loop against the reference's: every number of a run with --staleness 0 and no correction
    straight = grpo.main(grpo_tiny_args(tmp_path / "grpo", eval_every=1, beta=0.1), reward_fn=digit_fraction)
    variant = main(tiny_args(tmp_path / "async", eval_every=1, beta=0.1), reward_fn=digit_fraction)
    assert steady_rows(variant) == steady_rows(straight) and variant["evals"] == straight["evals"]
    assert "is/weight_mean" not in steady_rows(variant)[0]


def test_the_sampler_against_the_trainer_is_logged_and_corrected(tmp_path, monkeypatch):
    shifted_sampler(monkeypatch, 0.3)
    # w = e^0.3 = 1.349859 at every token: k3 = w - 1 - log w = 0.049859; capped at 1.2
    rows = metrics_of(main(tiny_args(tmp_path / "a", steps=1, is_correction="token-truncate", is_cap=1.2)))
    assert rows[0]["mismatch/kl"] == pytest.approx(0.049859, abs=1e-5)
    assert rows[0]["mismatch/max_log_ratio"] == pytest.approx(0.3, abs=1e-5)
    assert rows[0]["mismatch/frac_over_0.1"] == 1.0
    assert rows[0]["is/weight_mean"] == pytest.approx(1.2) and rows[0]["is/frac_cut"] == 1.0
    # masked per sequence: every sequence's w = e^(0.3 |o_i|) >= 1.35 > 1.2 leaves the loss, so without a KL nothing
    # moves; truncated per sequence, every token of every sequence weighs 1.2
    args = tiny_args(tmp_path / "b", steps=1, is_correction="sequence-mask", is_cap=1.2, beta=0.0)
    rows = metrics_of(main(args, reward_fn=digit_fraction))
    assert rows[0]["is/weight_mean"] == 0.0 and rows[0]["grad_norm"] == 0.0
    args = tiny_args(tmp_path / "c", steps=1, is_correction="sequence-truncate", is_cap=1.2, beta=0.0)
    rows = metrics_of(main(args, reward_fn=digit_fraction))
    assert rows[0]["is/weight_mean"] == pytest.approx(1.2) and rows[0]["is/frac_cut"] == 1.0
    assert rows[0]["grad_norm"] > 0


def test_stale_batches_are_off_policy_by_the_updates_between(tmp_path):
    # float32: sampler and trainer agree to rounding on policy. With staleness 1, steps 1 and 2 train on batches
    # drawn by the starting policy, step 3 on one drawn after the first update: from step 2 on the trainer is one
    # update ahead of the sampler (lr 1e-3 moves the tiny model's log-probs by far more than rounding).
    on_policy = metrics_of(main(tiny_args(tmp_path / "a", steps=3), reward_fn=digit_fraction))
    assert all(row["mismatch/max_log_ratio"] < 1e-4 for row in on_policy)
    stale = metrics_of(main(tiny_args(tmp_path / "b", steps=3, staleness=1), reward_fn=digit_fraction))
    assert stale[0]["mismatch/max_log_ratio"] < 1e-4
    assert all(row["mismatch/max_log_ratio"] > 1e-2 for row in stale[1:])


# ---- resume ---------------------------------------------------------------------------------------------------------
def test_resume_at_staleness_zero_continues_exactly(tmp_path):
    assert_resume_is_exact(
        tmp_path,
        main,
        lambda out, **kw: tiny_args(out, beta=0.1, eval_every=2, is_correction="token-truncate", **kw),
        reward_fn=digit_fraction,
    )


# ---- bad input ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(is_cap=1.0), "--is-cap must be > 1"),
        (dict(staleness=-1), "--staleness must be >= 0"),
        (dict(staleness=2, resume="runs/x"), "--staleness with --resume: the queue of sampled batches"),
        (dict(group_size=1), "--group-size must be at least 2"),  # grpo.py's checks too
    ],
)
def test_bad_arguments_are_one_clear_error(tmp_path, overrides, message):
    with pytest.raises(runs.InputError, match=message):
        main(tiny_args(tmp_path, **overrides))
    assert not os.listdir(tmp_path)  # nothing was started


def test_cli_tiny_run(tmp_path):
    proc = run_script(
        "grpo_async.py",
        "--model",
        "tiny",
        "--steps",
        "3",
        "--staleness",
        "1",
        "--is-correction",
        "sequence-mask",
        "--is-cap",
        "3",
        "--eval-size",
        "8",
        "--output-dir",
        str(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr
    assert "held-out accuracy" in proc.stdout
    (run_dir,) = os.listdir(tmp_path)
    assert run_dir.startswith("grpo-async-tiny-0-")


def test_cli_help_and_bad_input_is_one_line_and_exit_2(tmp_path):
    help_text = run_script_here("grpo_async.py", "--help").stdout
    for flag in ("--staleness", "--is-correction", "--is-cap", "--group-size", "--top-p"):
        assert flag in help_text, flag
    assert "sequence-truncate" in help_text
    proc = run_script_here(
        "grpo_async.py", "--model", "tiny", "--is-cap", "0.5", "--output-dir", str(tmp_path)
    )
    assert_one_line_error(proc, "--is-cap must be > 1 (weights are kept within [1/C, C]), not 0.5")


@pytest.mark.parametrize("staleness, resumes", [(0, True), (2, False)])
def test_a_stale_run_is_never_offered_a_resume(staleness, resumes, tmp_path, monkeypatch):
    """--staleness with --resume is refused (the queue is not in a checkpoint), so neither the out-of-memory line nor
    Ctrl-C's may offer one."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "trainer_state.pt").write_bytes(b"")
    monkeypatch.setattr(runs, "_RUN_DIR", tmp_path)
    args = Args(staleness=staleness)
    assert ("--resume" in runs._out_of_memory(MemoryError(), args)) == resumes
    assert ("--resume" in runs._resume_hint(args)) == resumes
