"""common.py: log-probs, masks, masked statistics, sampling, model loading and checkpoints."""

import json
import math
import sys
import warnings
from pathlib import Path

import pytest
import torch
import transformers

import common
from infra import metrics
from infra import models
from infra import stepmetrics
from infra import runs
from conftest import policy_args

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dev"))
from live_memory import peak_live_bytes  # noqa: E402


# ---- masked statistics -------------------------------------------------------------------------
def test_masked_mean_and_sum_by_hand():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert common.masked_sum(x, mask).item() == 7.0  # 1 + 2 + 4
    assert common.masked_mean(x, mask).item() == pytest.approx(7 / 3)
    assert common.masked_mean(x, mask, dim=1).tolist() == [1.5, 4.0]  # (1+2)/2, 4/1


# ---- gather_logprobs and completion masks --------------------------------------------------------
@pytest.mark.parametrize("fast", [False, True])
def test_gather_logprobs_by_hand(fast):
    # logits [0, ln 3]: softmax [1/4, 3/4]
    logits = torch.tensor([[[0.0, math.log(3.0)]]])
    assert common.gather_logprobs(logits, torch.tensor([[1]]), kernels_on=fast).item() == pytest.approx(
        math.log(0.75)
    )


@pytest.mark.parametrize("fast", [False, True])
def test_token_logprobs_ignore_positions_past_the_labels_and_refuse_too_few(fast):
    torch.manual_seed(0)
    logits, labels = torch.randn(2, 4, 7, requires_grad=True), torch.randint(0, 7, (2, 3))
    logprobs, entropy = common.token_logprobs(logits, labels, with_entropy=True, kernels_on=fast)
    (logprobs.sum() + entropy.sum()).backward()
    log_p = torch.log_softmax(logits[:, :3].detach(), -1)
    assert torch.allclose(logprobs, log_p.gather(-1, labels[..., None]).squeeze(-1), atol=1e-6)
    assert (logits.grad[:, 3] == 0).all() and logits.grad[:, :3].abs().sum() > 0
    with pytest.raises(ValueError, match="4 labels per row but logits for 3 positions"):
        common.token_logprobs(logits[:, :3], torch.zeros(2, 4, dtype=torch.long), kernels_on=fast)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_plain_log_prob_path_holds_no_full_vocabulary_temporary(dtype, monkeypatch):
    # 8 sequences of 16 positions (a 17th predicts nothing) over 32,768 tokens: 4.5 M logits. One sequence a piece
    # (16·32,768 = 2^19 logits > 2^18). What lives at the peak, in the backward: the logits' gradient, a second
    # tensor of its size while autograd adds a piece's gradient in (a slice's backward is the full size), and one
    # piece's float32 temporaries (2^19 · 4 B = 2 MiB each). Measured: 2.13 and 2.28 gradients' worth (fp32, bf16
    # logits). The whole log-softmax in float32, as before, kept float32 copies: 5.1 and 10.2.
    monkeypatch.setattr(common, "LOGPROB_PIECE", 2**18)
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(8, 17, 32768, generator=generator).to(dtype).requires_grad_()
    labels = torch.randint(0, 32768, (8, 16), generator=generator)

    def forward_backward():
        logprobs, entropy = common.token_logprobs(logits, labels, temperature=0.7, with_entropy=True)
        (logprobs.sum() + entropy.sum()).backward()

    peak = peak_live_bytes(forward_backward)
    gradient = logits.numel() * logits.element_size()
    piece = 16 * 32768 * 4
    assert peak < 2 * gradient + 6 * piece, (peak / gradient, (peak - 2 * gradient) / piece)
    # and the numbers are the whole log-softmax's
    whole = torch.log_softmax(logits.detach()[:, :16].float() / 0.7, dim=-1)
    logprobs, entropy = common.token_logprobs(logits.detach(), labels, temperature=0.7, with_entropy=True)
    torch.testing.assert_close(logprobs, whole.gather(-1, labels[..., None]).squeeze(-1), rtol=0, atol=1e-6)
    torch.testing.assert_close(entropy, -(whole.exp() * whole).sum(-1), rtol=0, atol=1e-5)


def test_completion_mask_keeps_first_eos_and_drops_the_rest():
    eos = 2
    ids = torch.tensor([[5, 2, 0, 0], [5, 6, 7, 8], [2, 5, 2, 2]])
    assert common.completion_mask(ids, eos).tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]


def test_completion_mask_when_pad_is_eos():
    # gpt2: pad == eos, so the row after the real EOS is all EOS; only the first one counts
    ids = torch.tensor([[7, 9, 50256, 50256, 50256]])
    assert common.completion_mask(ids, 50256).tolist() == [[1, 1, 1, 0, 0]]


# ---- completion log-probs ----------------------------------------------------------------------------
def one_token_at_a_time(
    model, prompt: torch.Tensor, completion: torch.Tensor, temperature: float
) -> torch.Tensor:
    """Reference: no padding, no cache, one growing sequence per token."""
    out = []
    for t in range(len(completion)):
        seq = torch.cat([prompt, completion[:t]])[None]
        logits = model(seq).logits[0, -1] / temperature
        out.append(torch.log_softmax(logits, -1)[completion[t]])
    return torch.stack(out)


@pytest.mark.parametrize("share_prompt", [True, False])
def test_completion_logprobs_equal_one_token_at_a_time_reference(
    tiny_model, tokenizer, prompts, share_prompt
):
    ids, mask = prompts
    completions = common.sample_completions(
        tiny_model, ids, mask, 3, 6, tokenizer.eos_token_id, tokenizer.pad_token_id
    )
    logprobs, _ = common.completion_logprobs(
        tiny_model, ids, mask, completions, torch.tensor([3, 3]), 0.7, share_prompt=share_prompt
    )
    for b in range(6):
        prompt = ids[b // 3][mask[b // 3].bool()]
        reference = one_token_at_a_time(tiny_model, prompt, completions[b], temperature=0.7)
        # one temperature division: dividing twice (0.49) or not at all would miss by far more than 1e-5
        assert torch.allclose(logprobs[b], reference, atol=1e-5)


def test_completion_logprobs_ignore_padding_amount(tiny_model, tokenizer, prompts):
    ids, mask = prompts
    completions = torch.randint(10, 60, (6, 5))
    base, _ = common.completion_logprobs(tiny_model, ids, mask, completions, torch.tensor([3, 3]))
    pad = tokenizer.pad_token_id
    more_left = (
        torch.cat([torch.full((2, 7), pad), ids], 1),
        torch.cat([torch.zeros(2, 7, dtype=torch.long), mask], 1),
    )
    more_right = torch.cat([completions, torch.full((6, 4), pad)], 1)
    padded, _ = common.completion_logprobs(tiny_model, *more_left, more_right, torch.tensor([3, 3]))
    assert torch.allclose(padded[:, :5], base, atol=1e-5)


def test_one_token_prompts_share_nothing_and_lose_nothing(tiny_model, tokenizer):
    # The shared forward runs each prompt but its last token once; a one-token prompt beside a longer
    # one is all padding there, and prompts of one token each (S = 1) skip that forward altogether.
    pad, completions = tokenizer.pad_token_id, torch.randint(10, 60, (4, 5))
    for ids, mask in [
        (torch.tensor([[pad, pad, 17], [21, 22, 23]]), torch.tensor([[0, 0, 1], [1, 1, 1]])),
        (torch.tensor([[17], [23]]), torch.tensor([[1], [1]])),
    ]:
        shared, _ = common.completion_logprobs(
            tiny_model, ids, mask, completions, torch.tensor([2, 2]), share_prompt=True
        )
        concatenated, _ = common.completion_logprobs(
            tiny_model, ids, mask, completions, torch.tensor([2, 2]), share_prompt=False
        )
        reference = one_token_at_a_time(tiny_model, ids[0][mask[0].bool()], completions[0], temperature=1.0)
        assert torch.isfinite(shared).all() and torch.allclose(shared, concatenated, atol=1e-5)
        assert torch.allclose(shared[0], reference, atol=1e-5)


def test_the_cache_goes_by_the_name_the_installed_transformers_reads(tiny_model, tokenizer, prompts):
    # A name transformers has deprecated draws a FutureWarning; once removed (past_key_values, in 5.40) it would
    # fall into **kwargs and the cache be silently ignored, which the equality tests above then catch.
    ids, mask = prompts
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        completions = common.sample_completions(
            tiny_model, ids, mask, 2, 3, tokenizer.eos_token_id, tokenizer.pad_token_id
        )
        common.completion_logprobs(
            tiny_model, ids, mask, completions, torch.tensor([2, 2]), share_prompt=True
        )


def test_right_padded_prompts_are_refused_not_silently_wrong(tiny_model, tokenizer, prompts):
    ids, mask = prompts
    right_ids, right_mask = ids.flip(1), mask.flip(1)  # row 0 is shorter: its padding now sits on the right
    with pytest.raises(ValueError, match="left-padded"):
        common.completion_logprobs(
            tiny_model, right_ids, right_mask, torch.randint(10, 60, (2, 3)), torch.tensor([1, 1])
        )
    with pytest.raises(ValueError, match="left-padded"):
        common.sample_completions(
            tiny_model, right_ids, right_mask, 1, 3, tokenizer.eos_token_id, tokenizer.pad_token_id
        )


def test_shared_prompt_and_concatenated_forward_give_the_same_gradient(tokenizer, prompts):
    ids, mask = prompts
    completions = torch.randint(10, 60, (4, 5))
    grads = []
    for share in (True, False):
        model = models.load_model("tiny", len(tokenizer), torch.device("cpu"), "fp32", seed=0)
        logprobs, _ = common.completion_logprobs(
            model, ids, mask, completions, torch.tensor([1, 3]), share_prompt=share
        )
        logprobs.sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert torch.allclose(grads[0], grads[1], atol=1e-5)


# ---- sampling --------------------------------------------------------------------------------------------
def test_greedy_sampling_follows_argmax_and_pads_after_eos(tiny_model, tokenizer, prompts):
    ids, mask = prompts
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    completions = common.sample_completions(tiny_model, ids, mask, 2, 8, eos, pad, temperature=0)
    # greedy: both samples agree
    assert completions.shape[0] == 4 and torch.equal(completions[0], completions[1])
    logprobs, _ = common.completion_logprobs(tiny_model, ids, mask, completions, torch.tensor([2, 2]))
    for b in range(4):
        prompt = ids[b // 2][mask[b // 2].bool()]
        for t in range(completions.shape[1]):
            if t > 0 and completions[b, t - 1] == eos:
                assert (completions[b, t:] == pad).all()
                break
            logits = tiny_model(torch.cat([prompt, completions[b, :t]])[None]).logits[0, -1]
            assert completions[b, t] == logits.argmax()


def test_inverse_cdf_sampling_has_the_right_distribution():
    logits = torch.log(torch.tensor([[0.2, 0.5, 0.3]])).expand(20000, 3)
    tokens, _ = common._sample_token(logits, 1.0, 1.0, torch.Generator().manual_seed(0))
    freq = torch.bincount(tokens, minlength=3).float() / 20000
    assert freq.tolist() == pytest.approx([0.2, 0.5, 0.3], abs=0.015)


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = torch.log(torch.tensor([[0.2, 0.5, 0.3]])).expand(5000, 3)
    # sorted 0.5, 0.3, 0.2: top_p = 0.6 keeps {0.5, 0.3} (0.5 alone is < 0.6), renormalised to 5/8, 3/8
    tokens, _ = common._sample_token(logits, 1.0, 0.6, torch.Generator().manual_seed(0))
    freq = torch.bincount(tokens, minlength=3).float() / 5000
    assert freq[0] == 0 and freq[1].item() == pytest.approx(0.625, abs=0.03)


def test_a_uniform_of_exactly_zero_never_draws_a_token_of_zero_mass(monkeypatch):
    def zeros(*shape, device=None, generator=None):
        return torch.zeros(*shape, device=device)

    monkeypatch.setattr(torch, "rand", zeros)
    # Row 0: token 0 has no mass (logit -inf). Row 1: token 0 has mass 1 / (1 + 2e³) = 0.0243, none left after
    # the nucleus (top_p = 0.6 keeps tokens 1 and 2, 0.4879 each). Where token 0 has no mass, its cdf is 0, and
    # u = 0 must land on token 1, the first with mass.
    logits = torch.tensor([[-float("inf"), 0.0, 0.0], [0.0, 3.0, 3.0]])
    assert common._sample_token(logits, 1.0, 1.0, None)[0].tolist() == [1, 0]
    assert common._sample_token(logits, 1.0, 0.6, None)[0].tolist() == [1, 1]


def test_temperature_divides_the_logits_before_sampling():
    logits = torch.log(torch.tensor([[0.2, 0.5, 0.3]])).expand(5000, 3)
    # T = 0.5: softmax(log p / 0.5) = p² / Σ p²; p² = 0.04, 0.25, 0.09, sum 0.38: 0.04/0.38 = 0.105263,
    # 0.25/0.38 = 0.657895, 0.09/0.38 = 0.236842 (at T = 1 it would be 0.2, 0.5, 0.3). The sampling std of a
    # frequency of 5000 draws is at most sqrt(0.25 / 5000) = 0.0071, so abs=0.03 is over 4 of them.
    tokens, _ = common._sample_token(logits, 0.5, 1.0, torch.Generator().manual_seed(0))
    freq = torch.bincount(tokens, minlength=3).float() / 5000
    assert freq.tolist() == pytest.approx([0.105263, 0.657895, 0.236842], abs=0.03)


def test_the_sampler_returns_the_log_prob_of_the_distribution_it_drew_from():
    logits = torch.log(torch.tensor([[0.2, 0.5, 0.3]])).expand(300, 3)
    generator = torch.Generator().manual_seed(0)
    # T = 1, no nucleus: log p_k
    tokens, logprobs = common._sample_token(logits, 1.0, 1.0, generator)
    expected = torch.log(torch.tensor([0.2, 0.5, 0.3]))[tokens]
    assert torch.allclose(logprobs, expected, atol=1e-6)
    # top_p = 0.6 keeps 0.5 and 0.3, mass 0.8: log(0.5 / 0.8) = log 0.625, log(0.3 / 0.8) = log 0.375 (the full
    # softmax's log 0.5 and log 0.3 would miss by log 0.8 = -0.223)
    tokens, logprobs = common._sample_token(logits, 1.0, 0.6, generator)
    expected = torch.log(torch.tensor([0.0, 0.625, 0.375]))[tokens]
    assert set(tokens.tolist()) == {1, 2} and torch.allclose(logprobs, expected, atol=1e-6)
    # T = 0.5: p² / Σ p² = 0.04 / 0.38, 0.25 / 0.38, 0.09 / 0.38
    tokens, logprobs = common._sample_token(logits, 0.5, 1.0, generator)
    expected = torch.log(torch.tensor([0.04, 0.25, 0.09]) / 0.38)[tokens]
    assert torch.allclose(logprobs, expected, atol=1e-6)
    # greedy: a point mass, log 1
    tokens, logprobs = common._sample_token(logits, 0.0, 1.0, generator)
    assert (tokens == 1).all() and (logprobs == 0).all()


def test_sampler_log_probs_equal_the_trainers_in_float32_and_exceed_them_by_the_nucleus(
    tiny_model, tokenizer, prompts
):
    ids, mask = prompts
    eos = tokenizer.eos_token_id
    generator = torch.Generator().manual_seed(0)
    completions, sampled = common.sample_with_logprobs(
        tiny_model, ids, mask, 3, 6, eos, tokenizer.pad_token_id, 0.7, 1.0, generator
    )
    kept = common.completion_mask(completions, eos)
    trained, _ = common.completion_logprobs(tiny_model, ids, mask, completions, torch.tensor([3, 3]), 0.7)
    # one float32 model, two code paths (cache against full forward): equal to rounding, 0 after EOS
    assert torch.allclose(sampled * kept, trained * kept, atol=1e-5)
    assert (sampled[kept == 0] == 0).all()
    # top_p = 0.9: each token's sampler log-prob exceeds the full softmax's by -log(the mass kept), computed here
    # from the trainer's own softmax at that position
    completions, sampled = common.sample_with_logprobs(
        tiny_model, ids, mask, 3, 6, eos, tokenizer.pad_token_id, 0.7, 0.9, generator
    )
    kept = common.completion_mask(completions, eos)
    trained, _ = common.completion_logprobs(tiny_model, ids, mask, completions, torch.tensor([3, 3]), 0.7)
    for b in range(6):
        prompt = ids[b // 3][mask[b // 3].bool()]
        for t in range(int(kept[b].sum())):
            probs = torch.softmax(
                tiny_model(torch.cat([prompt, completions[b, :t]])[None]).logits[0, -1] / 0.7, -1
            )
            ordered = probs.sort(descending=True).values
            mass = ordered[ordered.cumsum(0) - ordered <= 0.9].sum()
            assert (sampled[b, t] - trained[b, t]).item() == pytest.approx(-math.log(mass.item()), abs=1e-4)


# ---- the sampler against the trainer ------------------------------------------------------------------------
def test_mismatch_metrics_by_hand():
    # w = 2, 1/2, 1 in row 0 and 1.05 in row 1, then padding (e^5, never counted)
    trainer = torch.log(0.2 * torch.tensor([[2.0, 0.5, 1.0], [1.05, math.exp(5.0), 1.0]]))
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    mismatch = common.mismatch_metrics(trainer, torch.full((2, 3), math.log(0.2)), mask)
    # k3 = w - 1 - log w: 2 - 1 - 0.693147 = 0.306853; 0.5 - 1 + 0.693147 = 0.193147; 0; 1.05 - 1 - 0.048790 =
    # 0.001210. Their mean over 4 tokens: 0.501210 / 4 = 0.125302. (KL the other way, -log w summed, is 0.)
    assert mismatch["mismatch/kl"] == pytest.approx(0.125302, abs=1e-6)
    assert mismatch["mismatch/max_log_ratio"] == pytest.approx(math.log(2.0), abs=1e-6)
    # k1 = -log w: (-0.693147 + 0.693147 - 0 - 0.048790) / 4 = -0.012198, below 0 though the KL is not
    assert mismatch["mismatch/k1"] == pytest.approx(-0.012198, abs=1e-6)
    # |log w| > 0.1: 2 and 1/2, not 1 or 1.05 (0.0488)
    assert mismatch["mismatch/frac_over_0.1"] == 0.5


def test_under_a_nucleus_k1_is_the_kl_and_k3_is_not():
    # A nucleus keeping mass m = 0.9 samples p_k / 0.9: w = π_train / π_sampler = 0.9 at every token it draws, and
    # KL(π_sampler || π_train) = -log 0.9 = 0.105361. k1 reads exactly that; k3 reads 0.9 - 1 + 0.105361 = 0.005361,
    # since E_sampler[w] = 0.9, not 1 (the trainer's mass on the cut tokens is never drawn).
    sampler = torch.log(torch.tensor([[0.5, 0.25, 0.4]]))
    mismatch = common.mismatch_metrics(sampler + math.log(0.9), sampler, torch.ones(1, 3))
    assert mismatch["mismatch/k1"] == pytest.approx(0.105361, abs=1e-6)
    assert mismatch["mismatch/kl"] == pytest.approx(0.005361, abs=1e-6)


# ---- checkpoints and loaded models ---------------------------------------------------------------------------
def test_interrupted_save_keeps_the_last_good_checkpoint(tmp_path, tokenizer, monkeypatch):
    model = models.load_model("tiny", len(tokenizer), torch.device("cpu"), "fp32")
    target = tmp_path / "model"
    runs.save_checkpoint(model, tokenizer, target)
    good = (target / "model.safetensors").read_bytes()

    def broken_save(path, *args, **kwargs):
        path.mkdir(parents=True, exist_ok=True)
        (path / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(model, "save_pretrained", broken_save)
    with pytest.raises(KeyboardInterrupt):
        runs.save_checkpoint(model, tokenizer, target)
    assert (target / "model.safetensors").read_bytes() == good


def test_dropout_is_off_in_a_loaded_model_whose_config_has_dropout(dropout_checkpoint, tokenizer):
    ids = torch.randint(5, 50, (2, 9))
    torch.manual_seed(0)
    as_transformers_loads_it = transformers.AutoModelForCausalLM.from_pretrained(dropout_checkpoint).train()
    # it can show the bug
    assert not torch.equal(as_transformers_loads_it(ids).logits, as_transformers_loads_it(ids).logits)
    for head in ("lm", "score"):  # a policy, and a reward model or critic
        model = models.load_model(
            dropout_checkpoint, len(tokenizer), torch.device("cpu"), "fp32", head=head
        ).train()
        output = (
            (lambda: model(ids).logits)
            if head == "lm"
            else (lambda: common.reward_scores(model, ids, torch.ones_like(ids)))
        )
        first = output()
        assert torch.equal(first, output())
        model.eval()
        assert torch.equal(first, output())
        assert all(m.p == 0 for m in model.modules() if isinstance(m, torch.nn.Dropout))


def test_dropout_is_off_in_llama_attention_which_reads_a_float(tmp_path, tokenizer):
    model = models.make_tiny_model(len(tokenizer), "llama")
    model.config.attention_dropout = (
        0.5  # LlamaAttention has no nn.Dropout: it passes this float to attention
    )
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    model = models.load_model(str(tmp_path), len(tokenizer), torch.device("cpu"), "fp32").train()
    ids = torch.randint(5, 50, (2, 9))
    assert torch.equal(model(ids).logits, model(ids).logits)


def test_one_token_completions_have_log_probs(tiny_model, tokenizer, prompts):
    # T = 1 (every sample a bare EOS, or --max-new-tokens 1) leaves no logits after the first token.
    ids, mask = prompts
    completion = torch.full((2, 1), tokenizer.eos_token_id)
    for share_prompt in (True, False):
        logprobs, entropy = common.completion_logprobs(
            tiny_model,
            ids,
            mask,
            completion,
            torch.tensor([1, 1]),
            with_entropy=True,
            share_prompt=share_prompt,
        )
        assert logprobs.shape == (2, 1) and entropy.shape == (2, 1) and (logprobs < 0).all()
    assert common.gather_logprobs(torch.zeros(2, 0, 5), torch.zeros(2, 0, dtype=torch.long)).shape == (2, 0)


@pytest.mark.parametrize("fast", [False, True])
def test_entropy_by_hand(fast):
    # logits [0, ln 3]: p = [1/4, 3/4], H = 1/4 ln 4 + 3/4 ln(4/3) = 0.346574 + 0.215762 = 0.562335
    logits = torch.tensor([[[0.0, math.log(3.0)]]])
    logprobs, entropy = common.token_logprobs(logits, torch.tensor([[1]]), with_entropy=True, kernels_on=fast)
    assert entropy.item() == pytest.approx(0.562335, abs=1e-6) and logprobs.item() == pytest.approx(
        math.log(0.75)
    )
    # at temperature 2 the logits are [0, ln 3 / 2]: p = [1/(1+√3), √3/(1+√3)] = [0.366025, 0.633975]
    # H = -(0.366025 ln 0.366025 + 0.633975 ln 0.633975) = 0.367875 + 0.288932 = 0.656806
    _, entropy = common.token_logprobs(
        logits, torch.tensor([[1]]), temperature=2.0, with_entropy=True, kernels_on=fast
    )
    assert entropy.item() == pytest.approx(0.656806, abs=1e-6)


# ---- precision ------------------------------------------------------------------------------------------------
def test_auto_precision_is_bf16_mixed_on_cuda_and_on_a_cpu_with_bf16_matmuls_for_a_real_model(monkeypatch):
    assert models.resolve_precision("auto", torch.device("cuda"), "smollm2") == "bf16-mixed"
    assert models.resolve_precision("auto", torch.device("cuda"), "tiny") == "bf16-mixed"
    for has_bf16, real, tiny in ((True, "bf16-mixed", "fp32"), (False, "fp32", "fp32")):
        monkeypatch.setattr(models, "cpu_has_bf16_matmul", lambda: has_bf16)
        assert models.resolve_precision("auto", torch.device("cpu"), "smollm2") == real
        assert models.resolve_precision("auto", torch.device("cpu"), "tiny") == tiny
        assert models.resolve_precision("auto", torch.device("cpu"), "tiny-gpt2") == tiny
        assert models.resolve_precision("fp32", torch.device("cpu"), "smollm2") == "fp32"  # asked for: kept
    with pytest.raises(runs.InputError, match="--precision must be auto, fp32, bf16-mixed or bf16-true"):
        models.resolve_precision("float16", torch.device("cpu"))


# ---- the learning-rate schedule ---------------------------------------------------------------------------------
def test_lr_warms_up_then_stays_constant_or_decays_linearly_to_zero_at_the_last_step():
    # warm-up 2: (s + 1) / 2 = 0.5, 1; constant after. With decay over 6 updates: (6 - s) / (6 - 2) for s = 2..5
    assert [common.lr_factor(s, 2) for s in range(5)] == [0.5, 1.0, 1.0, 1.0, 1.0]
    assert [common.lr_factor(s, 2, 6) for s in range(6)] == [0.5, 1.0, 1.0, 0.75, 0.5, 0.25]
    # no warm-up: decays from 1
    assert [common.lr_factor(s, 0, 4) for s in range(4)] == [1.0, 0.75, 0.5, 0.25]


def fraction_of_weights_changed(precision: str, tokenizer, prompts) -> float:
    """Three AdamW steps at lr 1e-6 on the tiny model: the share of weight elements that moved."""
    model = models.load_model("tiny", len(tokenizer), torch.device("cpu"), precision, seed=0)
    before = [p.detach().clone() for p in model.parameters()]
    optimizer, _ = common.make_optimizer(model, lr=1e-6)
    completions = torch.randint(5, 90, (4, 6), generator=torch.Generator().manual_seed(1))
    for _ in range(3):
        logprobs, _ = common.completion_logprobs(model, *prompts, completions, torch.tensor([2, 2]))
        optimizer.zero_grad()
        (-logprobs.mean()).backward()
        optimizer.step()
    return sum((p.detach() != b).sum().item() for p, b in zip(model.parameters(), before)) / sum(
        b.numel() for b in before
    )


def test_bf16_mixed_keeps_every_small_update_and_bf16_true_loses_most(tokenizer, prompts):
    # An AdamW update of ~lr = 1e-6 is below half the bf16 rounding step (|w|·2^-8) of any |w| ≳ 2.4e-4:
    # bf16-true loses it.
    assert fraction_of_weights_changed("bf16-mixed", tokenizer, prompts) >= 0.99
    assert fraction_of_weights_changed("bf16-true", tokenizer, prompts) < 0.2


@pytest.mark.parametrize("fast", [False, True])
def test_bf16_mixed_computes_in_bf16_and_returns_float32_log_probs(tokenizer, prompts, fast):
    completions = torch.randint(5, 90, (4, 6), generator=torch.Generator().manual_seed(1))
    fp32, mixed = (
        models.load_model("tiny", len(tokenizer), torch.device("cpu"), p, seed=0, kernels_on=fast)
        for p in ("fp32", "bf16-mixed")
    )
    assert all(p.dtype == torch.float32 for p in mixed.parameters())  # master weights
    # With the kernels on a CPU the bf16-mixed model attends eagerly and the fp32 one with sdpa: float32 through the two
    # differs by ~5e-7. The same attention for both, so that only autocast can make them differ.
    fp32.set_attn_implementation(mixed.config._attn_implementation)
    exact, _ = common.completion_logprobs(fp32, *prompts, completions, torch.tensor([2, 2]))
    autocast, _ = common.completion_logprobs(mixed, *prompts, completions, torch.tensor([2, 2]))
    assert autocast.dtype == torch.float32
    difference = (autocast - exact).abs().max().item()
    # bf16 keeps 8 significant bits, a rounding of up to 2^-9 ≈ 2e-3 of each matmul input: on log-probs of magnitude
    # ~4.6 that is ~1e-3 (measured 1.2e-3 to 1.5e-3), far above float32 noise (~1e-6) and below 0.02
    assert 1e-4 < difference < 0.02


@pytest.mark.parametrize("name", ["tiny", "tiny-gpt2"])
def test_a_bf16_mixed_reference_stores_its_linear_weights_in_bf16_and_scores_bit_for_bit_the_same(
    tokenizer, prompts, name
):
    completions = torch.randint(5, 90, (4, 6), generator=torch.Generator().manual_seed(1))
    args = policy_args(name, fsdp=False)
    policy, reference = models.load_policy(
        args, tokenizer, torch.device("cpu"), "bf16-mixed", False, None, True
    )
    plain = common.frozen_copy(
        policy
    )  # what the reference was: float32 weights, cast by autocast at each forward
    dtypes = {n.split(".")[-2]: p.dtype for n, p in reference.named_parameters()}
    assert torch.bfloat16 in dtypes.values() and torch.float32 in dtypes.values()
    # the embeddings, norms and (tied) output layer compute in float32 under autocast: kept
    assert reference.get_input_embeddings().weight.dtype == torch.float32
    stored, _ = common.completion_logprobs(reference, *prompts, completions, torch.tensor([2, 2]))
    cast, _ = common.completion_logprobs(plain, *prompts, completions, torch.tensor([2, 2]))
    assert torch.equal(stored, cast)
    _, sharded = models.load_policy(
        policy_args(name, fsdp=True), tokenizer, torch.device("cpu"), "bf16-mixed", False, None, True
    )
    assert all(p.dtype == torch.float32 for p in sharded.parameters())  # FSDP shards one dtype a layer


def test_distinct_fraction_per_group_ignores_what_follows_eos():
    eos, pad = 2, 0
    rows = torch.tensor([[5, 6, eos], [5, 6, eos], [7, eos, 9], [7, eos, pad], [8, eos, pad], [5, 6, eos]])
    mask = common.completion_mask(rows, eos)
    # groups of 2: {a, a} -> 1/2, {7, 7 (tokens after EOS differ, ignored)} -> 1/2, {8, a} -> 2/2: mean 2/3
    assert metrics.distinct_fraction(rows, mask, 2) == pytest.approx(2 / 3)
    # the whole batch: distinct {a, 7, 8} = 3 of 6
    assert metrics.distinct_fraction(rows, mask, 6) == pytest.approx(0.5)
    # groups of 4 and 2 (grpo_adaptive.py's ragged groups): {a, a, 7, 7} -> 2/4, {8, a} -> 2/2: mean 3/4
    assert metrics.distinct_fraction(rows, mask, [4, 2]) == pytest.approx(0.75)


def test_metrics_keep_six_significant_digits_not_six_decimals(tmp_path):
    # a warm-up from --lr 1e-6 logs 2e-7 at step 1; rounding to 6 decimal places wrote 0.0
    log = runs.MetricsLog(tmp_path / "metrics.jsonl")
    tracked = []
    log.track = lambda step, metrics: tracked.append(metrics)
    log.write(1, {"lr": 2e-7, "loss": 123456.789, "kl": 0.000123456789, "skipped": 1})
    row = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert (row["lr"], row["loss"], row["kl"], row["skipped"]) == (2e-7, 123457.0, 0.000123457, 1)
    assert tracked[0]["train/kl"] == 0.000123456789  # the trackers get the value itself


@pytest.mark.parametrize("fast", [False, True])
def test_a_minus_infinity_logit_gives_a_finite_entropy_and_gradient(fast):
    # a vocabulary masked with -inf: logits [0, -inf, ln 3] have p = [1/4, 0, 3/4], H = 0.562335 as without it
    logits = torch.tensor([[[0.0, -math.inf, math.log(3.0)]]], requires_grad=True)
    logprobs, entropy = common.token_logprobs(logits, torch.tensor([[2]]), with_entropy=True, kernels_on=fast)
    assert entropy.item() == pytest.approx(0.562335, abs=1e-6) and logprobs.item() == pytest.approx(
        math.log(0.75)
    )
    # an entropy weight above 1 once overflowed a clamp at -3.4e38
    (logprobs + 3.0 * entropy).sum().backward()
    finite = torch.tensor([[[0.0, math.log(3.0)]]], requires_grad=True)
    p = finite.softmax(-1)
    (p.log()[..., 1] - 3.0 * (p * p.log()).sum(-1)).sum().backward()
    assert torch.allclose(logits.grad[..., [0, 2]], finite.grad) and logits.grad[..., 1].item() == 0.0


def test_micro_batch_sums_by_hand():
    """grpo.py's update metrics over 2 micro-batches and μ = 2 iterations: 3 + 1 of the batch's 4 tokens."""
    masks = [torch.tensor([[1.0, 1.0, 1.0]]), torch.tensor([[1.0, 0.0, 0.0]])]
    entropy = [torch.tensor([[0.5, 0.5, 2.0]]), torch.tensor([[4.0, 9.0, 9.0]])]
    sums = stepmetrics.MicroBatchSums(torch.tensor(4.0), iterations=2)
    for iteration, (kl, loss) in enumerate([((0.2, 0.6), (1.0, 3.0)), ((0.4, 1.0), (2.0, 5.0))]):
        for i in range(2):
            token_entropy = entropy[i] if iteration == 0 else None
            sums.add(
                {"kl": kl[i]}, masks[i], torch.tensor(loss[i]), weight=[0.75, 0.25][i], entropy=token_entropy
            )
    totals = sums.totals()
    # kl: iteration 0: 0.2·3/4 + 0.6·1/4 = 0.3; iteration 1: 0.4·3/4 + 1.0·1/4 = 0.55; mean 0.425
    assert totals["kl"] == pytest.approx(0.425)
    # loss by weight: (1·0.75 + 3·0.25 + 2·0.75 + 5·0.25) / 2 = 2.125
    assert totals["loss"] == pytest.approx(2.125)
    # entropy, iteration 0 only: mean(0.5, 0.5, 2) · 3/4 + 4 · 1/4 = 0.75 + 1 = 1.75 (not halved by μ)
    assert totals["entropy"] == pytest.approx(1.75)


def test_minibatch_means_by_hand():
    """ppo.py's minibatch metrics in one process: token means by their share of the minibatch (here all of it)."""
    means = stepmetrics.MinibatchMeans()
    means.add(1.0, {"pg_loss": torch.tensor(2.0, requires_grad=True)}, {"grad_norm": 3.0})
    means.add(1.0, {"pg_loss": torch.tensor(4.0)}, {"grad_norm": 5.0})
    assert means.mean() == {"pg_loss": 3.0, "grad_norm": 4.0}
