"""infra/decoding.py, the compiled decode step: the plain sampler's tokens and log-probs, and its generator after."""

import pytest
import torch

import common
import grpo
from conftest import args_of, metrics_of
from infra import decoding
from infra import models
from infra import runs
from task import tasks
from test_grpo import tiny_args


def prompts(tokenizer):
    """Three prompts of 9 tokens, the first left-padded by 3."""
    torch.manual_seed(0)
    ids = torch.randint(5, 90, (3, 9))
    mask = torch.ones_like(ids)
    ids[0, :3] = tokenizer.pad_token_id
    mask[0, :3] = 0
    return ids, mask


def both(
    model, tokenizer, backend: str, eos: int, temperature: float, top_p: float, max_new_tokens: int = 24
):
    """The plain sampler's (ids, log-probs, generator state) and the compiled path's, from the same seed."""
    ids, mask = prompts(tokenizer)
    # a fresh compilation for this model: dynamo does not guard on a module's hooks (favour's, below), so a step
    # compiled for another test's model would be reused without them
    torch._dynamo.reset()
    results = []
    for sample in (common.sample_with_logprobs, decoding.CompiledDecoder(model, backend).sample):
        generator = torch.Generator().manual_seed(1)
        if sample is common.sample_with_logprobs:
            out = sample(
                model,
                ids,
                mask,
                4,
                max_new_tokens,
                eos,
                tokenizer.pad_token_id,
                temperature,
                top_p,
                generator,
            )
        else:
            out = sample(
                ids, mask, 4, max_new_tokens, eos, tokenizer.pad_token_id, temperature, top_p, generator
            )
        results.append((*out, generator.get_state()))
    return results


@pytest.mark.parametrize("arch", ["tiny", "tiny-gpt2"])
@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.7, 0.9), (0.0, 1.0)])
def test_the_compiled_step_draws_the_plain_sampler_s_tokens(arch, temperature, top_p):
    """float32 on a CPU, through dynamo's eager backend: the same tokens, log-probs to float32 rounding (the static
    cache's attention runs over masked columns the plain one does not have), and the generator left as the plain
    sampler leaves it, so the next batch is drawn alike. A step that dropped the temperature or the nucleus's
    renormalisation would change the log-probs at 0.7 and 0.9."""
    tokenizer = models.load_tokenizer(arch)
    model = models.load_model(arch, len(tokenizer), torch.device("cpu"))
    plain, compiled = both(model, tokenizer, "eager", tokenizer.eos_token_id, temperature, top_p)
    assert torch.equal(plain[0], compiled[0])
    torch.testing.assert_close(compiled[1], plain[1], atol=2e-6, rtol=0)
    assert torch.equal(plain[2], compiled[2])


def favour(model, token: int, amount: float) -> None:
    """Add `amount` to `token`'s logit at every position: a tiny random model's EOS made likely."""

    def add(module, inputs, output):
        bias = torch.zeros(output.shape[-1])
        bias[token] = amount
        return output + bias

    model.lm_head.register_forward_hook(add)


def test_rows_that_end_early_end_alike_and_the_generator_is_rewound():
    """Rows end at different steps; the loop stops where the plain one stops (not at the next check, every 8 steps),
    pads after EOS with log-prob 0, and the generator has made exactly the plain sampler's draws."""
    tokenizer = models.load_tokenizer("tiny")
    model = models.load_model("tiny", len(tokenizer), torch.device("cpu"))
    favour(model, tokenizer.eos_token_id, 3.5)
    plain, compiled = both(model, tokenizer, "eager", tokenizer.eos_token_id, 1.0, 1.0)
    ends = (plain[0] == tokenizer.eos_token_id).int().argmax(1)
    assert plain[0].shape[1] < 24 and len(set(ends.tolist())) > 1, "rows should end early, at different steps"
    assert plain[0].shape[1] % 8 != 0, "the stop should fall between two checks"
    assert torch.equal(plain[0], compiled[0])
    torch.testing.assert_close(compiled[1], plain[1], atol=2e-6, rtol=0)
    assert torch.equal(plain[2], compiled[2])


def test_steps_taken_by_hand():
    eos = 2
    assert decoding.steps_taken(torch.tensor([[5, 2, 0, 0], [5, 6, 2, 0]]), eos) == 3
    assert decoding.steps_taken(torch.tensor([[5, 2, 0], [5, 6, 7]]), eos) == 3  # a row never ends
    assert decoding.steps_taken(torch.tensor([[2, 2], [2, 2]]), eos) == 1  # pad == eos, as in gpt2


def test_the_inductor_compiled_step_draws_the_plain_sampler_s_tokens():
    """The compiled code itself (inductor, C++ on a CPU): the same tokens and log-probs."""
    tokenizer = models.load_tokenizer("tiny")
    model = models.load_model("tiny", len(tokenizer), torch.device("cpu"))
    plain, compiled = both(model, tokenizer, "inductor", tokenizer.eos_token_id, 0.7, 0.9, max_new_tokens=12)
    assert torch.equal(plain[0], compiled[0])
    torch.testing.assert_close(compiled[1], plain[1], atol=2e-6, rtol=0)


def test_grpo_with_the_compiled_decoder_is_grpo(tmp_path, monkeypatch):
    """--decode compiled reaches the policy's sampling, training and held-out alike: every number of a tiny run
    equals the plain sampler's (the sampler's log-probs, and so `mismatch/*`, to float32 rounding)."""
    monkeypatch.setattr(decoding, "BACKEND", "eager")
    calls = []
    sample = decoding.CompiledDecoder.sample

    def counted(self, *args, **kwargs):
        calls.append(args[0].shape[0])
        return sample(self, *args, **kwargs)

    monkeypatch.setattr(decoding.CompiledDecoder, "sample", counted)
    runs_of = {}
    for decode in ("plain", "compiled"):
        runs_of[decode] = grpo.main(tiny_args(tmp_path / decode, decode=decode, save_model=False))
        # the compiled run: its 2 training batches and every held-out sampling call; the plain run: none
        assert (len(calls) > 2) == (decode == "compiled")
    rows = {decode: [steady(row) for row in metrics_of(result)] for decode, result in runs_of.items()}
    # the sampler's own log-probs agree to float32 rounding (see above), and so does its gap to the trainer
    for plain, compiled in zip(rows["plain"], rows["compiled"]):
        for key in [k for k in plain if k.startswith("mismatch/")]:
            assert compiled.pop(key) == pytest.approx(plain.pop(key), abs=1e-6)
    assert rows["plain"] == rows["compiled"]
    assert [steady(e) for e in runs_of["plain"]["evals"]] == [steady(e) for e in runs_of["compiled"]["evals"]]


def steady(row: dict) -> dict:
    """A metrics row without its times, speeds and memory."""
    return {k: v for k, v in row.items() if not k.startswith(("time", "tokens_per_second", "memory"))}


def test_compiled_decoding_with_fsdp_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    args = tasks.evaluation_for_model(
        args_of(grpo.Args, model="tiny", output_dir=str(tmp_path), fsdp=True, decode="compiled")
    )
    with pytest.raises(runs.InputError, match="--decode compiled does not run with --fsdp"):
        grpo.check_args(args)
