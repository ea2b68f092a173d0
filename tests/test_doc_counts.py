"""The counts the docs quote are the code's: the tests the README and docs/testing.md say ran, the formula tests, and
the mutation check's entries. A count, not a snapshot of output: a new test or entry without its measurement fails
here until the docs are measured again."""

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "dev"))

import mutation_check  # noqa: E402


def collected(*marks: str) -> int:
    """How many tests pytest collects (with `-m MARK`, those marked so)."""
    output = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", *marks],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return int(re.search(r"(\d+)(?:/\d+)? tests? (?:collected|selected)", output).group(1))


def number(text: str) -> int:
    return int(text.replace(",", ""))


def test_the_quoted_test_counts_are_the_suites():
    readme = (REPO / "README.md").read_text()
    testing = (REPO / "docs" / "testing.md").read_text()
    total = collected()
    formulas = collected("-m", "formula")
    passed, skipped = re.search(r"([\d,]+) pass, ([\d,]+) skip", readme).groups()
    assert number(passed) + number(skipped) == total, (
        "README: the passed and skipped tests are not the suite's"
    )
    assert number(re.search(r"`make formulas`: ([\d,]+) tests", readme).group(1)) == formulas
    passed, skipped = re.search(r"\*\*([\d,]+) passed, ([\d,]+) skipped\*\*", testing).groups()
    assert number(passed) + number(skipped) == total, (
        "docs/testing.md: the fresh clone's count is not the suite's"
    )
    selected, of = re.search(r"([\d,]+) tests selected of ([\d,]+)", testing).groups()
    assert (number(selected), number(of)) == (formulas, total)


def test_the_quoted_mutation_count_is_the_lists():
    testing = (REPO / "docs" / "testing.md").read_text()
    quoted = re.search(r"The list holds \*\*([\d,]+)\*\* entries", testing).group(1)
    assert number(quoted) == len(mutation_check.MUTATIONS)


def test_the_mutation_list_is_data_each_bug_once_aimed_at_a_test_file():
    """The list lives in tests/mutations/*.toml (a file per test file); the runner stays a short program."""
    runner = (REPO / "dev" / "mutation_check.py").read_text()
    assert len(runner.splitlines()) <= 300, (
        "dev/mutation_check.py is the runner: its list belongs in tests/mutations"
    )
    bugs = [(m.file, m.original, m.mutated, m.test_file) for m in mutation_check.MUTATIONS]
    assert len(set(bugs)) == len(bugs), "a mutation is listed twice for one test file"
    assert all((REPO / m.test_file).is_file() and (REPO / m.file).is_file() for m in mutation_check.MUTATIONS)
