"""Fewer kernel launches in the update on CUDA, each giving the numbers of the plain path it replaces.

A 135M model's training step on a GPU is launch-bound, not compute-bound: each of its few thousand kernels costs
microseconds of Python and driver time whatever its size. What is here removes launches without changing a number.
"""

from __future__ import annotations

import torch
import transformers


def matmul_weights_in_bf16(frozen: torch.nn.Module) -> None:
    """A frozen bf16-mixed model's linear layers (GPT-2's Conv1D among them) stored in bfloat16 (the reference's).

    Autocast casts a linear layer's float32 weight to bfloat16 at every forward: one cast kernel per layer, and a
    bfloat16 copy of every weight read and written. It keeps the cast across forwards only for a weight that
    trains (a leaf that requires grad), never for a frozen one. Stored in bfloat16, the weight is what autocast
    would have made of it, so the forward gives the same numbers, bit for bit (tests/test_common.py), for
    less memory and without the casts. Embeddings and norms stay float32, as they compute; an output layer tied to
    the embeddings stays with them."""
    tied = frozen.get_input_embeddings().weight
    for module in frozen.modules():
        if (
            isinstance(module, (torch.nn.Linear, transformers.pytorch_utils.Conv1D))
            and module.weight is not tied
        ):
            module.to(torch.bfloat16)
