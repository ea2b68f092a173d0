"""A compiled decode step, beside the plain sampler a reader reads (common.sample_with_logprobs): the same tokens and
the same sampler log-probs, with the Python overhead of a decode step taken out.

A decode step of a small model is launch-bound on a GPU: SmolLM2-135M's 30 layers are several hundred kernels a
token, each a few microseconds to launch whatever its size, where reading the weights once takes 0.09 ms on an H100.
Here the step is one function, compiled once per bucket of rows (on CUDA with CUDA graphs, torch.compile's
"reduce-overhead"), over a key/value cache of fixed size:
- the prompt is encoded once per prompt as in the plain sampler (eagerly), and its keys and values are copied, G times
  each, into a static cache allocated once for the prompt and every new token;
- the attention mask is the prompt's, followed by ones for every new position (causality masks what is not written
  yet), and the positions and cache positions are computed, not grown, so every step has the same shapes;
- the rows are padded to a multiple of 16, and the prompts on the left to a multiple of 16 columns (masked), so a
  run's batches, of other sizes and prompt lengths, reuse a few compiled graphs;
- the uniforms are drawn as the plain sampler draws them, a (B, 1) tensor a step from the same generator, up front,
  and the generator is rewound to the state the plain sampler leaves (as many draws as steps it took);
- whether every row has finished is asked every `check_every` steps (a host synchronisation), not every token.
The step samples as common.token_from_uniform does (the temperature, the nucleus renormalised, the log-prob of the
distribution drawn from); tests/test_decoding.py checks the tokens and log-probs equal the plain sampler's.

Shapes: P prompts, G samples a prompt, B = P*G rows (padded to R), S prompt tokens, L = S + max_new_tokens.
"""

from __future__ import annotations

import torch
import transformers

import common

# rows are padded to a multiple of this: one compiled graph serves every batch of up to that many rows
BUCKET = 16
# torch.compile's backend for --decode compiled ("eager" runs the same path through dynamo, uncompiled)
BACKEND = "inductor"


class CompiledDecoder:
    """One decode step of `model`, compiled once; `sample(...)` returns what common.sample_with_logprobs does.

    backend: torch.compile's backend ("inductor", or "eager" to test the path without a compiler), None for BACKEND;
    "none" runs the step as plain Python. mode: "reduce-overhead" (CUDA graphs) on CUDA, the default elsewhere.
    """

    def __init__(self, model, backend: str | None = None, check_every: int = 8):
        self.model = model
        self.check_every = check_every
        self.step = self._step
        backend = backend or BACKEND
        if backend != "none":
            on_cuda = next(model.parameters()).device.type == "cuda"
            mode = "reduce-overhead" if on_cuda and backend == "inductor" else None
            self.step = torch.compile(self._step, backend=backend, mode=mode, dynamic=False)

    def _step(self, logits, u, finished, position, cache_position, attention_mask, cache, sampling):
        """Sample a token from each row's logits (B, V), then run it through the model: the token (B,), its log-prob
        (B,), the rows finished (B,) and the next logits (B, V)."""
        temperature, top_p, eos, pad = sampling
        if temperature == 0:
            token = logits.argmax(-1)
            logprob = torch.zeros_like(logits[:, 0])
        else:
            token, logprob = common.token_from_uniform(logits, temperature, top_p, u)
        token = torch.where(finished, pad, token)
        logprob = torch.where(finished, 0.0, logprob)
        finished = finished | (token == eos)
        with common.autocast(self.model):
            out = self.model(
                input_ids=token[:, None],
                attention_mask=attention_mask,
                position_ids=position,
                cache_position=cache_position,
                use_cache=True,
                **{common.CACHE: cache},
            )
        return token, logprob, finished, out.logits[:, -1].float()

    @torch.no_grad()
    def sample(
        self,
        prompt_ids: torch.Tensor,  # (P, S) left-padded
        prompt_mask: torch.Tensor,  # (P, S)
        num_samples: int,
        max_new_tokens: int,
        eos_token_id: int,
        pad_token_id: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        model = self.model
        # the prompts left-padded to a multiple of BUCKET columns (masked: the same positions, the same numbers), so
        # that batches of other prompt lengths reuse the compiled step
        width = -(-prompt_ids.shape[1] // BUCKET) * BUCKET
        prompt_ids = torch.nn.functional.pad(prompt_ids, (width - prompt_ids.shape[1], 0), value=pad_token_id)
        prompt_mask = torch.nn.functional.pad(prompt_mask, (width - prompt_mask.shape[1], 0), value=0)
        P, S = prompt_ids.shape
        B = P * num_samples
        R = -(-B // BUCKET) * BUCKET  # the rows, padded to the bucket
        device = prompt_ids.device
        # the prompt, encoded once a prompt, exactly as the plain sampler encodes it
        with common.autocast(model):
            out = model(
                input_ids=prompt_ids,
                attention_mask=prompt_mask,
                position_ids=common.position_ids(prompt_mask),
                use_cache=True,
                logits_to_keep=1,
            )
        rows = torch.arange(R, device=device).clamp(max=B - 1) // num_samples  # (R,) each row's prompt
        cache = self.static_cache(out[common.CACHE], rows, S + max_new_tokens)
        attention_mask = torch.ones(R, S + max_new_tokens, dtype=prompt_mask.dtype, device=device)
        attention_mask[:, :S] = prompt_mask[rows]
        prompt_lengths = prompt_mask[rows].sum(1, keepdim=True)  # (R, 1)
        logits = out.logits[rows, -1].float()  # (R, V)
        # the plain sampler's draws, a (B, 1) tensor a step; the padding rows get 0
        state = generator.get_state() if generator is not None else torch.random.get_rng_state()
        uniforms = torch.zeros(max_new_tokens, R, 1, device=device)
        if temperature != 0:
            for t in range(max_new_tokens):
                uniforms[t, :B] = torch.rand(B, 1, device=device, generator=generator)
        finished = torch.arange(R, device=device) >= B  # the padding rows count as finished
        sampling = (temperature, top_p, eos_token_id, pad_token_id)
        tokens = []
        logprobs = []
        for t in range(max_new_tokens):
            position = prompt_lengths + t  # (R, 1) the new token's position
            cache_position = torch.full((1,), S + t, device=device)
            token, logprob, finished, logits = self.step(
                logits, uniforms[t], finished, position, cache_position, attention_mask, cache, sampling
            )
            tokens.append(token[:B])
            logprobs.append(logprob[:B])
            if (t + 1) % self.check_every == 0 and bool(finished.all()):
                break
        tokens = torch.stack(tokens, dim=1)  # (B, T')
        logprobs = torch.stack(logprobs, dim=1)
        steps = steps_taken(tokens, eos_token_id)
        # as many draws as the plain sampler made: one a step it took
        if temperature != 0:
            if generator is not None:
                generator.set_state(state)
            else:
                torch.random.set_rng_state(state)
            for _ in range(steps):
                torch.rand(B, 1, device=device, generator=generator)
        return tokens[:, :steps], logprobs[:, :steps]

    def static_cache(self, prompt_cache, rows: torch.Tensor, length: int) -> transformers.StaticCache:
        """A cache of `length` positions for R rows, its first S filled with each row's prompt (prompt_cache's rows
        `rows`): the same keys and values the plain sampler repeats."""
        cache = transformers.StaticCache(config=self.model.config, max_cache_len=length)
        for layer, prompt_layer in zip(cache.layers, prompt_cache.layers):
            keys = prompt_layer.keys[rows]  # (R, heads, S, head_dim)
            values = prompt_layer.values[rows]
            layer.lazy_initialization(keys, values)
            layer.keys[:, :, : keys.shape[2]] = keys
            layer.values[:, :, : values.shape[2]] = values
            layer.cumulative_length.fill_(keys.shape[2])  # where the next token's keys go
        return cache


def steps_taken(tokens: torch.Tensor, eos_token_id: int) -> int:
    """The steps the plain sampler takes for these tokens (B, T): up to the one where the last row emits EOS, or T
    when a row never does."""
    ended = (tokens == eos_token_id).any(1)
    if not bool(ended.all()):
        return tokens.shape[1]
    return int((tokens == eos_token_id).int().argmax(1).max()) + 1
