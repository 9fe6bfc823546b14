"""Markdown tables from bench JSON files (for docs/benchmarks.md).

python -m bench.report bench_out/bench.json [bench_out/ttq.json ...]
"""

from __future__ import annotations

import json
import sys


def _load(x) -> str:
    return "n/a" if not x else "/".join(f"{v:.1f}" for v in x)


def _ms(x: float) -> str:
    return f"{x * 1e3:.1f}"


def speed_markdown(result: dict) -> str:
    m = result["machine"]
    s = result["settings"]
    lines = [
        f"`{result['command']}` at {result['started_utc']} (git {m['git_commit']}); "
        f"{m['cpu'] if m['device'] == 'cpu' else ', '.join(m['gpus'])}, {m['cpu_cores']} cores, "
        f"threads per worker: {s.get('threads') or m['cpu_cores']}; load average (1/5/15 min) "
        f"{_load(result['loadavg_start'])} before, {_load(result['loadavg_end'])} after; peak for MFU "
        f"{result['peak_flops']:.3g} FLOP/s ({result['peak_flops_source']}); "
        f"{s['steps']} timed rounds x {s['inner']} steps after {s['warmup']} warm-up rounds.",
        "",
        "| config | impl | step ms median [IQR] | min-max ms | items/s | MFU | compile s | peak mem MiB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for rec in result["results"]:
        for impl, res in rec["impls"].items():
            t = res.get("step_time_s")
            if res["status"] != "ok" or not t:
                lines.append(
                    f"| {rec['config']} | {impl} | error: {res.get('error', '')} | | | | | |"
                )
                continue
            mem = res.get("memory", {})
            peak = mem.get("device_peak_bytes") or mem.get("peak_rss_bytes") or 0
            mfu = f"{res['mfu']:.1%}" if res.get("mfu") else "-"
            lines.append(
                f"| {rec['config']} | {impl} | {_ms(t['median'])} [{_ms(t['q1'])}-{_ms(t['q3'])}] "
                f"| {_ms(t['min'])}-{_ms(t['max'])} | {res['items_per_s']:.0f} {rec['unit']}/s "
                f"| {mfu} | {res['compile_s']:.1f} | {peak / 2**20:.0f} |"
            )
        for key, r in rec["ratios"].items():
            lines.append(
                f"| {rec['config']} | **{key}** | ratio {r['median']:.3f} [{r['q1']:.3f}-{r['q3']:.3f}] "
                "| | | | | |"
            )
    return "\n".join(lines)


def ttq_markdown(result: dict) -> str:
    lines = [
        f"`{result['command']}` at {result['started_utc']}; load average (1/5/15 min) "
        f"{_load(result['loadavg_start'])} before, {_load(result['loadavg_end'])} after.",
        "",
        "| config | impl | metric (target) | reached | steps | wall s (incl. compile) | final value |",
        "|---|---|---|---|---|---|---|",
    ]
    for rec in result["results"]:
        for impl, res in rec["impls"].items():
            if res["status"] != "ok":
                lines.append(
                    f"| {rec['config']} | {impl} | error: {res.get('error', '')} | | | | |"
                )
                continue
            final = res["curve"][-1][rec["metric"]] if res["curve"] else float("nan")
            wall = res.get("wall_to_target_s", res["busy_s"])
            lines.append(
                f"| {rec['config']} | {impl} | {rec['metric']} ({rec['target']}) "
                f"| {'yes' if res['reached'] else 'no'} | {res['steps']} | {wall:.1f} | {final:.4f} |"
            )
    return "\n".join(lines)


def main(argv=None) -> None:
    for path in argv if argv is not None else sys.argv[1:]:
        with open(path) as f:
            result = json.load(f)
        print(speed_markdown(result) if result.get("kind") == "speed" else ttq_markdown(result))
        print()


if __name__ == "__main__":
    main()
