"""Mutation check: does the test suite catch the bugs it claims to guard against?

Each mutation is one plausible bug (a flipped sign, a dropped clip branch, the sample std for the population std, the
temperature left out when log-probs are recomputed, ...), kept as data beside the tests that must catch it:
tests/mutations/<test file>.toml. For each, the script copies the repository into a temporary folder, makes the one
textual replacement there, and runs that test file (narrowed by the entry's pytest -k keyword):

    KILLED    the target failed: the tests caught the bug
    SURVIVED  the target passed: the tests do not see this bug (a gap, listed at the end)
    STALE     the original snippet is not in the file exactly once: the mutation must be updated, never skipped
    ERROR     the run neither passed nor failed (time-out, or pytest could not run)

The working tree is never touched. The targets first run on the unmutated copy (one pytest per test file); if one
fails there the check stops (exit status 1), since a kill would mean nothing; otherwise the exit status is 0 whatever
the kill rate. Tests marked `embedded` are never run here. Run from the repository root:
    python dev/mutation_check.py                  # all mutations, one at a time
    python dev/mutation_check.py --list           # the mutations and whether each snippet is found
    python dev/mutation_check.py --only ppo.py --only GAE --jobs 2    # those whose "file: description" holds a text
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[1]
KEYS = {"file", "description", "keyword", "original", "mutated"}


class Mutation(NamedTuple):
    file: str  # path relative to the repository root
    original: str  # must occur exactly once in the file
    mutated: str
    description: str
    test_file: str  # "tests/test_x.py": the tests that should fail
    keyword: str | None  # pytest -k's expression within them, or None for them all

    @property
    def target(self) -> str:
        return f"{self.test_file} -k {shlex.quote(self.keyword)}" if self.keyword else self.test_file


def load_mutations(folder: Path = REPO / "tests" / "mutations") -> list[Mutation]:
    """Every entry of folder/<test file>.toml, the files in name order: its target is that test file, narrowed to
    pytest -k `keyword` when the entry has one."""
    mutations = []
    for path in sorted(folder.glob("*.toml")):
        test_file = f"tests/{path.stem}.py"
        for n, entry in enumerate(tomllib.loads(path.read_text(encoding="utf-8")).get("mutation", []), 1):
            wrong = (set(entry) ^ KEYS) - {"keyword"}
            if wrong:
                raise SystemExit(
                    f"{path.name}, mutation {n}: {sorted(wrong)} missing or unknown (keys: {KEYS})"
                )
            fields = (entry["file"], entry["original"], entry["mutated"], entry["description"])
            mutations.append(Mutation(*fields, test_file, entry.get("keyword")))
    return mutations


MUTATIONS = load_mutations()


def snapshot(dest: Path) -> int:
    """Copy the repository once (.py and .sh files, tests/, data/, pytest.ini; no runs/, hidden folders or caches):
    every mutation starts from this copy, so edits made to the working tree while the check runs cannot mix in."""
    copied = 0
    for folder, subfolders, names in os.walk(REPO):
        subfolders[:] = [d for d in subfolders if not d.startswith(".") and d not in ("runs", "__pycache__")]
        for name in names:
            relative = Path(folder, name).relative_to(REPO)
            if (
                name.endswith((".py", ".sh"))
                or relative.parts[0] in ("tests", "data")
                or name == "pytest.ini"
            ):
                (dest / relative).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO / relative, dest / relative)
                copied += 1
    return copied


def stale_reason(root: Path, m: Mutation):
    """None if the original snippet occurs exactly once in the file under `root`, else why not."""
    path = root / m.file
    if not path.is_file():
        return f"{m.file} does not exist"
    count = path.read_text(encoding="utf-8").count(m.original)
    if count != 1:
        return f"snippet found {count} times in {m.file}" if count else f"snippet not found in {m.file}"
    return None


RUNNING: set = set()  # the pytest processes started and not yet finished, ended on Ctrl-C
STOPPING = threading.Event()  # set on Ctrl-C: no new pytest starts
START_LOCK = threading.Lock()  # a pytest starts entirely before, or entirely after, a Ctrl-C ends them all


def run_pytest(root: Path, target: str, timeout: float):
    """(return code or None on time-out, seconds, output) of `pytest -x -q <target>` run inside `root`."""
    flags = ["-x", "-q", "-p", "no:cacheprovider", "-m", "not embedded", f"--basetemp={root / '.pytest_tmp'}"]
    cmd = [sys.executable, "-m", "pytest", *flags, *shlex.split(target)]
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    start = time.time()
    with START_LOCK:
        if STOPPING.is_set():
            return None, 0.0, "interrupted"
        # its own process group, so a time-out also ends the scripts it starts
        proc = subprocess.Popen(
            cmd,
            cwd=root,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        RUNNING.add(proc)
    try:
        output, _ = proc.communicate(timeout=timeout)
        return proc.returncode, time.time() - start, output
    except subprocess.TimeoutExpired:
        stop(proc)
        output, _ = proc.communicate()
        return None, time.time() - start, output
    except BaseException:  # Ctrl-C: the run is in its own session, so it must be ended here
        stop(proc)
        raise
    finally:
        RUNNING.discard(proc)


def stop(proc: subprocess.Popen) -> None:
    """End one pytest run we started, with the processes it started (its process group)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def first_failure(output: str) -> str:
    """The first test named in pytest's short summary (FAILED or ERROR), without the file."""
    match = re.search(r"^(?:FAILED|ERROR) \S+::(\S+)", output, re.MULTILINE)
    return match.group(1) if match else ""


def baseline_targets(mutations: list[Mutation]) -> dict[str, str]:
    """One pytest target per test file that selects every test the mutations' targets select."""
    keywords: dict[str, set] = {}
    for m in mutations:
        keywords.setdefault(m.test_file, set()).add(m.keyword)
    combined = {}
    for test_file, words in sorted(keywords.items()):
        either = " or ".join(f"({w})" for w in sorted(words - {None}))
        combined[test_file] = test_file if None in words else f"{test_file} -k {shlex.quote(either)}"
    return combined


def check_mutation(base: Path, work: Path, index: int, m: Mutation, timeout: float) -> dict:
    """Copy the snapshot, apply the one replacement, run the target: KILLED, SURVIVED or ERROR."""
    root = work / f"m{index:02d}"
    shutil.copytree(base, root, ignore=shutil.ignore_patterns("__pycache__", ".pytest_tmp"))
    try:
        path = root / m.file
        path.write_text(path.read_text(encoding="utf-8").replace(m.original, m.mutated, 1), encoding="utf-8")
        rc, seconds, output = run_pytest(root, m.target, timeout)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if rc == 1:
        return {"status": "KILLED", "seconds": seconds, "detail": first_failure(output)}
    if rc == 0:
        return {"status": "SURVIVED", "seconds": seconds, "detail": ""}
    why = f"time-out after {timeout:.0f}s" if rc is None else f"pytest exit status {rc}"
    return {"status": "ERROR", "seconds": seconds, "detail": why, "output": output}


def line(index: int, total: int, status: str, m: Mutation, seconds, detail: str = "") -> str:
    secs = f"{seconds:6.1f}s" if seconds is not None else "      -"
    tail = f"  [{detail}]" if detail else ""
    return f"[{index:2d}/{total}] {status:<8} {m.file:<16} {m.description:<78} {secs}{tail}"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    only_help = "only the mutations whose 'file: description' holds TEXT (any case; repeatable)"
    parser.add_argument("--only", action="append", default=[], metavar="TEXT", help=only_help)
    parser.add_argument("--jobs", type=int, default=1, help="mutations run at once (default 1)")
    parser.add_argument("--list", action="store_true", help="print each mutation and whether it is found")
    args = parser.parse_args()

    wanted = [s.lower() for s in args.only] or [""]  # no --only: every mutation
    numbered = [
        (i, m)
        for i, m in enumerate(MUTATIONS, 1)
        if any(w in f"{m.file}: {m.description}".lower() for w in wanted)
    ]
    if not numbered:
        print(f"no mutation matches {args.only}")
        return 0
    total = len(MUTATIONS)

    if args.list:
        reasons = {i: stale_reason(REPO, m) for i, m in numbered}
        for i, m in numbered:
            print(line(i, total, "STALE" if reasons[i] else "ok", m, None, reasons[i] or ""))
            print(f"{'':8}target: {m.target}")
        print(f"{len(numbered)} mutations listed, {sum(r is not None for r in reasons.values())} stale")
        return 0

    with tempfile.TemporaryDirectory(prefix="mutation-check-") as tmp:
        work = Path(tmp)
        base = work / "base"
        copied = snapshot(base)
        print(f"snapshot of {REPO} in {base}: {copied} files")

        results = {}
        for i, m in numbered:
            reason = stale_reason(base, m)
            if reason:
                results[i] = {"status": "STALE", "seconds": None, "detail": reason}
        runnable = [(i, m) for i, m in numbered if i not in results]

        # Every target must pass on the unmutated snapshot, else a kill would mean nothing. The targets
        # of one test file are run together (one pytest start-up per file, not per target).
        baseline = {}  # test file -> seconds
        by_file = baseline_targets([m for _, m in runnable])
        print(f"baseline: the targets of {len(by_file)} test files on the unmutated copy")
        for test_file, target in by_file.items():
            rc, seconds, output = run_pytest(base, target, timeout=1200)
            baseline[test_file] = seconds
            print(f"  {'pass' if rc == 0 else 'FAIL':<4} {seconds:6.1f}s  pytest {target}", flush=True)
            if rc != 0:
                why = "time-out" if rc is None else ("no test matched" if rc == 5 else f"exit status {rc}")
                tail = "\n".join(output.splitlines()[-30:])
                print(
                    f"\nthe targets fail without any mutation ({why}); fix the tests or the targets first:\n{tail}"
                )
                return 1

        print(f"\n{len(runnable)} mutations to run ({len(results)} stale), {args.jobs} at a time")
        lock = threading.Lock()

        def one(item):
            i, m = item
            # its whole file's baseline, twice: a slow machine is not a hang
            timeout = max(180.0, 2 * baseline[m.test_file])
            result = check_mutation(base, work, i, m, timeout)
            if STOPPING.is_set():  # ended by Ctrl-C: neither killed nor survived
                return
            with lock:
                results[i] = result
                print(line(i, total, result["status"], m, result["seconds"], result["detail"]), flush=True)
                if result["status"] == "ERROR":
                    print("\n".join("        " + s for s in result["output"].splitlines()[-15:]), flush=True)

        pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs))
        try:
            list(pool.map(one, runnable))
        except KeyboardInterrupt:
            pool.shutdown(wait=False, cancel_futures=True)
            with START_LOCK:
                STOPPING.set()
                for proc in list(RUNNING):
                    stop(proc)
            print("\ninterrupted: the summary covers the mutations finished so far", flush=True)
        finally:
            pool.shutdown()

    counts = {
        s: sum(r["status"] == s for r in results.values()) for s in ("KILLED", "SURVIVED", "STALE", "ERROR")
    }
    applied = len(results) - counts["STALE"]
    percent = 100.0 * counts["KILLED"] / applied if applied else 0.0
    rest = f"{counts['SURVIVED']} survived, {counts['ERROR']} errors, {counts['STALE']} stale (not counted)"
    print(f"\nkilled {counts['KILLED']} of {applied} mutations ({percent:.0f}%); {rest}")
    for status in ("SURVIVED", "ERROR", "STALE"):
        rows = [(i, MUTATIONS[i - 1]) for i in sorted(results) if results[i]["status"] == status]
        if rows:
            print(f"{status.lower()}:")
            for i, m in rows:
                print(f"  [{i}] {m.file}: {m.description}  (pytest {m.target})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
