"""Helpers shared by the tests: tiny trainer runs (overrides, offline data), reading a run's loss
curve and log, starting local multi-process runs. Test code only: nothing in the product imports
it, and the `python -m train.main` processes the tests start get their data built here first.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

from launch.local import run_processes
from train.metrics import read_jsonl

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root

# The line train.main logs at the end of a run (train/compilation_cache.py CacheStats.summary).
_CACHE_STATS = re.compile(
    r"XLA compilation cache: (\d+) hits, (\d+) misses \(\d+ of (\d+) programs loaded from the "
    r"cache, \d+ compiled, (\d+) written\)"
)


def compilation_cache_counts(output: str) -> dict[str, int]:
    """hits / misses / requests / writes from a `python -m train.main` process's log output."""
    found = _CACHE_STATS.findall(output)
    if len(found) != 1:
        raise AssertionError(f"expected one compilation cache summary line, got {found}")
    return dict(zip(("hits", "misses", "requests", "writes"), map(int, found[0])))


def run_overrides(experiment, data_dir, out_dir, name, cache_dir) -> list[str]:
    """What every tiny test run sets: its experiment, folders, per-step logs, no wandb, no bar,
    the XLA compilation cache off unless a test asks for one (a test run must never write into
    the real ~/.cache), and glibc's default malloc (run.cpu_heap)."""
    return [
        f"+experiment={experiment}",
        f"run.name={name}",
        f"run.out_dir={out_dir}",
        f"data.path={data_dir}",
        "trainer.log_interval=1",
        "trainer.progress_bar=false",
        "logging.wandb=disabled",
        f"run.compilation_cache_dir={cache_dir or 'null'}",
        "run.cpu_heap=false",  # a few steps: compiling with one malloc arena would cost more
    ]


def tiny_gpt_overrides(
    data_dir: str, out_dir: str, name: str, steps: int = 8, cache_dir: str | None = None
) -> list[str]:
    """gpt_shakespeare_char_tiny shrunk to seconds: 2 layers x 32, block 32, batch 8.

    `cache_dir`: the XLA compilation cache of `python -m train.main` runs (None = off)."""
    return [
        *run_overrides("gpt_shakespeare_char_tiny", data_dir, out_dir, name, cache_dir),
        "data.sample_tokens=0",
        "model.n_layer=2",
        "model.n_head=2",
        "model.n_embd=32",
        "model.block_size=32",
        "model.dropout=0.1",  # exercises the dropout RNG stream (checkpointed, sharded)
        "trainer.global_batch_size=8",
        f"optim.max_iters={steps - 1}",
        f"optim.lr_decay_iters={steps - 1}",
        "optim.warmup_iters=2",
        "trainer.eval_interval=0",
        "data.eval_iters=2",
    ]


def losses(run_dir: str, key: str = "train/loss") -> dict[int, float]:
    """step -> value from <run_dir>/metrics.jsonl; a step logged twice (killed, then resumed)
    keeps its LAST record, i.e. the value of the run that carried on."""
    out = {}
    for r in read_jsonl(os.path.join(run_dir, "metrics.jsonl")):
        if key in r:
            out[r["step"]] = r[key]
    return out


_SYLLABLES = "ka lo mi ne ru sa te vo bri dan fel gor hu jin".split()
_NAMES = ("ALDA", "BRUN", "CORIN", "DESS")


def synthetic_text(n_chars: int = 60_000, seed: int = 0) -> str:
    """A made-up play of `n_chars` characters, a stand-in for tiny-shakespeare in tests.

    Speeches (a "NAME:" line, lines of words, a blank line) of words built from a few syllables,
    with capitals and punctuation: 47 distinct characters (tiny-shakespeare has 65) and enough
    structure that a tiny GPT's loss falls. A 32-bit linear congruential generator makes every
    choice, so the text is the same on every machine and Python or NumPy version."""
    state = seed & 0xFFFFFFFF

    def pick(n: int) -> int:
        nonlocal state
        state = (1664525 * state + 1013904223) & 0xFFFFFFFF
        return (state >> 8) % n

    parts: list[str] = []
    size = 0
    while size < n_chars:
        speech = [_NAMES[pick(len(_NAMES))] + ":\n"]
        for _ in range(1 + pick(3)):
            words = []
            for w in range(3 + pick(6)):
                word = "".join(_SYLLABLES[pick(len(_SYLLABLES))] for _ in range(1 + pick(3)))
                words.append(word.capitalize() if w == 0 else word)
            speech.append(" ".join(words) + ".,;!?"[pick(5)] + "\n")
        speech.append("\n")
        parts.append("".join(speech))
        size += len(parts[-1])
    return "".join(parts)[:n_chars]


def build_tiny_text(dest: str, input_path: str | None = None) -> str:
    """data.shakespeare_char from a local input.txt (no download); without one, from
    `synthetic_text()` written to <dest>/input.txt, so tests need no data set."""
    if not os.path.exists(os.path.join(dest, "train.bin")):
        from data.shakespeare_char import build

        if input_path is None:
            os.makedirs(dest, exist_ok=True)
            input_path = os.path.join(dest, "input.txt")
            with open(input_path, "w", encoding="utf-8") as f:
                f.write(synthetic_text())
        build(dest, input_path=input_path)
    return dest


def tiny_trm_overrides(
    data_dir: str, out_dir: str, name: str, epochs: int = 2, cache_dir: str | None = None
) -> list[str]:
    """trm_sudoku_tiny shrunk to seconds: batch 16, 2 upstream iterations of 1 epoch each.

    `cache_dir`: the XLA compilation cache of `python -m train.main` runs (None = off)."""
    return [
        *run_overrides("trm_sudoku_tiny", data_dir, out_dir, name, cache_dir),
        "model.hidden_size=16",
        "model.puzzle_emb_ndim=16",
        "trainer.global_batch_size=16",
        f"data.epochs={epochs}",
        "data.eval_interval_epochs=1",
        "optim.lr_warmup_steps=2",
    ]


def build_tiny_sudoku(dest: str) -> str:
    """40 easy train grids (x2 augmentations) + 16 test grids, offline, in a few seconds."""
    if not os.path.exists(os.path.join(dest, "train", "dataset.json")):
        from data.sudoku_easy import build_easy_sudoku

        build_easy_sudoku(dest, train=40, test=16, blanks=8, num_aug=1, seed=0)
    return dest


# the test session's compilation cache of its child processes (tests/conftest.py)
_CACHE_VARS = ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS")


def without_session_cache(env=None) -> dict:
    """`env` (default this process's) without the test session's compilation cache: for a child
    process whose test checks the cache's own behaviour, or every line it prints."""
    return {k: v for k, v in (os.environ if env is None else env).items() if k not in _CACHE_VARS}


def run_local(cmd: list[str], *, processes: int, cpu_devices: int, timeout: float, cwd=None):
    """`cmd` in `processes` local JAX processes of `cpu_devices` CPU devices each (launch.local,
    gloo collectives): -> [(returncode, output)] in process order; raises with every process's
    output tail when one fails or the timeout passes."""
    # processes that start together compile the same programs at once: they do not share the
    # test session's compilation cache (tests/conftest.py), whose writes are not atomic
    saved = {k: os.environ.pop(k, None) for k in _CACHE_VARS}
    try:
        status, results = run_processes(
            cmd, processes=processes, cpu_devices=cpu_devices, platform="cpu", timeout=timeout,
            cwd=cwd, echo=False,
        )  # fmt: skip
    finally:
        os.environ.update({k: v for k, v in saved.items() if v is not None})
    if status:
        tails = "\n".join(
            f"--- process {i} (rc {rc}) ---\n{out[-4000:]}" for i, (rc, out) in enumerate(results)
        )
        why = "timed out" if status == 124 else "failed"
        raise RuntimeError(f"local multi-process run {why}:\n{tails}")
    return results


def run_and_signal(
    args: list[str],
    *,
    when,
    sig=signal.SIGKILL,
    repeat_after: float | None = None,
    env=None,
    timeout: float = 600,
    poll: float = 0.002,
) -> tuple[int, str]:
    """`python -m train.main *args` in a subprocess; sends `sig` as soon as `when(output so far)`
    is true (polled every `poll` seconds; `repeat_after`: once more that many seconds later), then
    waits for the process: -> (returncode, output). The signal comes from outside, at whatever
    point the run has reached, as a preemption or a kill -9 does; `when=None`: no signal."""
    cmd = [sys.executable, "-m", "train.main", *args]
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, text=True
        )

        def output() -> str:
            out.seek(0)
            return out.read()

        deadline = time.monotonic() + timeout
        try:
            while when is not None and proc.poll() is None and time.monotonic() < deadline:
                if when(output()):
                    proc.send_signal(sig)
                    if repeat_after is not None:
                        time.sleep(repeat_after)
                        proc.send_signal(sig)
                    break
                time.sleep(poll)
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        return proc.returncode, output()


def checkpoint_exists(run_dir: str, step: int):
    """A `when` for run_and_signal: the run has committed checkpoint `step` (Orbax renames the
    step's temporary directory to `<step>` only once every item is written)."""
    return lambda _output: os.path.isdir(os.path.join(run_dir, "checkpoints", str(step)))


def logged_steps(run_dir: str) -> list[int]:
    """The steps <run_dir>/metrics.jsonl has train metrics of, sorted, a step logged twice listed
    twice ([] before the file exists)."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        lines = f.read().splitlines()
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:  # the line being written right now
            continue
    return sorted(r["step"] for r in records if any(k.startswith("train/") for k in r))


def read_while_training(args: list[str], read, *, ready, reader: str | None = None, env=None,
                        timeout: float = 600):  # fmt: skip
    """`python -m train.main *args` in a subprocess; once `ready()` (it has started saving), reads
    its run directory `reader` again and again in this process until the trainer ends, as a user
    evaluating a run while it trains: train.source's way in (Orbax's manager and a restore) each
    time, the whole train.evaluate every fourth time; `read()` after each. -> (returncode,
    output, reads that completed)."""
    from train.evaluate import evaluate
    from train.source import open_source

    cmd = [sys.executable, "-m", "train.main", *args]
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                text=True)  # fmt: skip
        deadline, reads, started = time.monotonic() + timeout, 0, False
        try:
            while proc.poll() is None and time.monotonic() < deadline:
                started = started or ready()
                if not started:
                    time.sleep(0.05)
                    continue
                if reads % 4 == 0:
                    assert evaluate(reader)["kind"] == "run"
                else:
                    assert open_source(reader).step >= 1
                read()
                reads += 1
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        out.seek(0)
        return proc.returncode, out.read(), reads


def check_beside_a_live_run(rc: int, log: str, reads: int, kept: list[int], steps: int) -> None:
    """What a run read while it trained shows: the trainer exited 0 without a traceback, the
    reads overlapped it, and it kept its last step (the caller restores each kept step and
    compares the curve with an undisturbed run's)."""
    assert rc == 0 and "Traceback" not in log, log[-3000:]
    assert reads >= 3, f"only {reads} reads overlapped the run"
    assert kept and kept[-1] == steps, kept


def snapshot(root: str) -> dict:
    """Every file and link under `root`: its bytes' hash (a link: its target), by path."""
    out = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            if os.path.islink(path):
                out[path] = "-> " + os.readlink(path)
            elif os.path.isfile(path):
                with open(path, "rb") as f:
                    out[path] = hashlib.sha256(f.read()).hexdigest()
            else:
                out[path] = "dir"
    return out
