"""`python -m parity diff` from a user's project whose own `models`, `train` and `data` packages
shadow this repository's, on a UNet-style decoder block (tests/parity_upblock.py: GroupNorm,
SiLU, ConvTranspose2d by rule, Conv2d, a 1x1 skip; a channels-last port).

Two ways the toolkit reaches the user's interpreter: a copy of parity/ alone on PYTHONPATH, and
the repository installed non-editable (`pip install --no-deps` of a copy of the source tree) into
a fresh venv that sees this environment's packages through a .pth line, with no editable finder
and no source checkout on its path. Slow tier: a build, an install and two fresh processes."""

from __future__ import annotations

import ast
import importlib.metadata
import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig

import pytest

pytest.importorskip("torch")

from tests.helpers import REPO as _REPO  # noqa: E402

pytestmark = pytest.mark.slow

REPO = pathlib.Path(_REPO)
PACKAGES = ("models", "train", "data", "parity", "launch", "bench")  # pyproject's packages.find
DIFF = ["-m", "parity", "diff", "models.upblock:torch_up", "models.upblock:nnx_up",
        "--dtype", "float64", "--grads"]  # fmt: skip
_IGNORE = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")


def _user_project(root: pathlib.Path) -> pathlib.Path:
    """A project with its own `models`, `train` and `data` packages; models/upblock.py holds the
    block and its port."""
    user = root / "project"
    for pkg in ("models", "train", "data"):
        (user / pkg).mkdir(parents=True)
        (user / pkg / "__init__.py").write_text('"""the user\'s own package"""\n')
    shutil.copy(REPO / "tests" / "parity_upblock.py", user / "models" / "upblock.py")
    return user


def _env(**extra) -> dict:
    """This environment without PYTHONPATH (a test run may point it at the source checkout)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {**env, "JAX_PLATFORMS": "cpu", **extra}


def _run(python, args, cwd, env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(python), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900
    )


def _assert_diff_passes(out: subprocess.CompletedProcess) -> None:
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "every compared tensor agrees" in out.stdout
    assert "up.weight" in out.stdout  # the ConvTranspose2d weight, mapped by rule
    assert "declared by the rule of GroupNorm: norm; _ConvNd: up, conv, skip" in out.stdout


def _where(python, cwd, env) -> dict[str, str]:
    """Where `parity` and `models` come from in that interpreter, and its sys.path."""
    code = "import sys, parity, models; print(parity.__file__); print(models.__file__); print(sys.path)"
    out = _run(python, ["-c", code], cwd, env)
    assert out.returncode == 0, out.stderr[-3000:]
    parity_file, models_file, path = out.stdout.splitlines()
    return {"parity": parity_file, "models": models_file, "path": path}


def test_diff_with_a_copy_of_the_toolkit_alone_on_the_path(tmp_path):
    site = tmp_path / "site"
    shutil.copytree(REPO / "parity", site / "parity", ignore=_IGNORE)
    user = _user_project(tmp_path)
    env = _env(PYTHONPATH=str(site))
    _assert_diff_passes(_run(sys.executable, DIFF, user, env))
    where = _where(sys.executable, user, env)
    assert where["parity"] == str(site / "parity" / "__init__.py"), where
    assert where["models"] == str(user / "models" / "__init__.py"), where


def _venv_seeing_this_environment(root: pathlib.Path) -> pathlib.Path:
    """A fresh venv (no pip of its own) whose site-packages end with a .pth line naming this
    interpreter's site-packages: their .pth files (this checkout's editable finder among them)
    are not run, so the repository is importable only from what is installed into the venv."""
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    pathlib.Path(purelib, "zz_parent_environment.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\n"
    )
    return python


def _build_isolation_flags() -> list[str]:
    """Offline where this environment's setuptools can build the project (>= 77: bdist_wheel
    built in, the SPDX license string read); otherwise pip's isolated build, which fetches
    setuptools as `pip install .` does."""
    try:
        major, minor = (int(p) for p in importlib.metadata.version("setuptools").split(".")[:2])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return []
    return ["--no-build-isolation"] if (major, minor) >= (77, 0) else []


def _pip_install(python, what: pathlib.Path, cwd: pathlib.Path) -> None:
    """`pip install` of the project at `what` (non-editable, no dependencies) into `python`'s venv."""
    install = _run(
        python,
        ["-m", "pip", "install", "-q", "--no-deps", "--ignore-installed",
         *_build_isolation_flags(), str(what)],
        cwd, _env(),
    )  # fmt: skip
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]


def test_diff_with_the_project_installed_non_editable(tmp_path):
    src = tmp_path / "src"
    for pkg in PACKAGES:
        shutil.copytree(REPO / pkg, src / pkg, ignore=_IGNORE)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    python = _venv_seeing_this_environment(tmp_path)
    _pip_install(python, src, tmp_path)
    shutil.rmtree(src)  # nothing of the source tree is left to import from

    user = _user_project(tmp_path)
    _assert_diff_passes(_run(python, DIFF, user, _env()))
    where = _where(python, user, _env())
    site = pathlib.Path(tmp_path, "venv").resolve()
    assert pathlib.Path(where["parity"]).resolve().is_relative_to(site), where
    assert "site-packages" in where["parity"], where
    assert where["models"] == str(user / "models" / "__init__.py"), where
    parent = sysconfig.get_paths()["purelib"]
    entries = [p for p in ast.literal_eval(where["path"]) if p != parent]
    on_path = [(user / p).resolve() for p in entries]  # "" is the current directory
    assert not [p for p in on_path if p.is_relative_to(REPO.resolve())], where


def test_diff_with_the_toolkit_installed_alone_beside_an_installed_models_package(tmp_path):
    """`pip install ./toolkit` (non-editable) puts `parity` alone in site-packages: the toolkit's
    modules and none of this repository's packages or its own references; a user's project with
    its own `models` package, installed too, is what `models` names, and `python -m parity diff`
    runs from a directory that is neither checkout."""
    src = tmp_path / "src"
    shutil.copytree(REPO / "parity", src / "parity", ignore=_IGNORE)
    shutil.copytree(REPO / "toolkit", src / "toolkit", ignore=_IGNORE)
    user = _user_project(tmp_path)
    (user / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=77"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "user-project"\nversion = "0"\n'
        '[tool.setuptools.packages.find]\ninclude = ["models*", "train*", "data*"]\n'
    )
    python = _venv_seeing_this_environment(tmp_path)
    for what in (src / "toolkit", user):
        _pip_install(python, what, tmp_path)
    shutil.rmtree(src)
    shutil.rmtree(user)  # both are importable from site-packages only

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    _assert_diff_passes(_run(python, DIFF, elsewhere, _env()))
    where = _where(python, elsewhere, _env())
    site = pathlib.Path(tmp_path, "venv").resolve()
    for name in ("parity", "models"):
        assert pathlib.Path(where[name]).resolve().is_relative_to(site), where
    installed = pathlib.Path(where["parity"]).parent
    assert not (installed / "gpt_torch.py").exists() and not (installed / "trm_torch").exists()
    code = "import importlib.util as u; print([m for m in ('launch', 'bench') if u.find_spec(m)])"
    assert _run(python, ["-c", code], elsewhere, _env()).stdout.strip() == "[]"
    report = _run(python, ["-m", "parity", "trm"], elsewhere, _env())
    assert report.returncode == 2 and "not part of the toolkit" in report.stderr, report.stderr
