"""Where a run's wall time went, across its restarts (MaxText's goodput).

    startup     building the task, validating the data, restoring or creating the state
    compile     the first step of each process start (tracing + XLA compile + one step)
    data        fetching and placing batches on the host
    steps       training steps (the host waits for step N-1 after dispatching N: device time)
    eval        evaluations, their compiles included
    checkpoint  saving (the blocking part, and waiting for async saves to commit)
    lost        steps trained again after a restart: the previous process got further than its
                last checkpoint (killed, or crashed); counted at its mean step time
    other       the rest of the wall time (logging, the host between steps, shutdown)

Totals are saved with every checkpoint, so a resumed run adds to them and the last summary covers
every process start of the run; `goodput` = steps / wall.
"""

from __future__ import annotations

import contextlib
import time

CATEGORIES = ("startup", "compile", "data", "steps", "eval", "checkpoint", "lost")


class Goodput:
    def __init__(self):
        self.started = time.perf_counter()
        self.seconds = dict.fromkeys(CATEGORIES, 0.0)  # this process start
        self.steps_timed = 0  # steps whose time is in `steps`
        self.before = {}  # totals of the earlier process starts (from the checkpoint)
        self.steps_redone = 0

    @contextlib.contextmanager
    def measure(self, category: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[category] += time.perf_counter() - t0

    def resumed(self, saved: dict | None, steps_redone: int) -> None:
        """A restart: the totals the checkpoint carries, and the steps the previous process ran
        after that checkpoint (trained again now, at the previous mean step time)."""
        self.before = dict(saved or {})
        self.steps_redone = max(0, int(steps_redone))
        mean = self.before.get("steps", 0.0) / max(1, self.before.get("steps_timed", 0))
        self.seconds["lost"] += self.steps_redone * mean

    def totals(self) -> dict:
        """Seconds per category, wall, steps timed and redone, and goodput (steps / wall), over
        every process start so far."""
        out = {k: self.before.get(k, 0.0) + self.seconds[k] for k in CATEGORIES}
        out["wall"] = self.before.get("wall", 0.0) + time.perf_counter() - self.started
        out["wall"] += self.seconds["lost"]  # the lost work's wall time is not in `before`
        out["other"] = max(0.0, out["wall"] - sum(out[k] for k in CATEGORIES))
        out["steps_timed"] = self.before.get("steps_timed", 0) + self.steps_timed
        out["steps_redone"] = self.before.get("steps_redone", 0) + self.steps_redone
        out["goodput"] = out["steps"] / out["wall"] if out["wall"] > 0 else 0.0
        return out


def summary(totals: dict) -> str:
    """`wall 312 s: steps 81%, compile 6%, ...` (categories above 0.5%, largest first)."""
    wall = totals["wall"]
    parts = sorted(
        ((k, totals[k]) for k in (*CATEGORIES, "other") if wall and totals[k] / wall >= 0.005),
        key=lambda kv: -kv[1],
    )
    shares = ", ".join(f"{k} {100 * v / wall:.0f}%" for k, v in parts)
    redone = (
        f"; {totals['steps_redone']} steps redone after restarts" if totals["steps_redone"] else ""
    )
    return f"wall {wall:.0f} s: {shares}{redone}"
