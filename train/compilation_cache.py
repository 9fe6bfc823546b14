"""Persistent XLA compilation cache: a restarted run loads its compiled programs instead of compiling.

JAX keys each compiled program by a hash of its StableHLO, the devices, the compile options, the
XLA flags and the jax/jaxlib/backend versions, and stores the serialized executable as one file
`<dir>/<module>-<hash>-cache`. A later process that builds the same program (resume, preemption
restart, `make demo` rerun, a sweep point that changes only a data or optimiser VALUE) reads it back:
on this repo's 2-core CPU trm_sudoku_tiny's first step is done 1.9 s after the trainer starts
instead of 6.5 s (docs/training.md, "Compilation cache"). Anything that changes the program (a shape, a dtype, a
mesh, a JAX version) is a different key, so a stale entry can never be used: it is just never read.

`setup_compilation_cache` is the one place that turns it on; `python -m train.main` calls it once
before anything compiles. It does nothing when the user configured JAX's own cache
(JAX_COMPILATION_CACHE_DIR, even empty = off, or `jax_compilation_cache_dir` set in-process):
theirs wins. `python -m train.aot` deliberately does not call it (see there / docs).

Multi-process: every process may point at the same directory (local or gs://). JAX itself writes
entries from process 0 only (compiler.py `_cache_write`); the other processes only read. A write is
a plain `write_bytes` (not a rename), so a process reading an entry while another process writes
it can see a truncated file; JAX then fails to decompress it, warns, and compiles the program
itself: slower, never wrong.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading

import jax

from train.errors import ConfigError

log = logging.getLogger(__name__)

DEFAULT_DIR = "~/.cache/trm-jax-xla"  # beside ~/.cache/trm-jax-wandb and ~/.cache/trm-jax-arc
# Programs that compiled faster than this are not written. Reading one back costs a file read and a
# deserialization (a round trip per entry on gs://), which for the ~10 ms helper jits (dtype
# converts, RNG seeding) is as slow as compiling them; everything the trainer spends real time on
# (init ~3 s, train step ~3-10 s, eval ~1 s on CPU) is far above it. JAX's own default, 1 s,
# would skip trm_sudoku_tiny's eval program (0.96 s on an idle 2-core CPU).
DEFAULT_MIN_COMPILE_SECS = 0.1

# jax.monitoring events, as named in jax/_src/compiler.py and compilation_cache.py (the same in
# jax 0.10.2 and 0.12). Note JAX records `cache_misses` when it WRITES an entry, not on every miss:
# a program below the compile-time threshold, or compiled on a process other than 0, is a miss
# without that event. Misses are therefore counted as requests - hits.
_REQUESTS = "/jax/compilation_cache/compile_requests_use_cache"
_HITS = "/jax/compilation_cache/cache_hits"
_WRITES = "/jax/compilation_cache/cache_misses"
# (JAX also records `compile_time_saved_sec` on a hit, but from a compile time it stored in WHOLE
# seconds, truncated: 0 for anything under 1 s. Not reported; the trainer logs time-to-first-step.)


@dataclasses.dataclass
class CacheStats:
    """Counts of this process's compile requests since `setup_compilation_cache`."""

    requests: int = 0  # programs looked up in the cache (every compile while it is on)
    hits: int = 0  # loaded from the cache instead of compiled
    writes: int = 0  # compiled and written (JAX's `cache_misses` event)

    @property
    def misses(self) -> int:
        return self.requests - self.hits

    def summary(self) -> str:
        return (
            f"{self.hits} hits, {self.misses} misses ({self.hits} of {self.requests} programs "
            f"loaded from the cache, {self.misses} compiled, {self.writes} written)"
        )


_stats = CacheStats()
_stats_lock = threading.Lock()  # JAX may compile on several threads
_listening = False
_active_dir: str | None = None  # what this process uses, None = off


def _on_event(event: str, **_) -> None:
    field = {_REQUESTS: "requests", _HITS: "hits", _WRITES: "writes"}.get(event)
    if field:
        with _stats_lock:
            setattr(_stats, field, getattr(_stats, field) + 1)


def is_url(path: str) -> bool:
    return "://" in path


def resolve_dir(cache_dir: str | None) -> str | None:
    """The directory JAX gets: None when off (None/empty), URLs (gs://...) as they are, a local path
    with `~` expanded and made absolute (a relative one would move with the working directory)."""
    if cache_dir is None or not str(cache_dir).strip():
        return None
    cache_dir = str(cache_dir).strip()
    if is_url(cache_dir):
        return cache_dir
    return os.path.abspath(os.path.expanduser(cache_dir))


def _check_local_dir(path: str, given) -> None:
    """ConfigError when the local cache folder cannot be one: it, or a folder on its way, is a
    file (JAX would warn at every program and cache nothing)."""
    if is_url(path):
        return
    probe = path
    while not os.path.lexists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise ConfigError(
            f"run.compilation_cache_dir={given!r}: {probe} is a file, not a folder; name a "
            "folder, or null to turn the cache off"
        )


def setup_compilation_cache(
    cache_dir: str | None = DEFAULT_DIR,
    min_compile_secs: float = DEFAULT_MIN_COMPILE_SECS,
) -> str | None:
    """Points JAX's persistent compilation cache at `cache_dir` unless the user configured JAX's.

    Call before the first compile: JAX opens the cache once, at the first compile that finds a
    directory set, and ignores later changes of it. Returns the directory in use (ours or the
    user's), or None when the cache is off. Logs one line saying which, and starts counting hits
    and misses (`compilation_cache_stats`). Calling it again with the same directory is a no-op.
    """
    global _listening, _active_dir
    theirs = jax.config.jax_compilation_cache_dir  # env JAX_COMPILATION_CACHE_DIR lands here too
    ours = resolve_dir(cache_dir)
    if theirs is not None and theirs != _active_dir:
        where = (
            "JAX_COMPILATION_CACHE_DIR"
            if "JAX_COMPILATION_CACHE_DIR" in os.environ
            else "jax_compilation_cache_dir"
        )
        if theirs:
            log.info(
                "XLA compilation cache: %s (your %s; run.compilation_cache_dir and "
                "run.compilation_cache_min_compile_secs are not applied)",
                theirs,
                where,
            )
        else:
            log.info("XLA compilation cache: off (your %s is empty)", where)
        _active_dir = theirs or None
    elif _active_dir is not None:  # set by an earlier call in this process
        if ours != _active_dir:
            log.warning(
                "XLA compilation cache: keeping %s (JAX opens its cache once per process; "
                "%s ignored)",
                _active_dir,
                ours,
            )
        return _active_dir
    elif ours is None:
        log.info("XLA compilation cache: off (run.compilation_cache_dir is empty)")
        _active_dir = None
    else:
        if min_compile_secs < 0:
            raise ValueError(f"min_compile_secs must be >= 0, got {min_compile_secs}")
        _check_local_dir(ours, cache_dir)
        # JAX creates the directory (local or gs:// through etils.epath) when it opens the cache.
        jax.config.update("jax_compilation_cache_dir", ours)
        if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
            jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_secs))
        log.info(
            "XLA compilation cache: %s (programs that compile in >= %g s are saved; "
            "run.compilation_cache_dir=null turns it off)",
            ours,
            jax.config.jax_persistent_cache_min_compile_time_secs,
        )
        _active_dir = ours
    if _active_dir and not _listening:
        jax.monitoring.register_event_listener(_on_event)
        _listening = True
    return _active_dir


def compilation_cache_stats() -> CacheStats:
    """A copy of this process's counts (all zero while the cache is off)."""
    with _stats_lock:
        return dataclasses.replace(_stats)


def log_compilation_cache_stats() -> None:
    """One log line with the counts; nothing when the cache is off."""
    if _active_dir:
        log.info("XLA compilation cache: %s", compilation_cache_stats().summary())
