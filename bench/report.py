"""Tables and charts of bench results: the console tables `python -m bench` and
`python -m bench ttq` print, the speed chart (PNG), and Markdown for docs/benchmarks.md.

python -m bench.report bench_out/bench.json [bench_out/ttq.json ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from train.errors import user_errors

# ----------------------------------------------------------------------------------------------
# Rows (what the console and the Markdown tables both show)


def _speed_rows(result: dict):
    """Per implementation: ("error", rec, impl, message) or ("ok", rec, impl, fields); then per
    ratio ("ratio", rec, key, summary)."""
    for rec in result["results"]:
        for impl, res in rec["impls"].items():
            t = res.get("step_time_s")
            if res["status"] != "ok" or not t:
                yield "error", rec, impl, res.get("error", "")
                continue
            mem = res.get("memory", {})
            yield (
                "ok",
                rec,
                impl,
                {
                    "t": t,
                    "items_per_s": res["items_per_s"],
                    "mfu": f"{res['mfu']:.1%}" if res.get("mfu") else "-",
                    "compile_s": res["compile_s"],
                    "peak_bytes": mem.get("device_peak_bytes") or mem.get("peak_rss_bytes") or 0,
                    "recompiles": res.get("recompiles_during_timing"),
                },
            )
        for key, r in rec["ratios"].items():
            yield "ratio", rec, key, r


def _ttq_rows(result: dict):
    """Per implementation: ("error", rec, impl, message) or ("ok", rec, impl, fields); then
    ("ratio", rec, key, value) when both sides reached the target."""
    for rec in result["results"]:
        for impl, res in rec["impls"].items():
            if res["status"] != "ok":
                yield "error", rec, impl, res.get("error", "")
                continue
            yield (
                "ok",
                rec,
                impl,
                {
                    "reached": "yes" if res["reached"] else "no",
                    "steps": res["steps"],
                    "wall": res.get("wall_to_target_s", res["busy_s"]),
                    "final": res["curve"][-1][rec["metric"]] if res["curve"] else float("nan"),
                },
            )
        key = "ratio_wall_jax/torch_eager"
        if key in rec:
            yield "ratio", rec, key, rec[key]


def _ms(x: float) -> str:
    return f"{x * 1e3:.1f}"


def _mib(n) -> str:
    return "-" if not n else f"{n / 2**20:.0f}M"


def _load(result: dict) -> str:
    def avg(x):
        return "n/a" if not x else "/".join(f"{v:.1f}" for v in x)

    start, end = avg(result["loadavg_start"]), avg(result["loadavg_end"])
    return f"load average (1/5/15 min) {start} before, {end} after"


def _md_table(columns: list[str]) -> list[str]:
    return ["", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]


# ----------------------------------------------------------------------------------------------
# Console


def format_table(result: dict) -> str:
    """The step-time table `python -m bench` prints."""
    head = (
        f"{'config':<26} {'impl':<14} {'step ms (median)':>16} {'IQR ms':>15} "
        f"{'items/s':>12} {'MFU':>7} {'compile s':>9} {'peak mem':>9}  note"
    )
    lines = [head, "-" * len(head)]
    for kind, rec, name, x in _speed_rows(result):
        if kind == "error":
            lines.append(f"{rec['config']:<26} {name:<14} {'ERROR':>16}  {x}")
        elif kind == "ratio":
            lines.append(
                f"{'':<26} {name:<28} step-time ratio (paired median) {x['median']:.3f} "
                f"[IQR {x['q1']:.3f}-{x['q3']:.3f}]"
            )
        else:
            t = x["t"]
            note = f"{x['recompiles']} recompiles while timed!" if x["recompiles"] else ""
            lines.append(
                f"{rec['config']:<26} {name:<14} {t['median'] * 1e3:>16.2f} "
                f"{t['q1'] * 1e3:>7.2f}-{t['q3'] * 1e3:<7.2f} "
                f"{x['items_per_s']:>12.0f} {x['mfu']:>7} "
                f"{x['compile_s']:>9.2f} {_mib(x['peak_bytes']):>9}  {note}"
            )
    return "\n".join(lines)


def format_ttq_table(result: dict) -> str:
    """The time-to-quality table `python -m bench ttq` prints."""
    lines = [f"{'config':<26} {'impl':<14} {'metric':<15} {'target':>7} {'reached':>8} "
             f"{'steps':>6} {'wall s':>8} {'final':>8}"]  # fmt: skip
    for kind, rec, impl, x in _ttq_rows(result):
        if kind == "error":
            lines.append(f"{rec['config']:<26} {impl:<14} ERROR {x}")
        elif kind == "ratio":
            lines.append(f"{'':<26} wall-time ratio jax/torch_eager {x:.3f}")
        else:
            lines.append(
                f"{rec['config']:<26} {impl:<14} {rec['metric']:<15} {rec['target']!s:>7} "
                f"{x['reached']:>8} {x['steps']:>6} {x['wall']:>8.1f} {x['final']:>8.4f}"
            )
    return "\n".join(lines)


def write_chart(result: dict, path: Path) -> None:
    """Median step time per implementation (IQR error bars), one panel per config."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = result["results"]
    fig, axes = plt.subplots(
        1, max(1, len(recs)), figsize=(4.5 * max(1, len(recs)), 4), squeeze=False
    )
    colors = {"jax": "#1f77b4", "torch_eager": "#ff7f0e", "torch_compile": "#2ca02c"}
    for ax, rec in zip(axes[0], recs):
        names, med, lo, hi = [], [], [], []
        for impl, res in rec["impls"].items():
            t = res.get("step_time_s")
            if not t:
                continue
            names.append(impl)
            med.append(t["median"] * 1e3)
            lo.append((t["median"] - t["q1"]) * 1e3)
            hi.append((t["q3"] - t["median"]) * 1e3)
        ax.bar(names, med, yerr=[lo, hi], capsize=4, color=[colors.get(n, "gray") for n in names])
        ax.set_title(rec["config"], fontsize=10)
        ax.set_ylabel("ms per train step (median, IQR)")
        for i, m in enumerate(med):
            ax.text(i, m, f"{m:.1f}", ha="center", va="bottom", fontsize=8)
    m = result["machine"]
    where = m["cpu"] if m["device"] == "cpu" else ", ".join(m["gpus"])
    threads = result["settings"].get("threads") or m["cpu_cores"]
    load = result.get("loadavg_start")
    fig.suptitle(
        f"train step time on {m['device']} ({where}, {threads} threads"
        + (f", load {load[0]:.1f}" if load else "")
        + ")",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------
# Markdown


def speed_markdown(result: dict) -> str:
    m = result["machine"]
    s = result["settings"]
    lines = [
        f"`{result['command']}` at {result['started_utc']} (git {m['git_commit']}); "
        f"{m['cpu'] if m['device'] == 'cpu' else ', '.join(m['gpus'])}, {m['cpu_cores']} cores, "
        f"threads per worker: {s.get('threads') or m['cpu_cores']}; {_load(result)}; peak for MFU "
        f"{result['peak_flops']:.3g} FLOP/s ({result['peak_flops_source']}); "
        f"{s['steps']} timed rounds x {s['inner']} steps after {s['warmup']} warm-up rounds.",
        *_md_table(
            [
                "config",
                "impl",
                "step ms median [IQR]",
                "min-max ms",
                "items/s",
                "MFU",
                "compile s",
                "peak mem MiB",
            ]
        ),  # fmt: skip
    ]
    for kind, rec, name, x in _speed_rows(result):
        if kind == "error":
            lines.append(f"| {rec['config']} | {name} | error: {x} | | | | | |")
        elif kind == "ratio":
            lines.append(
                f"| {rec['config']} | **{name}** | ratio {x['median']:.3f} "
                f"[{x['q1']:.3f}-{x['q3']:.3f}] | | | | | |"
            )
        else:
            t = x["t"]
            lines.append(
                f"| {rec['config']} | {name} | {_ms(t['median'])} [{_ms(t['q1'])}-{_ms(t['q3'])}] "
                f"| {_ms(t['min'])}-{_ms(t['max'])} | {x['items_per_s']:.0f} {rec['unit']}/s "
                f"| {x['mfu']} | {x['compile_s']:.1f} | {x['peak_bytes'] / 2**20:.0f} |"
            )
    return "\n".join(lines)


def ttq_markdown(result: dict) -> str:
    lines = [
        f"`{result['command']}` at {result['started_utc']}; {_load(result)}.",
        *_md_table(
            [
                "config",
                "impl",
                "metric (target)",
                "reached",
                "steps",
                "wall s (incl. compile)",
                "final value",
            ]
        ),  # fmt: skip
    ]
    for kind, rec, impl, x in _ttq_rows(result):
        if kind == "ratio":
            continue
        if kind == "error":
            lines.append(f"| {rec['config']} | {impl} | error: {x} | | | | |")
            continue
        lines.append(
            f"| {rec['config']} | {impl} | {rec['metric']} ({rec['target']}) "
            f"| {x['reached']} | {x['steps']} | {x['wall']:.1f} | {x['final']:.4f} |"
        )
    return "\n".join(lines)


def main(argv=None) -> None:
    for path in argv if argv is not None else sys.argv[1:]:
        with open(path) as f:
            result = json.load(f)
        print(speed_markdown(result) if result.get("kind") == "speed" else ttq_markdown(result))
        print()


if __name__ == "__main__":
    with user_errors():  # a ConfigError is one line
        main()
