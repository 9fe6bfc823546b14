"""Test configuration shared by every tier.

JAX reads XLA_FLAGS when its CPU backend starts, so the 8 fake CPU devices must be requested here,
before any test module imports jax. Eight devices let sharding tests build real (2, 4) meshes on a
laptop; single-device code is unaffected (it runs on device 0).
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import sys
import tempfile

_FLAG = "--xla_force_host_platform_device_count=8"
if _FLAG.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()
os.environ.setdefault("WANDB_MODE", "disabled")
# libtpu (installed for the tpu_aot tier) probes for a TPU in every JAX process and prints errors on
# machines without one. Compiling against a TPU *topology description* needs no TPU backend, so on a
# machine without an NVIDIA GPU the tests pin JAX to the CPU backend (inherited by subprocesses).
if not (os.path.exists("/dev/nvidia0") or os.environ.get("CUDA_VISIBLE_DEVICES")):
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")  # no GCE metadata server here
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # two xdist workers may both load libtpu
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# Every test process runs with a third model family registered the way a family in a package of
# its own is: tests/toy_family/registered/ holds the .dist-info of a distribution whose entry point
# (group trm_jax_port.families) names tests.toy_family. On sys.path here, on PYTHONPATH for the
# processes the tests start (with the repository root, so `tests` imports from any directory).
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOY_REGISTRATION = os.path.join(_REPO, "tests", "toy_family", "registered")
sys.path.append(TOY_REGISTRATION)
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (TOY_REGISTRATION, _REPO, os.environ.get("PYTHONPATH")) if p
)

import jax  # noqa: E402
import pytest  # noqa: E402

# Parity tests compare against torch's exact fp32 matmuls: never let XLA pick a faster, lossier
# algorithm (TF32 on GPU) behind our back.
jax.config.update("jax_default_matmul_precision", "highest")

# The processes the tests start (`python -m train.main` runs, killed and resumed, evaluations)
# share their compiled programs through a persistent XLA compilation cache of this test process
# alone: one directory per pytest process (each xdist worker), removed at its end. Set after jax
# is imported, so it reaches the child processes (JAX reads the variables when it starts) and not
# this one. A test that checks the cache's own behaviour clears the variables for its processes;
# several JAX processes started together (launch.local) do not share it (tests/helpers.py).
_XLA_CACHE = tempfile.mkdtemp(prefix="trm-tests-xla-")
os.environ["JAX_COMPILATION_CACHE_DIR"] = _XLA_CACHE
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
atexit.register(shutil.rmtree, _XLA_CACHE, ignore_errors=True)

try:  # two xdist workers on two cores: keep torch from oversubscribing them
    import torch

    torch.set_num_threads(1)
except ImportError:  # torch is optional; parity tests skip themselves without it
    pass


# The default tier (`-m "not slow"`, `make test`) compiles its many small programs with LLVM at -O0:
# XLA's HLO passes, fusion and buffer assignment are unchanged, only the kernels' machine code is
# unoptimised, which takes ~27% less CPU (docs/testing.md, "The default tier compiles at -O0").
# Set here, before any backend starts, and inherited by the processes the tests start; the slow
# tier, whose whole runs are dominated by running, keeps XLA's default.
_O0 = "--xla_backend_optimization_level"


def pytest_configure(config):
    if (config.option.markexpr or "").strip() == "not slow" and _O0 not in os.environ["XLA_FLAGS"]:
        os.environ["XLA_FLAGS"] += f" {_O0}=0"


def _has_gpu() -> bool:
    try:
        return len(jax.devices("gpu")) > 0
    except RuntimeError:
        return False


def pytest_collection_modifyitems(config, items):
    has_gpu = None
    has_libtpu = importlib.util.find_spec("libtpu") is not None
    for item in items:
        if "gpu" in item.keywords:
            if has_gpu is None:
                has_gpu = _has_gpu()
            if not has_gpu:
                item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        if "tpu_aot" in item.keywords and not has_libtpu:
            item.add_marker(
                pytest.mark.skip(reason="libtpu is not importable (pip install libtpu)")
            )


@pytest.fixture(autouse=True)
def _x64_does_not_leak():
    """train() switches jax x64 on for the whole process when a run needs it (TRM's float64 loss);
    an in-process run that leaves it on changes the numerics of every later in-process run in the
    same worker (a GPT run then differs from its subprocess twin: kill-and-resume compares them
    EXACTLY). Put the setting back after every test."""
    before = jax.config.jax_enable_x64
    yield
    if jax.config.jax_enable_x64 != before:
        jax.config.update("jax_enable_x64", before)


@pytest.fixture
def x64():
    """Run the test body with float64 enabled (parity comparisons through recursion)."""
    with jax.enable_x64(True):
        yield


@pytest.fixture(scope="session")
def shared_data_dir():
    """../shared/data beside the checkout: offline copies of the real data sets (tests only)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(os.path.dirname(here), "shared", "data")
    if not os.path.isdir(path):
        pytest.skip("../shared/data is not present")
    return path
