"""The Hugging Face Hub and names: is it reachable (a 3-second probe), can a name be a Hub id, and `--dataset`
as a Hugging Face dataset: a folder written by `datasets`' save_to_disk, or a Hub id.

`datasets` is optional: it is imported here, and only when such a dataset is asked for. Its rows come back as
dicts, which task/tasks.py checks field by field as it checks a JSONL file's (prompt, answer; prompt, completion;
prompt, chosen, rejected). GSM8K's own fields are understood:
- `question` is the prompt;
- `answer` is a worked solution ending in `#### <number>`: the number is the answer, and the solution, ending
  in "The answer is <number>.", is the completion sft.py trains on.

A Hub id may name its configuration after a colon (`openai/gsm8k:socratic`); without one, the first the
dataset lists is taken and named on stderr. The split is `train` (the held-out problems are a tenth of it,
as for a JSONL file).
"""

from __future__ import annotations

import os
import socket
import sys
import urllib.parse

from common import InputError


def reachable(host: str) -> bool:
    """A 3-second TCP probe: an offline machine fails (or goes offline) at once, not after minutes of retries."""
    try:
        socket.create_connection((host, 443), timeout=3).close()
        return True
    except OSError:
        return False


def hub_reachable() -> bool:
    from huggingface_hub import constants

    return not constants.HF_HUB_OFFLINE and reachable(urllib.parse.urlparse(constants.ENDPOINT).hostname)


def looks_like_a_path(name: str) -> bool:
    # A hub id is "name" or "org/name"; "runs/rm-x/model", "./m", "/abs" or "~/m" can only be paths.
    return (
        name.startswith((".", "/", "~"))
        or name.count("/") > 1
        or (os.sep in name and os.path.isdir(name.split(os.sep)[0]))
    )


def first_line(e: Exception) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def is_hf_dataset(name: str) -> bool:
    """A folder, or what can only be a Hub id (not a file here, not a .jsonl, not shaped like a path)."""
    if os.path.isdir(name):
        return True
    return not os.path.exists(name) and not name.endswith((".jsonl", ".json")) and not looks_like_a_path(name)


def task_fields(row: dict) -> dict:
    """GSM8K's question and `... #### 72` answer as prompt, answer "72" and completion; any other row as it is."""
    if "prompt" in row or "question" not in row or "####" not in str(row.get("answer", "")):
        return row
    solution, _, number = row["answer"].rpartition("####")
    number = number.strip().replace(",", "")  # "1,000" in a few of GSM8K's answers
    return {
        "prompt": row["question"],
        "answer": number,
        "completion": f"{solution.strip()}\nThe answer is {number}.",
    }


def load_rows(name: str) -> list[dict]:
    """The train split's rows of a save_to_disk folder or a Hub dataset, GSM8K's mapped; any failure is one line."""
    try:
        import datasets
    except ImportError:
        raise InputError(
            f"--dataset {name}: a folder or a Hub id is read with the datasets package: pip install datasets"
        ) from None
    try:
        if os.path.isdir(name):
            loaded = datasets.load_from_disk(name)
        else:
            loaded = load_from_hub(datasets, name)
    except (OSError, ValueError) as e:
        raise InputError(f"--dataset {name}: {first_line(e)}") from None
    if isinstance(loaded, datasets.DatasetDict):
        if "train" not in loaded:
            raise InputError(f"--dataset {name}: no train split (it has {', '.join(loaded)})")
        loaded = loaded["train"]
    return [task_fields(dict(row)) for row in loaded]


def load_from_hub(datasets, name: str):
    repo, _, config = name.partition(":")
    if not hub_reachable():
        raise InputError(
            f"--dataset {name}: no such file or folder here, and the Hugging Face Hub cannot be reached from this "
            "machine to load it as a dataset id (give a JSONL file, or a folder written by save_to_disk)"
        )
    if not config:
        configs = datasets.get_dataset_config_names(repo)
        config = configs[0]
        if len(configs) > 1:
            print(f"note: --dataset {repo}: configuration {config} of {', '.join(configs)}", file=sys.stderr)
    return datasets.load_dataset(repo, config)
