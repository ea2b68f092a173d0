"""LoRA in every script: the reference is the base with the adapter off, only adapters (and heads) train,
checkpoints load again (as an adapter for --resume, merged for everything else)."""

import copy
import json
import os

import pytest
import torch

import common
from infra import models
from infra import runs
from task import preferences, tasks
from conftest import PAIRS, args_of, assert_resume_is_exact, digit_fraction, metrics_of

pytest.importorskip("peft")
LORA = common.LoraOptions(lora_r=4, lora_alpha=8.0)


def logprobs(model, tokenizer, prompts, completion_ids):
    ids, mask = tasks.tokenize_prompts(tokenizer, prompts, "cpu")
    return common.completion_logprobs(
        model, ids, mask, completion_ids, torch.ones(len(prompts), dtype=torch.long)
    )[0]


@pytest.mark.parametrize("arch", ["tiny", "tiny-gpt2"])
def test_the_reference_is_the_untouched_base_with_the_adapter_off(tokenizer, arch):
    base = models.load_model(arch, len(tokenizer), torch.device("cpu"))
    untouched = copy.deepcopy(base)
    policy = common.add_lora(base, arch, LORA)
    prompts = ["What is 3 + 4?", "What is 12 + 45?"]
    completion_ids = torch.tensor([[40, 41, 2], [42, 2, 0]])
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(3):  # move the adapter away from B = 0
        optimizer.zero_grad()
        logprobs(policy, tokenizer, prompts, completion_ids).sum().backward()
        optimizer.step()
    with torch.no_grad(), common.reference(policy) as ref:
        reference = logprobs(ref, tokenizer, prompts, completion_ids)
    with torch.no_grad():
        torch.testing.assert_close(
            reference, logprobs(untouched, tokenizer, prompts, completion_ids), atol=1e-6, rtol=0
        )
        # the adapter is back on
        assert not torch.allclose(logprobs(policy, tokenizer, prompts, completion_ids), reference, atol=1e-3)


@pytest.mark.parametrize("head", ["lm", "score"])
def test_only_adapters_and_the_score_head_are_trained(tokenizer, head):
    model = common.add_lora(
        models.load_model("tiny", len(tokenizer), torch.device("cpu"), head=head), "tiny", LORA
    )
    ids = torch.tensor([[5, 6, 7, 8]])
    out = model(input_ids=ids).logits
    out.sum().backward()
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trained and all("lora_" in n or (head == "score" and "score" in n) for n in trained)
    # the whole head, not an adapter on it
    assert any("score" in n and "lora_" not in n for n in trained) == (head == "score")
    assert all(p.grad is None for n, p in model.named_parameters() if n not in trained)
    assert any(
        p.grad is not None and p.grad.abs().sum() > 0 for n, p in model.named_parameters() if "lora_B" in n
    )


def test_every_script_trains_with_lora_and_its_checkpoints_load(tmp_path):
    import dpo
    import grpo
    import ppo
    import reward_model
    import sft
    import variants

    small = dict(model="tiny", steps=2, lora_r=4, lora_alpha=8.0)
    rm = reward_model.main(
        args_of(reward_model.Args, **small, dataset=PAIRS, batch_size=4, output_dir=str(tmp_path / "rm"))
    )
    small["eval_size"] = 4
    rm_path = os.path.join(rm["run_dir"], "model")
    runs = [
        sft.main(
            args_of(
                sft.Args,
                **small,
                num_demonstrations=20,
                batch_size=4,
                max_new_tokens=4,
                output_dir=str(tmp_path / "sft"),
            )
        ),
        dpo.main(
            args_of(
                dpo.Args,
                **small,
                dataset=PAIRS,
                batch_size=4,
                max_new_tokens=4,
                precompute_ref_logprobs=False,
                output_dir=str(tmp_path / "dpo"),
            )
        ),
        variants.main(
            args_of(
                variants.Args,
                algo="kto",
                **small,
                dataset=PAIRS,
                batch_size=4,
                max_new_tokens=4,
                output_dir=str(tmp_path / "kto"),
            )
        ),
        variants.main(
            args_of(
                variants.Args,
                algo="rloo",
                **small,
                batch_size=2,
                max_new_tokens=4,
                output_dir=str(tmp_path / "rloo"),
            ),
            reward_fn=digit_fraction,
        ),
        grpo.main(
            args_of(
                grpo.Args,
                **small,
                prompts_per_step=2,
                group_size=2,
                max_new_tokens=4,
                beta=0.1,
                merge_lora=True,
                output_dir=str(tmp_path / "grpo"),
            ),
            reward_fn=digit_fraction,
        ),
        ppo.main(
            args_of(
                ppo.Args,
                **small,
                reward_model=rm_path,
                batch_size=2,
                minibatch_size=2,
                max_new_tokens=4,
                output_dir=str(tmp_path / "ppo"),
            )
        ),
        rm,
    ]
    for result in runs:
        assert os.path.exists(os.path.join(result["run_dir"], "model", "adapter_config.json")), result[
            "run_dir"
        ]
        # no NaN
        assert all(all(v == v for v in row.values() if isinstance(v, float)) for row in metrics_of(result))
    assert (
        json.loads(open(os.path.join(rm_path, "adapter_config.json")).read())["base_model_name_or_path"]
        == "tiny"
    )
    # PPO's critic: its own adapter
    assert os.path.exists(os.path.join(runs[5]["run_dir"], "model", "critic", "adapter_config.json"))
    # --merge-lora: a plain checkpoint that gives the same log-probs as the adapter loaded onto its base
    tokenizer = models.load_tokenizer("tiny")
    merged = models.load_model(
        os.path.join(runs[4]["run_dir"], "merged"), len(tokenizer), torch.device("cpu")
    )
    from_adapter = models.load_model(
        os.path.join(runs[4]["run_dir"], "model"), len(tokenizer), torch.device("cpu")
    )
    prompts, completion_ids = ["What is 1 + 2?"], torch.tensor([[40, 41, 2]])
    with torch.no_grad():
        torch.testing.assert_close(
            logprobs(merged, tokenizer, prompts, completion_ids),
            logprobs(from_adapter, tokenizer, prompts, completion_ids),
        )


def test_a_lora_reward_model_trained_at_any_seed_reloads_onto_its_own_base(tmp_path, tokenizer):
    import reward_model

    args = args_of(
        reward_model.Args,
        model="tiny",
        seed=3,
        steps=2,
        lora_r=4,
        lora_alpha=8.0,
        dataset=PAIRS,
        batch_size=4,
        output_dir=str(tmp_path),
    )
    result = reward_model.main(args)
    loaded = models.load_reward_model(
        os.path.join(result["run_dir"], "model"), tokenizer, torch.device("cpu")
    )
    _, heldout_pairs, _ = preferences.load_preference_pairs(
        PAIRS, "tiny", tokenizer, 3, 0, 0, 0, 1.0, "cpu", "fp32"
    )
    with torch.no_grad():
        again = reward_model.evaluate(loaded, tokenizer, heldout_pairs, [], args.max_completion_tokens)
    # as it scored when trained
    assert again["eval/margin"] == pytest.approx(result["evals"][-1]["eval/margin"], abs=1e-5)


def test_resume_with_lora_continues_exactly(tmp_path):
    import grpo

    def make_args(out, **kw):
        return args_of(
            grpo.Args,
            model="tiny",
            prompts_per_step=2,
            group_size=2,
            max_new_tokens=4,
            eval_size=4,
            eval_every=2,
            beta=0.1,
            lora_r=4,
            lora_alpha=8.0,
            lr=1e-2,
            output_dir=str(out),
            **kw,
        )

    assert_resume_is_exact(
        tmp_path, grpo.main, make_args, weights_file="adapter_model.safetensors", reward_fn=digit_fraction
    )


def test_without_peft_lora_is_one_line_before_anything_loads(tmp_path, monkeypatch):
    import builtins

    import grpo

    real_import = builtins.__import__
    monkeypatch.setattr(
        builtins,
        "__import__",
        lambda name, *a, **k: (
            (_ for _ in ()).throw(ImportError(name)) if name == "peft" else real_import(name, *a, **k)
        ),
    )
    with pytest.raises(runs.InputError, match=r"^--lora-r needs the peft package: pip install peft$"):
        runs.check_options(args_of(grpo.Args, lora_r=4, output_dir=str(tmp_path)))
