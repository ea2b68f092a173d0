"""Run bookkeeping: everything a run needs that is not the algorithm. Skip this file to learn the algorithms.

The option groups every script shares, the command-line entry, bad input as one line, the run folder,
metrics.jsonl and trackers, curves.png, checkpoints and exact --resume, the non-finite guard, and `Run`, which
does it all one call per concern. Nothing here changes a number a loss depends on: without tracking, resume or
curves every training curve is the same. Under torchrun rank 0 alone writes. It imports infra/distributed.py only.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import importlib.util
import json
import os
import re
import resource
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Callable, Literal, Optional

import torch
import transformers
import tyro
from tqdm.auto import tqdm

import common
from common import InputError, require
from infra import distributed
from infra.metrics import MetricsLog, plot_curves
from infra import fsdp

transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()  # "Loading weights", "Writing model shards": only this project's bars


# ---------------------------------------------------------------------------------------------
# The options every script shares; each script's Args holds them as `run` and `lora`, flags unprefixed
# ---------------------------------------------------------------------------------------------
def none_means(meaning: str, metavar: str, default: Optional[str] = None):
    """--help for an Optional option: `--batch-size INT ... (default: None = the whole batch)`, not `{None}|INT`;
    with a default other than None, `(default: 32; None = the whole batch)`."""
    if default is None:
        return tyro.conf.arg(metavar=metavar, help_behavior_hint=f"(default: None = {meaning})")
    return tyro.conf.arg(metavar=metavar, help_behavior_hint=f"(default: {default}; None = {meaning})")


@dataclass
class RunOptions:
    """where it runs, how prompts are shown, and what the run folder keeps"""

    device: Annotated[str, tyro.conf.arg(metavar="{auto,cpu,cuda,cuda:N}")] = "auto"
    """auto: cuda if available"""
    fsdp: bool = False
    """under torchrun, shard weights, gradients and AdamW state over the ranks (FSDP2), for a model too big for one"""
    precision: Literal["auto", "fp32", "bf16-mixed", "bf16-true"] = "auto"
    """auto: bf16-mixed (fp32 weights, bf16 matmuls) on cuda or AVX512-BF16 CPUs, else fp32; bf16-true loses updates"""
    kernels: Literal["auto", "on", "off"] = "auto"
    """infra/kernels.py's faster log-probs and sampling (same numbers in fp32, bf16-rounding apart in bf16): auto = on
    for a CPU, off for CUDA"""
    decode: Literal["plain", "compiled"] = "plain"
    """how the policy samples: plain (common.sample_with_logprobs, token by token in Python) or compiled (one
    compiled decode step over a static cache, infra/decoding.py: the same tokens; it compiles for a few seconds
    first, and on CUDA runs as CUDA graphs); not with --fsdp"""
    prompt_format: Literal["auto", "chat", "plain"] = "auto"
    """chat (the tokenizer's template), plain (`Question: ...\\nAnswer:`, as for gpt2), auto (chat if it has one)"""
    output_dir: str = "runs"
    """the run folder is created inside this directory"""
    save_model: bool = True
    """save the final model (and one at each evaluation) in the run folder"""
    save_every: Annotated[Optional[int], none_means("at each evaluation", "INT")] = None
    """write a full checkpoint (the trained models, optimizers, RNG states, step) every this many steps"""
    resume: Annotated[Optional[str], none_means("a new run", "DIR")] = None
    """continue this run folder from its last checkpoint, exactly (same options; a larger --steps extends it)"""
    report_to: Literal["none", "tensorboard", "wandb"] = "none"
    """also log to TensorBoard or Weights & Biases (pip install tensorboard / wandb; offline without a network)"""


# a script's `run` and `lora`: flat flags (--device), a box of their own in --help
FlatFlags = tyro.conf.OmitArgPrefixes


def option_group(group: type):
    """An Args field holding one of the shared groups (`run`, `lora`), each script its own instance."""
    return dataclasses.field(default_factory=group)


def check_transformers(version: str) -> None:
    """The scripts call activation_checkpointing_enable and is_activation_checkpointing, which came in 5.23."""
    major, minor = (int(part) for part in version.split(".")[:2])
    require(
        (major, minor) >= (5, 23),
        f"transformers {version} is older than the 5.23 these scripts need: pip install -U 'transformers>=5.23,<6'",
    )


def check_options(
    args,
    at_least_one: tuple[str, ...] = (),
    divided_over_ranks: Optional[str] = None,
    one_process_only: tuple = (),
    compiled_decoding: bool = True,
    only_with: Optional[dict[str, tuple[bool, str]]] = None,
) -> None:
    """The checks every script shares, made before anything loads: optimisation numbers, the counts that must be at
    least 1, LoRA, the tracker, the output folder. Under torchrun: the option `divided_over_ranks` (the batch the
    ranks share; None: the script runs in one process only) must divide over them, and no option of
    `one_process_only` may be on. `compiled_decoding`: False where the policy never samples through --decode.
    `only_with`: {option: (whether it acts, "with what")}: an option moved from its default where it would not act is
    refused, naming what it acts with."""
    defaults = {field.name: field.default for field in dataclasses.fields(args)}
    for name, (acts, needs) in (only_with or {}).items():
        require(
            acts or getattr(args, name) == defaults[name], f"--{name.replace('_', '-')} acts only {needs}"
        )
    check_transformers(transformers.__version__)
    require(args.seed >= 0, f"--seed must be >= 0, not {args.seed}")
    pass_k = getattr(args, "pass_k", None) or 0  # None: chosen for the model (tasks.evaluation_for_model)
    require(pass_k >= 0, f"--pass-k must be 0 (off) or a number of samples per problem, not {pass_k}")
    for name in at_least_one:
        require(getattr(args, name) >= 1, f"--{name.replace('_', '-')} must be at least 1")
    ranks = distributed.world_size()
    require(
        ranks == 1 or divided_over_ranks is not None,
        f"{Path(sys.argv[0]).name} does not run under torchrun yet: run it alone",
    )
    batch = getattr(args, divided_over_ranks) if divided_over_ranks else 0
    require(
        batch % ranks == 0,
        f"--{str(divided_over_ranks).replace('_', '-')} {batch} does not divide over {ranks} torchrun ranks",
    )
    for name in one_process_only:
        require(
            ranks == 1 or not getattr(args, name),
            f"--{name.replace('_', '-')} does not run under torchrun yet",
        )
    fsdp.check_options(args, ranks, distributed.under_torchrun(), require)
    require(
        compiled_decoding or args.run.decode == "plain",
        f"--decode compiled speeds a trainer that samples its policy; {Path(sys.argv[0]).name} does not: drop it",
    )
    require(args.lr is None or args.lr > 0, f"--lr must be > 0, not {args.lr}")  # `not >` refuses NaN too
    # a script that samples: its temperature and nucleus
    if hasattr(args, "top_p"):
        require(args.temperature > 0, "--temperature must be > 0 for sampling (evaluation is always greedy)")
        require(0 < args.top_p <= 1, "--top-p must be in (0, 1]")
    require(
        args.max_grad_norm > 0,
        f"--max-grad-norm must be > 0 (a negative one flips the gradient), not {args.max_grad_norm}",
    )
    lora = args.lora
    if lora.lora_r:
        common.import_peft()
        require(
            lora.lora_r > 0 and lora.lora_alpha > 0 and 0 <= lora.lora_dropout < 1,
            f"LoRA needs --lora-r >= 1, --lora-alpha > 0 and --lora-dropout in [0, 1), not {lora.lora_r}, "
            f"{lora.lora_alpha}, {lora.lora_dropout}",
        )
    package = {"tensorboard": "tensorboard", "wandb": "wandb"}.get(args.run.report_to)
    require(
        not package or importlib.util.find_spec(package) is not None,
        f"--report-to {args.run.report_to} needs the {package} package: pip install {package}",
    )
    existing = Path(args.run.output_dir).absolute()
    # created later, with the run folder; its nearest existing parent must take it
    while not existing.exists():
        existing = existing.parent
    require(
        existing.is_dir(),
        f"--output-dir {args.run.output_dir} is not a writable directory (a file is in the way: {existing})",
    )
    try:  # try it: os.access says yes to root on read-only mounts and /proc
        tempfile.TemporaryDirectory(dir=existing).cleanup()
    except OSError as e:
        raise InputError(
            f"--output-dir {args.run.output_dir} is not a writable directory ({e.strerror}: {existing})"
        ) from None


# TRL's names for options these scripts have under their own: a TRL flag is answered with ours, in one line
TRL_NAMES = {
    "--num-generations": "--group-size",
    "--learning-rate": "--lr",
    "--max-completion-length": "--max-new-tokens",
    "--per-device-train-batch-size": "--batch-size",
}
# TRL's GRPO --loss-type values, as --loss-agg here (DAPO's clip-higher is --eps-high 0.28)
TRL_LOSS_TYPES = {
    "bnpo": "--loss-agg token-mean",
    "dapo": "--loss-agg token-mean (DAPO's clip-higher: --eps-high 0.28)",
    "dr_grpo": "--loss-agg seq-mean-token-sum-norm --no-scale-by-std",
}


def cli(main: Callable, args_class) -> dict:
    """The command-line entry: TRL's names refused in one line that names ours (trl_name), then `args_class` parsed
    with tyro and run_main."""
    ours = {field.name for field in dataclasses.fields(args_class)}
    argv = sys.argv[1:]
    for flag, value in zip(argv, [*argv[1:], ""]):
        hint = trl_name(flag.split("=")[0], value, ours)
        if hint:
            _one_line_error(hint)
    return run_main(main, tyro.cli(args_class))


def trl_name(flag, value, ours):
    """The line for a TRL flag (a str, and the value after it) this script has under another name (`ours`: the
    names of its Args' fields), else None."""
    if flag in TRL_NAMES and TRL_NAMES[flag][2:].replace("-", "_") in ours:
        return f"TRL's {flag} is {TRL_NAMES[flag]} here"
    if flag == "--loss-type" and value in TRL_LOSS_TYPES and "loss_agg" in ours:
        return f"TRL's --loss-type {value} is {TRL_LOSS_TYPES[value]} here"
    return None


def run_main(main: Callable, args) -> dict:
    """main(args); an InputError, or running out of memory, becomes one line on stderr and exit status 2, and
    Ctrl-C abandons the current step and names the folder to --resume from (exit status 130). Either way the last
    good checkpoint stays as it was: a save is never left half written."""
    try:
        return main(args)
    except InputError as e:
        _one_line_error(str(e))
    except (torch.OutOfMemoryError, MemoryError) as e:
        _one_line_error(_out_of_memory(e, args))
    except RuntimeError as e:
        if "can't allocate memory" not in str(e):  # the CPU allocator's out of memory is a plain RuntimeError
            raise
        _one_line_error(_out_of_memory(e, args))
    except KeyboardInterrupt:
        print(f"interrupted: the current step was abandoned; {_resume_hint(args)}", file=sys.stderr)
        raise SystemExit(130)


def _one_line_error(message: str) -> None:
    for bar in list(tqdm._instances):  # closed now, or it is redrawn below the error when collected
        bar.close()
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def _out_of_memory(error: BaseException, args) -> str:
    """The line for running out of memory: the options this script has that lower it, those that keep the run
    (--gradient-checkpointing; a micro-batch, which Args names in `resumable_with`) apart from those that change it,
    so a --resume is only offered where it would continue the same run."""
    where = "CUDA" if isinstance(error, torch.OutOfMemoryError) and "CUDA" in str(error) else "the machine"
    resumable = ("gradient_checkpointing", *getattr(args, "resumable_with", ()))
    same = [_lower(name) for name in resumable if hasattr(args, name)]
    changed = [_lower(name) for name in ("batch_size", "max_new_tokens") if hasattr(args, name)]
    changed = [option for option in changed if option not in same]
    if not same + changed:
        return f"out of memory on {where}: free memory, or run on a machine with more"
    saved = _RUN_DIR is not None and (_RUN_DIR / "model" / "trainer_state.pt").exists()
    if saved and same and getattr(args, "resumable", True):
        line = f"out of memory on {where}; continue with --resume {_RUN_DIR} and {_either(same)}"
        if changed:
            line += f", or start again with {_either(changed)} (the run changes)"
        return line
    checkpoint = "no checkpoint was saved yet; " if hasattr(args, "run") and not saved else ""
    return f"out of memory on {where}; {checkpoint}start again with {_either(same + changed)}"


def _lower(name: str) -> str:
    flag = "--" + name.replace("_", "-")
    return flag if name == "gradient_checkpointing" else f"a lower {flag}"


def _either(options: list[str]) -> str:
    """'x', 'x or y', 'x, y or z'."""
    return " or ".join([", ".join(options[:-1]), options[-1]] if len(options) > 1 else options)


def _resume_hint(args) -> str:
    """Where to go on from: the run folder, when it holds a checkpoint and Args say a checkpoint holds the whole run
    (`resumable`, True unless an Args says otherwise)."""
    if not getattr(args, "resumable", True):
        return "a checkpoint of this run does not hold all its state: start again"
    saved = _RUN_DIR is not None and (_RUN_DIR / "model" / "trainer_state.pt").exists()
    if saved:
        return f"continue with --resume {_RUN_DIR}"
    return "no checkpoint was saved yet; nothing to resume"


# ---------------------------------------------------------------------------------------------
# The run folder, metrics, checkpoints
# ---------------------------------------------------------------------------------------------
# The project's cache: the embedded model converted to a checkpoint, and the preference data
CACHE_DIR = Path(os.environ.get("RLHF_CACHE", Path.home() / ".cache" / "minimal-rlhf"))
_RUN_DIR: Optional[Path] = None  # the current run's folder, for the one line printed on Ctrl-C


def make_run_dir(
    output_dir: str, algo: str, model: str, seed: int, args, resume: Optional[str] = None
) -> Path:
    """A new folder runs/<algo>-<model>-<seed>-<time>/ with args.json; with `resume`, that run's folder."""
    global _RUN_DIR
    if resume:
        _RUN_DIR = Path(resume)
        for stale in (_RUN_DIR / "model.tmp", _RUN_DIR / "model.old"):  # left by a save that was killed
            shutil.rmtree(stale, ignore_errors=True)
        return _RUN_DIR
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    name = Path(model).name.removesuffix(".json")  # configs/qwen2.5-0.5b.json -> qwen2.5-0.5b
    if name == "model":  # a checkpoint of this project: runs/sft-smollm2-0-<time>/model -> sft-smollm2
        name = re.sub(r"-\d+-\d{8}-\d{6}(-\d+)?$", "", Path(model).resolve().parent.name)
    base = Path(output_dir) / f"{algo}-{name}-{seed}-{stamp}"
    run_dir = base
    n = 1
    while True:
        try:  # mkdir either creates the folder or fails: two processes never both take one name
            run_dir.mkdir(parents=True)
            break
        except FileExistsError:  # two runs started in the same second
            run_dir = base.with_name(f"{base.name}-{n}")
            n = n + 1
    (run_dir / "args.json").write_text(json.dumps(asdict(args), indent=2) + "\n")
    _RUN_DIR = run_dir
    return run_dir


def load_trainer_state(resume: Optional[str], steps: int) -> Optional[dict]:
    """A run's last checkpoint state (save_checkpoint), checked before any model loads; None for a new run."""
    if not resume:
        return None
    path = Path(resume) / "model" / "trainer_state.pt"
    require(
        path.is_file(),
        f"--resume {resume}: no checkpoint there (expected {path}); it is written at each --save-every step",
    )
    state = torch.load(path, weights_only=True)
    require(
        state["step"] < steps,
        f"--resume {resume}: the run is already at step {state['step']}; pass a larger --steps to extend it",
    )
    # a list of each rank's (rng_states)
    saved_by = len(state["rng"]) if isinstance(state["rng"], list) else 1
    require(
        saved_by == distributed.world_size(),
        f"--resume {resume}: saved by {saved_by} process(es), resumed "
        f"by {distributed.world_size()}; resume it with as many (torchrun --nproc_per_node {saved_by})",
    )
    return state


def check_rewards(rewards: torch.Tensor, step: int, source: str = "reward function") -> None:
    """Stop at a NaN or infinite reward, blaming its source, before it is taken for a loss that needs a lower --lr."""
    if not torch.isfinite(rewards).all():
        raise InputError(
            f"reward became {rewards[~torch.isfinite(rewards)][0].item()} at step {step}: "
            f"the {source} returned a non-finite score"
        )


def progress(steps: int, desc: str, initial: int = 0, leave: bool = True):
    return tqdm(
        total=steps,
        desc=desc,
        initial=initial,
        leave=leave,
        dynamic_ncols=True,
        file=sys.stderr,
        disable=not distributed.is_main(),
    )


def peak_memory_gb(device: torch.device) -> float:
    """Peak GPU memory allocated on CUDA, else the process's peak resident set size."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def save_checkpoint(
    model,
    tokenizer,
    path: Path,
    state: Optional[dict] = None,
    others: Optional[dict] = None,
    weights: Optional[dict] = None,
) -> None:
    """`model` as a save_pretrained folder (`others`, e.g. a critic, in subfolders; `weights[name]`, if given, is one
    of them as whole tensors, gathered from a sharded model) and, for --resume, trainer_state.pt (optimizers,
    schedulers, RNG states, step, data position, evaluations). Written to a temporary folder, then swapped in: an
    interrupted save never replaces a good one, and non-finite weights are never written."""
    models = {"": model, **(others or {})}
    weights = weights or {}
    tensors = [
        t for name, m in models.items() for t in (weights.get(name) or dict(m.named_parameters())).values()
    ]
    require(
        all(torch.isfinite(t).all() for t in tensors),
        f"refusing to save non-finite weights to {path}; the previous checkpoint there is kept",
    )
    tmp, old = path.with_name(path.name + ".tmp"), path.with_name(path.name + ".old")
    shutil.rmtree(tmp, ignore_errors=True)
    # a LoRA model saves its adapter (and heads); never look up its base on the Hub
    for name, m in models.items():
        m.save_pretrained(
            tmp / name,
            **({"save_embedding_layers": False} if hasattr(m, "peft_config") else {}),
            **({"state_dict": weights[name]} if weights.get(name) else {}),
        )
    tokenizer.save_pretrained(tmp)
    if state is not None:
        torch.save(state, tmp / "trainer_state.pt")
    if path.exists():
        path.rename(old)
    tmp.rename(path)
    shutil.rmtree(old, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Run: the bookkeeping of one training run, one call per concern
# ---------------------------------------------------------------------------------------------
class Run:
    """A run's folder, metrics, evaluations, checkpoints and summary; the script keeps the control flow:
    Run(...) after the models load, checkpointed(...) what a checkpoint holds, begin(evaluate) for step 0, then per step
    check_finite, log, evaluate and save_if_due, and finish(...) at the end. `evaluate(step, pass_k)` returns a
    dict; `eval_row` picks its numbers that go into eval.json's list of evaluations."""

    def __init__(
        self,
        args,
        algo: str,
        tokenizer,
        device: torch.device,
        resumed: Optional[dict] = None,
        eval_row: Callable[[dict], dict] = lambda result: {"accuracy": result["accuracy"]},
        accuracy_key: str = "accuracy",
    ):
        self.args = args
        self.algo = algo
        self.tokenizer = tokenizer
        self.device = device
        self.resumed = resumed
        # the bar: begin()'s
        self.eval_row = eval_row
        self.accuracy_key = accuracy_key
        self.bar = None
        self.main = distributed.is_main()  # under torchrun rank 0 alone writes; the others log to nowhere
        made = self.main and make_run_dir(
            args.run.output_dir, algo, args.model, args.seed, args, args.run.resume
        )
        self.dir = Path(distributed.from_main(str(made)))  # rank 0's folder, known to every rank
        self.metrics = (
            MetricsLog(
                self.dir / "metrics.jsonl", resumed["step"] if resumed else 0, args.run.report_to, args
            )
            if self.main
            else MetricsLog(Path(os.devnull))
        )
        self.save_every = args.run.save_every or args.eval_every
        self.last_good = resumed["step"] if resumed else None  # the step of the last checkpoint written
        self.first_step = resumed["step"] + 1 if resumed else 1
        self.evals: list[dict] = resumed["evals"] if resumed else []
        self.before: Optional[dict] = resumed["before"] if resumed else None
        self.flat_steps = 0  # steps whose groups all had equal rewards
        print(f"run folder: {self.dir}")  # rank 0's; under torchrun the others print to nowhere (join_ranks)

    def checkpointed(
        self,
        model,
        generator: Optional[torch.Generator] = None,
        others: Optional[dict] = None,
        extra: Callable[[], dict] = dict,
        **stateful,
    ) -> None:
        """What a checkpoint holds: `model` (and `others`, e.g. a critic), every `stateful` object's state
        (optimizers, schedulers, generators), the RNG states, and `extra()`; restored now when resuming."""
        self.model = model
        self.generator = generator
        self.others = others
        self.extra = extra
        self.stateful = stateful
        # an optimizer's state is gathered with its own model's (--fsdp)
        self.models = {"": model, **(others or {})}
        if self.resumed:
            for name, obj in stateful.items():
                fsdp.load_state(obj, self.resumed[name], self.models)
            distributed.set_rng_states(self.resumed["rng"], generator)

    def begin(self, evaluate: Callable) -> dict:
        """The starting model's evaluation (step 0, with pass@k), or a resumed run's from its checkpoint."""
        start = time.time()
        if self.before is None:
            self.before = evaluate(0, getattr(self.args, "pass_k", 0))
            self.evals.append(self.metrics.write_eval({"step": 0, **self.eval_row(self.before)}))
        self.eval_seconds = time.time() - start
        self.loop_start = time.time()
        self.bar = progress(self.args.steps, self.algo, initial=self.first_step - 1)
        return self.before

    def check_finite(self, value: torch.Tensor, step: int, what: str = "loss") -> None:
        """Stop before a NaN or infinite loss (or gradient norm: a finite loss can still have one) reaches the
        weights, naming the last good checkpoint. Call it before optimizer.step()."""
        if not torch.isfinite(value):
            where = "no checkpoint was saved"
            if self.last_good:
                where = f"the last good checkpoint (step {self.last_good}) is in {self.dir / 'model'}"
            raise InputError(
                f"{what} became {value.item()} at step {step}; stopped without saving it; {where}. Try a lower --lr"
            )

    def log(self, step: int, stats: dict, postfix=None) -> None:
        """One line of metrics.jsonl (and the trackers), and the progress bar: `postfix` a dict of what it shows, or
        a tuple of the names of the stats it shows (those present)."""
        self.metrics.write(step, {**stats, "memory/peak_gb": peak_memory_gb(self.device)})
        self.bar.update(1)
        # a batch whose every group's rewards are equal: every advantage 0, no policy gradient
        if stats.get("frac_reward_zero_std") == 1:
            self.flat_steps += 1
            if self.flat_steps == 1 and self.main:
                self.bar.write(
                    f"step {step}: every group's rewards were equal, so every advantage is 0 and the policy "
                    "gradient is 0 (with a random --model tiny every completion scores 0)"
                )
        if isinstance(postfix, tuple):
            postfix = {name: f"{stats[name]:.4g}" for name in postfix if name in stats}
        self.bar.set_postfix(postfix or {})
        # the expected duration, after
        if self.main and step - self.first_step in (0, 1) and step < self.args.steps:
            # the 1st step, and the 2nd alone
            step_s = time.time() - self.loop_start
            self.loop_start = time.time()
            every = self.args.eval_every
            steps_left = self.args.steps - step
            evals_left = 1 + ((self.args.steps - 1) // every - step // every if every else 0)
            # pass@k: again at the end only
            pass_k_s = min(self.before.get("pass_k_seconds", 0.0), self.eval_seconds)
            left = step_s * steps_left + (self.eval_seconds - pass_k_s) * evals_left + pass_k_s  # seconds
            self.bar.write(
                f"{self.algo}: step {step} took {step_s:.1f} s; about "
                f"{f'{left / 60:.1f} min' if left >= 60 else f'{left:.0f} s'} to go "
                f"(steps: {steps_left}, evaluations: {evals_left})"
            )

    def evaluate(self, step: int, evaluate: Callable) -> None:
        """The held-out evaluation every --eval-every steps (the last step's is finish's)."""
        if self.args.eval_every and step % self.args.eval_every == 0 and step < self.args.steps:
            self.evals.append(self.metrics.write_eval({"step": step, **self.eval_row(evaluate(step, 0))}))
            if self.main:
                plot_curves(self.dir, self.evals, self.accuracy_key)

    def save_if_due(self, step: int) -> None:
        """A full checkpoint every --save-every steps (default: at each evaluation)."""
        if (
            self.args.run.save_model
            and self.save_every
            and step % self.save_every == 0
            and step < self.args.steps
        ):
            self.save(step)

    def save(self, step: int) -> None:
        state = {
            "step": step,
            "rng": distributed.rng_states(self.generator),
            "evals": self.evals,
            **self.extra(),
            "before": self.before,
            **{name: fsdp.state_of(o, self.models) for name, o in self.stateful.items()},
        }
        # --fsdp: from every rank's shard
        weights = {name: fsdp.whole_weights(m) for name, m in self.models.items()}
        if self.main:
            save_checkpoint(
                self.model, self.tokenizer, self.dir / "model", state, others=self.others, weights=weights
            )
        self.last_good = step

    def finish(
        self,
        evaluate: Callable,
        results: Callable[[dict, dict], dict],
        headline: Optional[Callable[[dict, dict], str]] = None,
        last_step: Optional[int] = None,
    ) -> dict:
        """The final evaluation, eval.json, curves.png, the last checkpoint (after eval.json: a failed save, a full
        disk, never loses the results), the merged model with --merge-lora, and the summary. `results(before,
        after)` gives eval.json's own numbers, `headline(before, after)` the summary's line (held-out accuracy before ->
        after if None); `last_step` is the last step trained (PPO's --kl-budget may stop
        early)."""
        self.bar.close()
        last_step = self.args.steps if last_step is None else last_step
        after = evaluate(last_step, getattr(self.args, "pass_k", 0))
        if self.evals[-1]["step"] == last_step:  # a stop right after an evaluation: the final one replaces it
            self.evals.pop()
        self.evals.append(self.metrics.write_eval({"step": last_step, **self.eval_row(after)}))
        samples = (
            {"samples_before": self.before["samples"], "samples_after": after["samples"]}
            if "samples" in after
            else {}
        )
        result = {
            **results(self.before, after),
            "evals": self.evals,
            "steps": self.args.steps,
            "wall_time_s": round(time.time() - self.metrics.start, 1),
            "memory/peak_gb": peak_memory_gb(self.device),
            **samples,
            "run_dir": str(self.dir),
        }
        if self.main:
            (self.dir / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
            plot_curves(self.dir, self.evals, self.accuracy_key)
        if self.args.run.save_model:
            self.save(last_step)
            if self.main and self.args.lora.lora_r and self.args.lora.merge_lora:
                merged = copy.deepcopy(self.model).merge_and_unload()  # a plain from_pretrained checkpoint
                merged.save_pretrained(self.dir / "merged")
                self.tokenizer.save_pretrained(self.dir / "merged")
        self.metrics.close()
        minutes, seconds = divmod(round(result["wall_time_s"]), 60)
        if headline is None:
            line = f"held-out accuracy {self.before['accuracy']:.3f} -> {after['accuracy']:.3f}"
        else:
            line = headline(self.before, after)
        print(
            f"{line}\nwall time {minutes} min {seconds} s; "
            f"peak memory {result['memory/peak_gb']:.2f} GiB\nrun folder {result['run_dir']}"
        )
        if self.flat_steps:
            print(
                f"{self.flat_steps} of {last_step - self.first_step + 1} steps had no reward spread: no policy gradient"
            )
        # under torchrun: every rank done, the group left, the process ended here
        distributed.barrier(leave=True)
        return result
