"""--dataset as a Hugging Face dataset: a save_to_disk folder trains as its JSONL would; GSM8K's fields are
understood; a Hub id that cannot be reached, and a missing `datasets`, are one line each."""

import json
import sys

import pytest

import grpo
import sft
from conftest import args_of, assert_one_line_error, run_script
from infra import hub
from task import tasks
from common import InputError

datasets = pytest.importorskip("datasets")  # optional; .ci/run installs it

GSM8K_ROWS = [
    {
        "question": f"Tom has {n} apples and buys {n + 2} more. How many now?",
        "answer": f"{n} + {n + 2} = {2 * n + 2}\n#### {2 * n + 2}",
    }
    for n in range(20)
]


def save_gsm8k_folder(tmp_path, rows=GSM8K_ROWS, splits=True) -> str:
    folder = tmp_path / "gsm8k"
    dataset = datasets.Dataset.from_list(rows)
    if splits:  # load_dataset's own shape: a DatasetDict with train and test
        dataset = datasets.DatasetDict({"train": dataset, "test": datasets.Dataset.from_list(rows[:2])})
    dataset.save_to_disk(str(folder))
    return str(folder)


def test_gsm8k_fields_become_prompt_answer_and_completion():
    row = {"question": "How many?", "answer": "First 600 + 400 = 1,000.\n#### 1,000"}
    assert hub.task_fields(row) == {
        "prompt": "How many?",
        "answer": "1000",
        "completion": "First 600 + 400 = 1,000.\nThe answer is 1000.",
    }
    # rows that already have the task's fields, or no #### answer, are left as they are
    assert hub.task_fields({"prompt": "p", "answer": "3"}) == {"prompt": "p", "answer": "3"}
    assert hub.task_fields({"question": "q", "answer": "no number marker"}) == {
        "question": "q",
        "answer": "no number marker",
    }


def test_a_save_to_disk_folder_reads_as_rows_of_its_train_split(tmp_path):
    folder = save_gsm8k_folder(tmp_path)
    rows = tasks.read_rows(folder, ("prompt", "answer"))
    assert len(rows) == 20  # the train split, not train + test
    assert rows[3]["prompt"] == GSM8K_ROWS[3]["question"] and rows[3]["answer"] == "8"
    # a folder of prompt / answer rows (an int answer read as text), without splits
    plain = tmp_path / "plain"
    datasets.Dataset.from_list([{"prompt": "What is 2 + 2?", "answer": 4}] * 3).save_to_disk(str(plain))
    assert tasks.read_rows(str(plain), ("prompt", "answer"))[0] == {"prompt": "What is 2 + 2?", "answer": "4"}


def test_a_folder_missing_a_field_names_the_row(tmp_path):
    folder = tmp_path / "bad"
    datasets.Dataset.from_list([{"prompt": "a", "answer": "1"}, {"prompt": "b", "answer": ""}]).save_to_disk(
        str(folder)
    )
    with pytest.raises(InputError, match=r"bad: row 2: field 'answer' missing"):
        tasks.read_rows(str(folder), ("prompt", "answer"))
    with pytest.raises(InputError, match="not-a-dataset"):  # a folder datasets did not write
        (tmp_path / "not-a-dataset").mkdir()
        tasks.read_rows(str(tmp_path / "not-a-dataset"), ("prompt", "answer"))


def test_grpo_and_sft_train_from_a_save_to_disk_folder(tmp_path):
    folder = save_gsm8k_folder(tmp_path)
    grpo.main(
        args_of(
            grpo.Args,
            model="tiny",
            dataset=folder,
            steps=1,
            prompts_per_step=2,
            group_size=2,
            max_new_tokens=4,
            eval_size=2,
            eval_every=0,
            output_dir=str(tmp_path / "grpo"),
        )
    )
    # the held-out tenth of 20 rows, GSM8K's questions with the numbers after ####
    asked = {(row["prompt"], row["answer"]) for row in result_samples(tmp_path / "grpo")}
    assert len(asked) == 2 and asked <= {
        (r["question"], str(int(r["answer"].split("#### ")[1]))) for r in GSM8K_ROWS
    }
    # sft.py needs a completion field: the worked solution, mapped from the same rows
    sft.main(
        args_of(
            sft.Args,
            model="tiny",
            dataset=folder,
            steps=1,
            batch_size=2,
            max_new_tokens=4,
            eval_size=2,
            output_dir=str(tmp_path / "sft"),
        )
    )
    assert len(result_samples(tmp_path / "sft")) == 2


def result_samples(runs_folder) -> list[dict]:
    (eval_json,) = runs_folder.glob("*/eval.json")
    return json.loads(eval_json.read_text())["samples_after"]


def test_an_unreachable_hub_id_is_one_line():
    proc = run_script(
        "grpo.py", "--model", "tiny", "--dataset", "openai/gsm8k", "--steps", "1", HF_HUB_OFFLINE="1"
    )
    assert_one_line_error(
        proc,
        "--dataset openai/gsm8k: no such file or folder here, and the Hugging Face Hub cannot be reached",
    )


def test_without_the_datasets_package_a_folder_is_one_line(tmp_path, monkeypatch):
    folder = save_gsm8k_folder(tmp_path)
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets now raises ImportError
    with pytest.raises(InputError, match="pip install datasets"):
        tasks.read_rows(folder, ("prompt", "answer"))
