"""infra/kernels.py against the plain code in common.py it must equal: values, gradients and sampled tokens, on the
shapes and precisions each kernel serves."""

import math

import pytest
import torch

import common
from infra import kernels
from infra import models
from infra import runs


def plain_and_fast(logits, labels, g, h, **kwargs):
    """(logprobs, entropy, gradient of Σ g·logprobs + h·entropy) from common's plain path and from the kernel."""
    results = []
    for fast in (False, True):
        logits.grad = None
        logprobs, entropy = common.token_logprobs(
            logits, labels, with_entropy=True, kernels_on=fast, **kwargs
        )
        (logprobs * g + entropy * h).sum().backward()
        results.append((logprobs, entropy, logits.grad))
    return results


# ---- token_logprobs --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_token_logprobs_kernel_equals_the_plain_path_in_values_and_gradients(dtype):
    # The kernel's forward and backward are written by hand; common's autograd through log_softmax is the oracle.
    # A non-contiguous view (as completion_logprobs passes), temperature 0.7, one position more than labels.
    torch.manual_seed(0)
    full = (torch.randn(3, 7, 11) * 3).to(dtype).requires_grad_()
    labels, g, h = torch.randint(0, 11, (3, 4)), torch.randn(3, 4), torch.randn(3, 4)
    view = full[:, 1:-1]
    results = []
    for fast in (False, True):
        full.grad = None
        logprobs, entropy = common.token_logprobs(
            view, labels, temperature=0.7, with_entropy=True, kernels_on=fast
        )
        (logprobs * g + entropy * h).sum().backward()
        results.append((logprobs, entropy, full.grad))
    (plain_lp, plain_h, plain_grad), (fast_lp, fast_h, fast_grad) = results
    assert torch.allclose(fast_lp, plain_lp, atol=1e-5) and torch.allclose(fast_h, plain_h, atol=1e-5)
    assert fast_grad.dtype == dtype and torch.allclose(fast_grad.float(), plain_grad.float(), atol=1e-5)
    assert (fast_grad[:, [0, -2, -1]] == 0).all()  # outside the view, and past the labels: no gradient


def test_token_logprobs_kernel_is_the_same_across_slabs():
    torch.manual_seed(0)
    logits, labels = torch.randn(3, 5, 11), torch.randint(0, 11, (3, 5))
    plain, _ = common.token_logprobs(logits, labels)
    for slab in (1, 2, 5):  # slabs of 2 give 2, 2, 1 positions per row
        assert torch.allclose(kernels.token_logprobs(logits, labels, slab=slab)[0], plain, atol=1e-6)


def test_token_logprobs_kernel_with_a_minus_infinity_logit():
    logits = torch.tensor([[[0.0, -math.inf, math.log(3.0)], [1.0, 2.0, -math.inf]]], requires_grad=True)
    (plain_lp, plain_h, plain_grad), (fast_lp, fast_h, fast_grad) = plain_and_fast(
        logits, torch.tensor([[2, 0]]), torch.tensor([[0.5, -1.0]]), torch.tensor([[2.0, 1.0]])
    )
    assert (
        torch.allclose(fast_lp, plain_lp)
        and torch.allclose(fast_h, plain_h)
        and torch.allclose(fast_grad, plain_grad)
    )
    assert torch.isfinite(fast_grad).all()


# ---- sampling on a CPU in bfloat16 --------------------------------------------------------------------------------
NO_BF16_MATMUL = not torch.ops.mkldnn._is_mkldnn_bf16_supported()


@pytest.mark.skipif(NO_BF16_MATMUL, reason="this CPU has no oneDNN bfloat16 matmul")
@pytest.mark.parametrize("lora", [False, True])
@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16-true"])
def test_cpu_bf16_decoding_packs_weights_bit_identically_and_is_undone(tokenizer, prompts, precision, lora):
    model = models.load_model("tiny", len(tokenizer), torch.device("cpu"), precision, seed=0, kernels_on=True)
    assert model.config._attn_implementation == "eager"  # training and scoring (kernels.choose_attention)
    # peft keeps the adapter in float32; under bf16-true it computes in float32, so it must not be packed
    if lora:
        pytest.importorskip("peft")
        model = common.add_lora(model, "tiny", common.LoraOptions(lora_r=4, lora_alpha=8.0))
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:  # B = 0 at the start would hide any error in the adapter's product
                    p.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(1))
    adapters = [m for n, m in model.named_modules() if n.split(".")[-2:-1] in (["lora_A"], ["lora_B"])]
    assert bool(adapters) == lora
    ids, mask = prompts
    with torch.no_grad(), common.autocast(model):
        model.set_attn_implementation("sdpa")
        plain = model(input_ids=ids, attention_mask=mask).logits
        sampled_plain = common._sample(
            model,
            ids,
            mask,
            3,
            8,
            tokenizer.eos_token_id,
            tokenizer.pad_token_id,
            1.0,
            1.0,
            torch.Generator().manual_seed(0),
        )[0]
        model.set_attn_implementation("eager")
        with kernels.cpu_bf16_decoding(model, rows=2):
            packed_layers = [m for m in model.modules() if "forward" in vars(m)]
            base_layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m not in adapters]
            assert set(packed_layers) == set(base_layers + adapters * (precision == "bf16-mixed"))
            assert model.config._attn_implementation == "sdpa"
            packed = model(input_ids=ids, attention_mask=mask).logits
    assert torch.equal(packed, plain)
    sampled = common.sample_completions(
        model,
        ids,
        mask,
        3,
        8,
        tokenizer.eos_token_id,
        tokenizer.pad_token_id,
        generator=torch.Generator().manual_seed(0),
    )
    assert torch.equal(sampled, sampled_plain)
    with pytest.raises(RuntimeError), kernels.cpu_bf16_decoding(model, rows=2):
        raise RuntimeError("sampling failed")
    # nn.Linear.forward again, even after an error
    assert not any("forward" in m.__dict__ for m in model.modules())
    assert model.config._attn_implementation == "eager"
    fp32 = models.load_model("tiny", len(tokenizer), torch.device("cpu"), "fp32", seed=0, kernels_on=True)
    with kernels.cpu_bf16_decoding(fp32, rows=2):  # float32: nothing to gain, nothing changed
        assert (
            not any("forward" in m.__dict__ for m in fp32.modules())
            and fp32.config._attn_implementation == "sdpa"
        )


@pytest.mark.skipif(NO_BF16_MATMUL, reason="this CPU has no oneDNN bfloat16 matmul")
def test_cpu_bf16_decoding_leaves_layers_with_a_forward_of_their_own_alone(tokenizer):
    class QuantizedLinear(torch.nn.Linear):  # as an 8-bit or 4-bit layer: a subclass with its own product
        def forward(self, x):
            return super().forward(x) * 2

    model = models.load_model(
        "tiny", len(tokenizer), torch.device("cpu"), "bf16-true", seed=0, kernels_on=True
    )
    mlp = model.model.layers[0].mlp
    mlp.down_proj = QuantizedLinear(
        mlp.down_proj.in_features, mlp.down_proj.out_features, bias=False, dtype=torch.bfloat16
    )
    hook = lambda x: torch.nn.Linear.forward(mlp.up_proj, x)  # noqa: E731 - as accelerate installs one
    mlp.up_proj.forward = hook
    mlp.gate_proj.float()  # kept in float32 on purpose: it computes in float32
    with kernels.cpu_bf16_decoding(model, rows=2):
        assert (
            "forward" not in vars(mlp.down_proj)
            and mlp.up_proj.forward is hook
            and "forward" not in vars(mlp.gate_proj)
        )
        assert "forward" in vars(model.model.layers[0].self_attn.q_proj)
    assert mlp.up_proj.forward is hook  # restored as it was, not popped


def test_kernels_auto_is_on_for_a_cpu_and_off_for_cuda():
    assert models.resolve_kernels("auto", torch.device("cpu")) and not models.resolve_kernels(
        "auto", torch.device("cuda")
    )
    assert models.resolve_kernels("on", torch.device("cuda")) and not models.resolve_kernels(
        "off", torch.device("cpu")
    )
    with pytest.raises(runs.InputError, match="--kernels must be auto, on or off"):
        models.resolve_kernels("fast", torch.device("cpu"))


def test_a_model_loaded_without_kernels_takes_the_plain_path(tokenizer, prompts, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a kernel ran")

    monkeypatch.setattr(kernels, "token_logprobs", refuse)
    monkeypatch.setattr(kernels, "cpu_bf16_decoding", refuse)
    model = models.load_model("tiny", len(tokenizer), torch.device("cpu"), "bf16-mixed")
    # transformers' default, not kernels.choose_attention's eager
    assert model.config._attn_implementation == "sdpa"
    ids, mask = prompts
    completions = common.sample_completions(
        model, ids, mask, 2, 4, tokenizer.eos_token_id, tokenizer.pad_token_id
    )
    common.completion_logprobs(model, ids, mask, completions, torch.tensor([2, 2]), with_entropy=True)


def test_in_float32_the_kernels_change_no_number(tokenizer, prompts):
    # fp32: the same sampled tokens, and log-probs and entropies equal to float32 rounding, kernels on or off.
    # In bfloat16 they differ by bf16 rounding (eager attention against sdpa), which docs/performance.md states.
    ids, mask = prompts
    results = []
    for kernels_on in (False, True):
        model = models.load_model(
            "tiny", len(tokenizer), torch.device("cpu"), "fp32", seed=0, kernels_on=kernels_on
        )
        generator = torch.Generator().manual_seed(0)
        completions = common.sample_completions(
            model,
            ids,
            mask,
            2,
            6,
            tokenizer.eos_token_id,
            tokenizer.pad_token_id,
            temperature=1.0,
            generator=generator,
        )
        logprobs, entropy = common.completion_logprobs(
            model, ids, mask, completions, torch.tensor([2, 2]), with_entropy=True, temperature=0.7
        )
        results.append((completions, logprobs, entropy))
    (plain_tokens, plain_logprobs, plain_entropy), (fast_tokens, fast_logprobs, fast_entropy) = results
    assert torch.equal(plain_tokens, fast_tokens)
    torch.testing.assert_close(fast_logprobs, plain_logprobs, rtol=0, atol=1e-6)
    torch.testing.assert_close(fast_entropy, plain_entropy, rtol=0, atol=1e-6)
