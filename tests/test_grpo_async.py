"""offpolicy.py: the sampler-trainer mismatch, the importance weights of each correction, the queue of stale batches."""

import math

import pytest
import torch

import offpolicy


def logs(*values: float) -> torch.Tensor:
    return torch.log(torch.tensor(values))


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
    w, _ = offpolicy.importance_weights(TRAINER, SAMPLER, MASK, correction, CAP)
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
        w, cut = offpolicy.importance_weights(trainer, sampler, mask, correction, cap)
        assert w[0, :32].tolist() == pytest.approx([expected] * 32, abs=1e-5), (correction, cap)
        assert cut[0, :32].all() == (cap == 2.0)


def test_a_long_sequence_s_product_overflows_to_no_nan():
    # 400 tokens 2 nats off each: e^800 is inf in float32; truncated it is C, masked it is 0, never NaN
    mask = torch.ones(1, 400)
    sampler = torch.full((1, 400), -5.0)
    for shift, truncated, masked in [(2.0, 2.0, 0.0), (-2.0, 0.0, 0.0)]:
        trainer = sampler + shift
        w, _ = offpolicy.importance_weights(trainer, sampler, mask, "sequence-truncate", 2.0)
        assert w.unique().tolist() == [truncated]
        w, _ = offpolicy.importance_weights(trainer, sampler, mask, "sequence-mask", 2.0)
        assert w.unique().tolist() == [masked]


def test_the_cut_marks_what_the_cap_changed():
    _, cut = offpolicy.importance_weights(TRAINER, SAMPLER, MASK, "token-truncate", CAP)
    assert (cut & MASK.bool()).tolist() == [
        [False] * 3,
        [True, False, False],
        [True, True, False],
        [False] * 3,
    ]
    _, cut = offpolicy.importance_weights(TRAINER, SAMPLER, MASK, "token-mask", CAP)
    assert (cut & MASK.bool()).tolist() == [
        [False] * 3,
        [True, True, False],
        [True, True, False],
        [True, False, False],
    ]


@pytest.mark.parametrize("correction", offpolicy.CORRECTIONS)
def test_the_weight_is_a_constant_of_the_gradient(correction):
    # loss = Σ w · log π_train: its gradient in log π_train is w itself, not w + w · log π_train (w's own gradient)
    trainer = TRAINER.clone().requires_grad_()
    w, _ = offpolicy.importance_weights(trainer, SAMPLER, MASK, correction, CAP)
    (w * trainer * MASK).sum().backward()
    assert torch.allclose(trainer.grad, w * MASK)


def test_an_unknown_correction_is_refused():
    with pytest.raises(ValueError, match="unknown correction"):
        offpolicy.importance_weights(TRAINER, SAMPLER, MASK, "token-clip", CAP)


def test_mismatch_metrics_by_hand():
    # w = 2, 1/2, 1 in row 0 and 1.05 in row 1, then padding (e^5, never counted)
    trainer = torch.log(0.2 * torch.tensor([[2.0, 0.5, 1.0], [1.05, math.exp(5.0), 1.0]]))
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    metrics = offpolicy.mismatch_metrics(trainer, torch.full((2, 3), math.log(0.2)), mask)
    # k3 = w - 1 - log w: 2 - 1 - 0.693147 = 0.306853; 0.5 - 1 + 0.693147 = 0.193147; 0; 1.05 - 1 - 0.048790 =
    # 0.001210. Their mean over 4 tokens: 0.501210 / 4 = 0.125302. (KL the other way, -log w summed, is 0.)
    assert metrics["mismatch/kl"] == pytest.approx(0.125302, abs=1e-6)
    assert metrics["mismatch/max_log_ratio"] == pytest.approx(math.log(2.0), abs=1e-6)
    # k1 = -log w: (-0.693147 + 0.693147 - 0 - 0.048790) / 4 = -0.012198, below 0 though the KL is not
    assert metrics["mismatch/k1"] == pytest.approx(-0.012198, abs=1e-6)
    # |log w| > 0.1: 2 and 1/2, not 1 or 1.05 (0.0488)
    assert metrics["mismatch/frac_over_0.1"] == 0.5


def test_under_a_nucleus_k1_is_the_kl_and_k3_is_not():
    # A nucleus keeping mass m = 0.9 samples p_k / 0.9: w = π_train / π_sampler = 0.9 at every token it draws, and
    # KL(π_sampler || π_train) = -log 0.9 = 0.105361. k1 reads exactly that; k3 reads 0.9 - 1 + 0.105361 = 0.005361,
    # since E_sampler[w] = 0.9, not 1 (the trainer's mass on the cut tokens is never drawn).
    sampler = torch.log(torch.tensor([[0.5, 0.25, 0.4]]))
    metrics = offpolicy.mismatch_metrics(sampler + math.log(0.9), sampler, torch.ones(1, 3))
    assert metrics["mismatch/k1"] == pytest.approx(0.105361, abs=1e-6)
    assert metrics["mismatch/kl"] == pytest.approx(0.005361, abs=1e-6)


def test_the_stale_queue_trains_each_step_on_the_batch_sampled_k_updates_earlier():
    updates = 0
    drawn_at = []

    def sample(index):
        drawn_at.append(index)
        return updates  # a batch remembers the policy that drew it: the number of updates it had seen

    queue = offpolicy.StaleQueue(sample, staleness=2, total=5)
    trained_on = []
    for _ in range(5):
        trained_on.append(queue.next())
        updates += 1
    # batch t is drawn after max(0, t - 1 - 2) updates: three by the starting policy, then one per step
    assert trained_on == [0, 0, 0, 1, 2]
    assert drawn_at == [0, 1, 2, 3, 4]  # as many batches as at staleness 0, none wasted at the end, in order


def test_staleness_zero_is_on_policy():
    updates = 0
    queue = offpolicy.StaleQueue(lambda index: updates, staleness=0, total=3)
    trained_on = []
    for _ in range(3):
        trained_on.append(queue.next())
        updates += 1
    assert trained_on == [0, 1, 2]
