"""Optional speed, the same numbers: reached from common.py only, one visible seam per kernel.

Each kernel here has a plain version in common.py that it must equal, and that is its test oracle
(tests/test_kernels.py: values, gradients, sampled tokens, on the shapes and precisions it serves).
`--kernels auto` turns them on for a CPU and off for CUDA, so on the target GPU the code a reader
reads in common.py is the code that runs. Skip this file to learn the algorithms.

- token_logprobs: log-probs and entropy with a hand-written forward and backward, slab by slab. On a
  CPU a fresh large tensor costs more in page faults than in arithmetic: at GRPO's sizes (32 × 31 ×
  49,152 bfloat16 logits) the log-prob, its gradient and the entropy took 1.2-2.8 s through autograd,
  0.19-0.26 s here.
- choose_attention / cpu_bf16_decoding: on a CPU in bfloat16, eager attention for training and scoring,
  flash attention and weights packed once for oneDNN while sampling.
"""

from __future__ import annotations

import contextlib
from typing import Optional

import torch


# ---------------------------------------------------------------------------------------------
# Log-probs and entropy, slab by slab (plain version: common.token_logprobs)
# ---------------------------------------------------------------------------------------------
def _slabs(B: int, T: int, width: int):
    """(b, positions) pieces of the first T positions of a (B, T', V) tensor, each (at most width, V)."""
    return [(b, slice(s, min(s + width, T))) for b in range(B) for s in range(0, T, width)]


class _TokenLogprobs(torch.autograd.Function):
    """log p(y) and H(p), p = softmax(logits / temperature), in float32, a slab of positions at a time.

    Forward and backward are written out so that neither holds a float32 (B, T, V) tensor: autograd
    through logsumexp would save a float32 copy of the logits and allocate several more, and on a CPU
    allocating them (page faults) costs more than the arithmetic. Every slab reuses the same two
    float32 buffers. Saved: the logits as they are, and logsumexp and entropy per position. With
    z = logits / τ and log p_k = z_k - logsumexp(z):
        ∂ log p_y / ∂z_k = 1[k = y] - p_k           ∂H / ∂z_k = -p_k (log p_k + H)
    """

    @staticmethod
    def forward(ctx, logits, labels, temperature: float, with_entropy: bool, slab: int):
        (B, _, V) = logits.shape
        T = labels.shape[1]
        width = slab or max(1, 2**20 // V)
        z_buffer = logits.new_empty(min(width, T), V, dtype=torch.float32)
        e_buffer = torch.empty_like(z_buffer)
        logprobs = logits.new_empty(B, T, dtype=torch.float32)
        lse = logits.new_empty(B, T, dtype=torch.float32)
        entropy = torch.zeros_like(lse)
        for b, t in _slabs(B, T, width):
            z = z_buffer[: t.stop - t.start].copy_(logits[b, t]).div_(temperature)  # (t, V)
            top = z.amax(-1, keepdim=True)  # (t, 1)
            e = torch.sub(z, top, out=e_buffer[: len(z)]).exp_()  # (t, V) exp(z - max): no overflow
            total = e.sum(-1)  # (t,)
            lse[b, t] = top.squeeze(-1) + total.log()
            logprobs[b, t] = z.gather(-1, labels[b, t, None]).squeeze(-1) - lse[b, t]
            # H = logsumexp(z) - Σ_k p_k z_k; a -inf logit has p_k z_k = 0, not 0 · -inf = NaN
            if with_entropy:
                entropy[b, t] = lse[b, t] - e.mul_(z.clamp_(min=torch.finfo(z.dtype).min)).sum(-1) / total
        ctx.save_for_backward(logits, labels, lse, entropy)
        ctx.temperature = temperature
        ctx.width = width
        ctx.set_materialize_grads(False)
        return logprobs, (entropy if with_entropy else None)

    @staticmethod
    def backward(ctx, grad_logprobs, grad_entropy):
        logits, labels, lse, entropy = ctx.saved_tensors
        (B, _, V) = logits.shape
        T = labels.shape[1]
        grad = torch.empty_like(logits)
        grad[:, T:] = 0  # positions past the labels predict nothing
        g = grad_logprobs if grad_logprobs is not None else lse.new_zeros(B, T)
        z_buffer = logits.new_empty(min(ctx.width, T), V, dtype=torch.float32)
        w_buffer = torch.empty_like(z_buffer)
        for b, t in _slabs(B, T, ctx.width):
            log_p = z_buffer[: t.stop - t.start].copy_(logits[b, t]).div_(ctx.temperature)
            log_p.sub_(lse[b, t, None])  # (t, V)
            # a -inf logit: p_k = 0 still (exp(-1e4) is 0), and a zero gradient, not 0 · inf
            log_p.clamp_(min=-1e4)
            weight = g[b, t, None]  # (t, 1)
            if grad_entropy is not None:  # g + h (log p_k + H)
                weight = torch.add(log_p, entropy[b, t, None], out=w_buffer[: len(log_p)])
                weight.mul_(grad_entropy[b, t, None]).add_(g[b, t, None])
            dz = log_p.exp_().mul_(weight).neg_()  # (t, V) -p_k (g + h (log p_k + H))
            dz.scatter_add_(-1, labels[b, t, None], g[b, t, None])  # + g 1[k = y]
            grad[b, t] = dz.div_(ctx.temperature)
        return grad, None, None, None, None


def token_logprobs(
    logits: torch.Tensor,
    labels: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
    slab: int = 0,
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """common.token_logprobs, the same numbers, a slab of positions at a time (`slab` of them, 0 = about 2^20
    logits), never holding a full (B, T, V) float32 tensor. Pass a model's logits whole: slicing off its last
    position would cost a (B, T', V) zero-filled gradient."""
    return _TokenLogprobs.apply(logits, labels, temperature, with_entropy, slab)


# ---------------------------------------------------------------------------------------------
# Attention and matmuls on a CPU in bfloat16 (plain version: transformers' default sdpa, nn.Linear)
# ---------------------------------------------------------------------------------------------
def choose_attention(model, device: torch.device, precision: str) -> None:
    """Eager attention for training and scoring on a CPU computing in bfloat16. PyTorch's CPU flash-attention
    kernel is slow in bfloat16: at GRPO's sizes its backward took 40 ms a layer against 12 ms for matmul +
    float32 softmax ("eager"), 0.85 s of a 5 s training step. Sampling switches back to flash attention
    in cpu_bf16_decoding: with one query a row, it is the faster one."""
    if device.type == "cpu" and precision != "fp32":
        model.set_attn_implementation("eager")


@contextlib.contextmanager
def cpu_bf16_decoding(model, rows: int):
    """Sampling's fast path on a CPU computing in bfloat16, the same tokens; elsewhere (CUDA, float32) it does nothing.

    Decoding multiplies `rows` rows by every weight once per token, against a key/value cache. Here:
    - flash attention (sdpa) instead of choose_attention's eager attention: 0.8 s of a 3.4 s GRPO sampling;
    - every nn.Linear multiplies by a bfloat16 copy of its weight laid out once in oneDNN's blocked
      format, where a plain matmul re-blocks it on every call: the product is bit-identical (the
      tests check it) and the decode step's matmuls 30 % faster, 13 % of a GRPO sampling (where
      oneDNN has bfloat16 matmuls: x86 CPUs with AVX512-BF16 or AMX).
    Inference only: the packed product has no gradient.
    """
    bf16 = getattr(model, "bf16_mixed", False) or next(model.parameters()).dtype == torch.bfloat16
    on_cpu = next(model.parameters()).device.type == "cpu"
    if not (bf16 and on_cpu):
        yield
        return
    attention = model.config._attn_implementation
    packs = torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    autocast_on = getattr(model, "bf16_mixed", False)
    linears = [m for m in model.modules() if _packable(m, autocast_on)] if packs else []
    try:
        model.set_attn_implementation("sdpa")
        for linear in linears:
            weight = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach().to(torch.bfloat16), rows)
            bias = None if linear.bias is None else linear.bias.detach().to(torch.bfloat16)
            linear.forward = lambda x, weight=weight, bias=bias: torch.ops.mkldnn._linear_pointwise(
                x.to(torch.bfloat16), weight, bias, "none", [], ""
            )
        yield
    finally:
        for linear in linears:
            linear.__dict__.pop("forward", None)  # back to nn.Linear.forward
        model.set_attn_implementation(attention)


def _packable(module: torch.nn.Module, autocast_on: bool) -> bool:
    """A layer whose packed bfloat16 product equals its own: a plain nn.Linear (not a subclass with its own
    forward, such as an 8-bit or 4-bit layer), with no forward of its own already installed (accelerate's
    hooks), that computes in bfloat16: under autocast, or with bfloat16 weights. A float32 Linear under
    bf16-true, as peft keeps a LoRA adapter, computes in float32 and is left as it is."""
    return (
        type(module).forward is torch.nn.Linear.forward
        and "forward" not in vars(module)
        and (autocast_on or module.weight.dtype == torch.bfloat16)
    )
