"""The kernels torch runs in this process, and whether they are the ones a fixture recorded.

A float result of torch on a CPU is bit-reproducible only on the same kernels. ATen's capability
label ("AVX512") names ATen's own vector kernels, but the CPU wheel's BLAS (oneMKL) dispatches on
its own, by CPU vendor and microarchitecture: an Intel and an AMD CPU both labelled AVX512 run
different GEMM kernels and give other bits (docs/porting_trm.md, "The same ATen capability is not
the same kernels"). So the identity is the whole chain: the CPU (vendor, family, model, name), torch
and its ATen capability, the BLAS torch was built with, MKL's code path (from its verbose banner)
and its conditional-numerical-reproducibility mode (from its verbose call line), torch's thread
count (reductions split by thread).

The generators (parity/goldens/) record `identity()` under "machine" in their manifest section;
the tests that compare with a fixture EXACTLY ask `difference(section.get("machine"))` first and
use the fixture's envelope or tolerance wherever it names a field. A manifest without the record
is never the same machine.

The environment knobs that move kernels are recorded under "env" for the reader; they count only
through what they change: ATEN_CPU_CAPABILITY through the ATen capability, MKL_ENABLE_INSTRUCTIONS
and MKL_DEBUG_CPU_TYPE through MKL's banner, MKL_CBWR through MKL's CNR mode (measured on the
fixtures' AMD CPU: tests/test_goldens_trm.py::test_kernel_identity_decides_exact_under_other_kernels).
oneDNN's choice is not probed, so ONEDNN_MAX_CPU_ISA / DNNL_MAX_CPU_ISA are compared as they are set.

torch is imported inside the functions: checking a port against goldens needs no torch.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import platform
import re
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

# the environment variables that choose CPU kernels of ATen, MKL or oneDNN
KNOBS = (
    "ATEN_CPU_CAPABILITY",
    "MKL_ENABLE_INSTRUCTIONS",
    "MKL_CBWR",
    "MKL_DEBUG_CPU_TYPE",
    "ONEDNN_MAX_CPU_ISA",
    "DNNL_MAX_CPU_ISA",
)
# knobs whose effect no field shows: compared as set
_UNPROBED_KNOBS = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")
# the fields that decide the kernels, in the order `difference` reports them
KERNEL_FIELDS = (
    "cpu_vendor",
    "cpu_family",
    "cpu_model",
    "cpu_model_name",
    "torch",
    "aten_cpu_capability",
    "blas",
    "mkl_code_path",
    "mkl_cnr",
    "torch_threads",
)
UNKNOWN = "unknown"  # a field that could not be read never matches, not even itself

# /proc/cpuinfo keys: x86 (vendor_id ...) and ARM (CPU implementer ...)
_CPUINFO = {
    "vendor_id": "cpu_vendor",
    "CPU implementer": "cpu_vendor",
    "cpu family": "cpu_family",
    "CPU architecture": "cpu_family",
    "model": "cpu_model",
    "CPU part": "cpu_model",
    "model name": "cpu_model_name",
}


def identity() -> dict:
    """This process's kernel identity, JSON-able; torch's thread count is read now, the rest once
    per process (MKL's probe is one 4x4 DGEMM, milliseconds)."""
    import torch

    return {
        **_cpu(),
        "torch": torch.__version__,
        "aten_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        **_blas(),
        "torch_threads": torch.get_num_threads(),
        "env": {k: os.environ.get(k) for k in KNOBS},
    }


def difference(recorded: Mapping | None) -> str | None:
    """None when this process runs the kernels `recorded` (a manifest's "machine") names, else the
    first field that differs, as "field: recorded X, here Y"."""
    if not recorded:
        return "machine: not recorded (a manifest older than parity/machine.py)"
    here = identity()
    for field in KERNEL_FIELDS:
        old, new = recorded.get(field, UNKNOWN), here[field]
        if old != new or UNKNOWN in (old, new):
            return f"{field}: recorded {old!r}, here {new!r}"
    for knob in _UNPROBED_KNOBS:
        old, new = (recorded.get("env") or {}).get(knob), here["env"][knob]
        if old != new:
            return f"env {knob}: recorded {old!r}, here {new!r}"
    return None


def same_kernels(recorded: Mapping | None) -> bool:
    """Whether torch here gives the bits of the machine `recorded` names."""
    return difference(recorded) is None


@functools.cache
def _cpu() -> dict:
    out = dict.fromkeys(_CPUINFO.values(), UNKNOWN)
    out["arch"] = platform.machine() or UNKNOWN
    try:
        first = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    except OSError:
        return out
    for line in first.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in _CPUINFO and value.strip():
            out[_CPUINFO[key.strip()]] = value.strip()
    return out


@functools.cache
def _blas() -> dict:
    """torch's BLAS (from its build config) and, for MKL, the code path and CNR mode it takes."""
    import torch

    config = torch.__config__.show()
    name = re.search(r"BLAS_INFO=(\w+)", config)
    blas = name.group(1) if name else "none"
    version = re.search(r"Math Kernel Library Version (.+?) for ", config)
    if blas != "mkl" or not torch.backends.mkl.is_available():
        return {"blas": blas, "mkl_code_path": "none", "mkl_cnr": "none"}
    log = _mkl_verbose_in_process()
    if "for " not in log:  # the banner comes once per process: printed before we asked
        log = _mkl_verbose_in_subprocess()
    return {"blas": f"mkl {version.group(1) if version else UNKNOWN}", **parse_mkl_verbose(log)}


def parse_mkl_verbose(log: str) -> dict:
    """MKL's code path from its banner ("oneMKL 2024.0 ... for Intel(R) 64 architecture <path>,
    Lnx 2.60GHz lp64 gnu_thread") and the CNR mode of its first call line."""
    banner = re.search(r"^MKL_VERBOSE .+? for (.+?), \S+ [\d.]+GHz", log, re.M)
    cnr = re.search(r"\bCNR:(\S+)", log)
    path = banner.group(1).removeprefix("Intel(R) 64 architecture ") if banner else UNKNOWN
    return {"mkl_code_path": path, "mkl_cnr": cnr.group(1) if cnr else UNKNOWN}


def _one_dgemm():
    import torch

    a = torch.ones(4, 4, dtype=torch.float64)
    return a @ a


def _mkl_verbose_in_process() -> str:
    """One DGEMM with MKL's verbose mode on, its lines caught from file descriptor 1."""
    import torch

    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return ""
    with tempfile.TemporaryFile() as f:
        sys.stdout.flush()
        libc.fflush(None)
        saved = os.dup(1)
        os.dup2(f.fileno(), 1)
        try:
            with torch.backends.mkl.verbose(torch.backends.mkl.VERBOSE_ON):
                _one_dgemm()
            libc.fflush(None)
        except (AssertionError, RuntimeError):  # verbose mode refused
            pass
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        f.seek(0)
        return f.read().decode(errors="replace")


def _mkl_verbose_in_subprocess() -> str:
    code = "import torch; a = torch.ones(4, 4, dtype=torch.float64); a @ a"
    env = dict(os.environ, MKL_VERBOSE="1")
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        return subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
        ).stdout
    return ""
