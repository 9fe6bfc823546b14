"""The tables of `python -m bench` and `python -m bench ttq` records, in Markdown: the console
prints them, and docs/benchmarks.md's are generated from the committed records by `python -m bench
tables`."""

from __future__ import annotations


def _ms(x: float) -> str:
    return f"{x * 1e3:.1f}"


def _load(result: dict) -> str:
    def avg(x):
        return "n/a" if not x else "/".join(f"{v:.1f}" for v in x)

    start, end = avg(result.get("loadavg_start")), avg(result.get("loadavg_end"))
    return f"load average (1/5/15 min) {start} before, {end} after"


def _table(columns: str) -> list[str]:
    return ["", f"| {columns.replace('|', ' | ')} |", "|" + "---|" * len(columns.split("|"))]


def speed_markdown(result: dict) -> str:
    """What a step-time record says: the command and machine, then one row per implementation
    (median [IQR], range, throughput, MFU, compile, peak memory) and one per paired ratio."""
    m, s = result["machine"], result["settings"]
    where = m["cpu"] if m["device"] == "cpu" else ", ".join(m["gpus"])
    peak = result.get("peak_flops")
    lines = [
        f"`{result['command']}` at {result['started_utc']} (git {m['git_commit']}); {where}, "
        f"{m['cpu_cores']} cores, threads per worker: {s.get('threads') or m['cpu_cores']}; "
        f"{_load(result)}; peak for MFU {f'{peak:.3g}' if peak else 'unknown'} FLOP/s "
        f"({result.get('peak_flops_source')}); {s['steps']} timed rounds x {s['inner']} steps "
        f"after {s['warmup']} warm-up rounds.",
        *_table("config|impl|step ms median [IQR]|min-max ms|items/s|MFU|compile s|peak mem MiB"),
    ]
    for rec in result["results"]:
        c = rec["config"]
        for impl, res in rec["impls"].items():
            t = res.get("step_time_s")
            if res["status"] != "ok" or not t:
                lines.append(f"| {c} | {impl} | error: {res.get('error', '')} | | | | | |")
                continue
            mem = res.get("memory", {})
            peak_bytes = mem.get("device_peak_bytes") or mem.get("peak_rss_bytes") or 0
            mfu = f"{res['mfu']:.1%}" if res.get("mfu") else "-"
            note = res.get("recompiles_during_timing")
            lines.append(
                f"| {c} | {impl} | {_ms(t['median'])} [{_ms(t['q1'])}-{_ms(t['q3'])}] "
                f"| {_ms(t['min'])}-{_ms(t['max'])} | {res['items_per_s']:.0f} {rec['unit']}/s "
                f"| {mfu} | {res['compile_s']:.1f} | {peak_bytes / 2**20:.0f}"
                f"{f' ({note} recompiles while timed!)' if note else ''} |"
            )
        for key, r in rec["ratios"].items():
            lines.append(f"| {c} | **{key}** | ratio {r['median']:.3f} [{r['q1']:.3f}-{r['q3']:.3f}] "
                         "| | | | | |")  # fmt: skip
    return "\n".join(lines)


def ttq_markdown(result: dict) -> str:
    """What a time-to-quality record says: one row per implementation and config."""
    lines = [
        f"`{result['command']}` at {result['started_utc']}; {_load(result)}.",
        *_table("config|impl|metric (target)|reached|steps|wall s (incl. compile)|final value"),
    ]
    for rec in result["results"]:
        for impl, res in rec["impls"].items():
            if res["status"] != "ok":
                lines.append(f"| {rec['config']} | {impl} | error: {res.get('error')} | | | | |")
                continue
            wall = res.get("wall_to_target_s", res["busy_s"])
            final = res["curve"][-1][rec["metric"]] if res["curve"] else float("nan")
            lines.append(
                f"| {rec['config']} | {impl} | {rec['metric']} ({rec['target']}) "
                f"| {'yes' if res['reached'] else 'no'} | {res['steps']} | {wall:.1f} | {final:.4f} |"
            )
    return "\n".join(lines)
