"""The README's commands run as written after its quick start: each `make` target exists in the
Makefile, each `python -m MODULE` is a module of this environment whose `--help` accepts every
option the README gives it, and each path a `pip install` names exists. The README stays a front
page (at most 1,000 words)."""

from __future__ import annotations

import concurrent.futures
import importlib.util
import os
import re
import shlex
import subprocess
import sys

from tests.helpers import REPO

README = os.path.join(REPO, "README.md")
MAX_WORDS = 1000


def _commands() -> list[list[str]]:
    """Every command line of the README's bash blocks (comments dropped), as argv lists."""
    text = open(README, encoding="utf-8").read()
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #", 1)[0].strip()
            if line and not line.startswith("#"):
                out.append(shlex.split(line))
    return out


def _help(module: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, f"python -m {module} --help: {done.stderr[-2000:]}"
    return done.stdout


def test_every_readme_command_runs_as_written():
    commands = _commands()
    assert commands, "no bash block in README.md"
    makefile = open(os.path.join(REPO, "Makefile"), encoding="utf-8").read()
    options: dict[str, set[str]] = {}
    for argv in commands:
        if argv[0] == "make":
            for target in argv[1:]:
                assert re.search(rf"^{re.escape(target)}:", makefile, re.M), f"make {target}"
        elif argv[:2] == ["python", "-m"]:
            module = argv[2]
            assert importlib.util.find_spec(module) is not None, f"no module {module}"
            given = argv[3 : argv.index("--")] if "--" in argv else argv[3:]
            flags = {a.split("=", 1)[0] for a in given if a.startswith("--")}
            options.setdefault(module, set()).update(flags)
        elif argv[:2] == ["pip", "install"]:
            path = argv[-1].split("[", 1)[0]
            assert os.path.exists(os.path.join(REPO, path)), f"pip install {argv[-1]}"
        else:
            raise AssertionError(f"README command of an unknown kind: {' '.join(argv)}")
    with concurrent.futures.ThreadPoolExecutor(4) as pool:  # each --help is its own process
        helps = dict(zip(options, pool.map(_help, options)))
    missing = [
        f"python -m {module} {flag}"
        for module, flags in options.items()
        for flag in sorted(flags)
        if not re.search(rf"(^|[\s,\[]){re.escape(flag)}\b", helps[module])
    ]
    assert not missing, f"options the commands' --help do not list: {missing}"


def test_the_readme_is_a_front_page():
    words = len(open(README, encoding="utf-8").read().split())
    assert words <= MAX_WORDS, f"README.md has {words} words (a front page: at most {MAX_WORDS})"
