"""No script trains on a problem it measures accuracy on, whatever --eval-size says.

Each script runs through main(args_of(Args, ...)) up to the point where its training problems are fixed; a spy
keeps them and stops the run there, so nothing is sampled or trained and the check takes seconds.
"""

import itertools

import pytest
import torch

import dpo
import grpo
import ppo
from task import preferences
import reward_model
import sft
from task import tasks
import variants
from conftest import args_of

EVAL_SIZES = [8, 200, 400, 1000]  # below, at and above the default 200 that the old data excluded
STREAM = 3000  # problems read from an online script's endless training stream (about 1,800 distinct)


class Stop(Exception):
    """Raised by a spy once it has what the script would train on."""


def prompts_trained_on(monkeypatch, run, module, name: str, prompts) -> set[str]:
    """Run the script until it calls module.name, whose result (or arguments) `prompts` turns into the prompts the
    script would train on; then stop it."""
    seen, real = [], getattr(module, name)

    def spy(*args, **kwargs):
        seen.extend(prompts(real, *args, **kwargs))
        raise Stop

    monkeypatch.setattr(module, name, spy)
    with pytest.raises(Stop):
        run()
    return set(seen)


def demonstration_prompts(monkeypatch, run) -> set[str]:
    return prompts_trained_on(
        monkeypatch,
        run,
        sft,
        "load_demonstrations",
        lambda real, *args: [r["prompt"] for rows in real(*args) for r in rows],
    )


def preference_prompts(monkeypatch, run) -> set[str]:
    return prompts_trained_on(
        monkeypatch,
        run,
        preferences,
        "label_samples",
        lambda real, model, tokenizer, problems, *args, **kwargs: [p.prompt for p in problems],
    )


def stream_prompts(monkeypatch, run) -> set[str]:
    return prompts_trained_on(
        monkeypatch,
        run,
        tasks,
        "load_problems",
        lambda real, *args: [p.prompt for p in itertools.islice(real(*args)[0], STREAM)],
    )


SCRIPTS = {  # name: (what it trains on, how many distinct problems at least, main, its Args beyond the defaults)
    "sft": (demonstration_prompts, 2000, sft.main, lambda **kw: args_of(sft.Args, **kw)),
    "dpo": (preference_prompts, 512, dpo.main, lambda **kw: args_of(dpo.Args, **kw)),
    "ipo": (preference_prompts, 512, variants.main, lambda **kw: args_of(variants.Args, algo="ipo", **kw)),
    "rloo": (stream_prompts, 1500, variants.main, lambda **kw: args_of(variants.Args, algo="rloo", **kw)),
    "grpo": (stream_prompts, 1500, grpo.main, lambda **kw: args_of(grpo.Args, **kw)),
    "ppo": (stream_prompts, 1500, ppo.main, lambda **kw: args_of(ppo.Args, reward="verifier", **kw)),
}


@pytest.mark.parametrize("eval_size", EVAL_SIZES)
@pytest.mark.parametrize("script", SCRIPTS)
def test_no_evaluated_problem_is_trained_on(script, eval_size, monkeypatch, preference_cache, tmp_path):
    training_prompts, at_least, main, make_args = SCRIPTS[script]
    args = make_args(model="tiny", eval_size=eval_size, output_dir=str(tmp_path / "runs"))
    trained = training_prompts(monkeypatch, lambda: main(args))
    evaluated = {p.prompt for p in tasks.heldout_problems(eval_size)}
    assert len(trained) >= at_least and len(evaluated) == eval_size
    assert not trained & evaluated, (
        f"{len(trained & evaluated)} of {eval_size} evaluated problems are trained on"
    )


def test_the_reward_models_pairs_avoid_the_default_heldout_problems(monkeypatch, preference_cache, tmp_path):
    # reward_model.py has no --eval-size: its pairs avoid the 200 problems every script evaluates by default.
    args = args_of(reward_model.Args, model="tiny", output_dir=str(tmp_path))
    trained = preference_prompts(monkeypatch, lambda: reward_model.main(args))
    assert len(trained) == 512 and not trained & {p.prompt for p in tasks.heldout_problems()}


def test_default_data_is_the_same_at_any_eval_size_up_to_200():
    """Caches and results made before --eval-size was threaded through stay valid: up to 200 the offline data
    still excludes exactly the default 200 problems, which every larger held-out set starts with."""
    default = tasks.heldout_problems()
    assert all(tasks.heldout_problems(n)[:200] == default for n in (201, 400, 1000))
    # the demonstrations as they were built before: the first distinct problems of the stream without the default 200
    before = list(dict.fromkeys(p.prompt for p in itertools.islice(tasks.train_problems(0, default), 1000)))[
        :300
    ]
    for n in (1, 8, 200):
        assert tasks.training_exclusion(n) == default
        train, heldout = sft.load_demonstrations(None, 300, 0, n)
        assert [r["prompt"] for r in heldout + train] == before
    assert tasks.training_exclusion(400) == tasks.heldout_problems(400)


def test_preference_cache_names_eval_size_only_above_200(
    tokenizer, preference_cache, digits_are_correct, monkeypatch
):
    def build(n: int):
        return preferences.preference_data(
            "tiny", tokenizer, 0, 16, 4, 8, 1.0, torch.device("cpu"), "fp32", eval_size=n
        )

    default, folder = build(200)
    # the name caches were built under
    assert folder.name == "v2-tiny-seed0-prompts16-samples4-tokens8-temp1-fp32"
    # 8 evaluated problems: the same data, so no new sampling
    monkeypatch.setattr(preferences, "label_samples", None)
    assert build(8) == (default, folder)
    sampled = []
    monkeypatch.setattr(preferences, "label_samples", lambda *args, **kwargs: sampled.append(args) or [])
    # the spy samples nothing: no pairs
    with pytest.raises(tasks.InputError, match="no train preference pairs"):
        build(400)
    assert sampled and (preference_cache / "preference-data" / f"{folder.name}-eval400").is_dir()
