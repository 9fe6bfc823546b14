"""The docs' tables of measured figures, generated from bench/results and the experiment configs.

    python -m bench tables            # rewrite every generated table in README.md and docs/
    python -m bench tables --check    # list the docs whose tables differ from the records; exit 1

A generated table sits between `<!-- bench tables: NAME -->` and `<!-- end bench tables -->`;
the prose around it is the doc's own. A measurement rerun changes its record under bench/results;
this command then carries the new figures into every table that shows them, and
tests/test_figures.py fails while a doc still shows the old ones.
"""

from __future__ import annotations

import functools
import json
import re
import statistics
import textwrap
from pathlib import Path

from bench import gpu, timings
from bench.configs import experiment_steps
from bench.curves import step_table
from bench.speed import speed_markdown
from bench.ttq import ttq_markdown
from train.errors import ConfigError, OneLineParser

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
DOCS = {"README.md": ("timings", "results"), "docs/testing.md": ("timings",),
        "docs/benchmarks.md": ("gpu", "gpu_plan", "cpu_speed", "cpu_ttq", "remat_policy",
                               "curves")}  # fmt: skip
_REGION = re.compile(r"(<!-- bench tables: (\w+) -->\n)(.*?)(<!-- end bench tables -->)", re.S)


@functools.cache
def _json(path: str):
    with open(RESULTS / path) as f:
        return json.load(f) if path.endswith(".json") else [json.loads(x) for x in f]


def part(path: str, key: str) -> dict:
    """What a `python -m bench gpu` part measured: results.jsonl's record of `key`."""
    (rec,) = [r for r in _json(path) if r.get("part") == key]
    return rec["result"]


def flag_lines(path: str) -> dict:
    """A flag sweep's log read back into its record (bench.gpu.read_flags)."""
    p = gpu.Part("log", 0, "")
    p.lines = (RESULTS / path).read_text().splitlines()
    return gpu.read_flags(p, None)


def spread(f: dict, digits: int) -> str:
    return f"{f['mean']:.{digits}f} [{f['min']:.{digits}f}, {f['max']:.{digits}f}]"


def final(name: str) -> dict:
    """The last evaluation both sides of a whole-run comparison have: {impl: spread, step, n}."""
    s = _json("curves/curves.json")["configs"][name]["summary"]
    row = [r for r in s["per_step"] if "jax" in r and "upstream" in r][-1]
    return {"jax": row["jax"], "upstream": row["upstream"], "step": row["step"],
            "n": row["jax"]["n"], "ttt": s["time_to_target"]}  # fmt: skip


def demo() -> dict:
    """`make demo` over seeds (bench/results/demo_seeds.json): the figures its docs quote."""
    r = _json("demo_seeds.json")
    s, test = r["summary"], r["summary"]["test"]
    return {"final": f"{spread(test['exact_accuracy'], 2)} over {s['n']} seeds",
            "steps": [f"{x['mean']:.2f}" for x in test["per_step_exact_accuracy"]],
            "step": r["seeds"][0]["step"], "published": f"{spread(s['published']['exact_accuracy'], 2)}"
            f" on {r['published']['count']}", "other": f"{spread(s['other']['exact_accuracy'], 2)} "
            f"on {r['other']['count']}"}  # fmt: skip


def ttsc(name: str) -> dict:
    r = _json(f"ttsc/{name}.json")
    k = str(r["trajectories"])
    return {"K": k, "sigma": r["sigma_star"], "plain": r["test"]["plain"]["exact_accuracy"],
            "at_K": r["test"]["curve"][k]["exact_accuracy"]}  # fmt: skip


def gpt_tiny() -> tuple[str, str]:
    """gpt_shakespeare_char_tiny's first and last val loss, from docs/training.md's "Tiny runs"."""
    row = next(x for x in (REPO / "docs/training.md").read_text().splitlines()
               if x.startswith("| gpt_shakespeare_char_tiny "))  # fmt: skip
    end, start = re.search(r"(\d\.\d\d) @30\d \(from ln 65 = (\d\.\d\d)\)", row).groups()
    return start, end


def _speed(path: str, key: str) -> tuple[dict, dict]:
    table = part(path, key)["table"]
    return ({r["impl"]: r for r in table if "impl" in r},
            {r["ratio"]: r for r in table if "ratio" in r})  # fmt: skip


def _variants(result: dict) -> dict:
    """bench.variants rows by their overrides ("" for the default)."""
    return {",".join(f"{k}={v}" for k, v in r["overrides"].items()): r for r in result["rows"]}


def figures() -> dict:
    """Every GPU figure the tables show, by name, each from its record."""
    steps = experiment_steps("trm_sudoku")
    trainer = part("h200_run2/results.jsonl", "b.trainer") | {"schedule_steps": steps}
    trm, trm_r = _speed("h200/results.jsonl", "b.trm_sudoku")
    g, g_r = _speed("h200/results.jsonl", "c.gpt2_124m")
    up = part("h200/results.jsonl", "d.upstream")
    flags = part("h200_run2/results.jsonl", "d.trm_sudoku_flags")["sets"]
    off = next(s for s in flags if s["name"] == "no_triton_gemm")
    lse = _variants(_json("h200_run2/gpt2_variants_second_call.json"))
    return {"steps": steps, "trainer": trainer, "trm": trm, "trm_r": trm_r, "gpt": g, "gpt_r": g_r,
            "upstream_h": steps / up["steps_per_s"] / 3600, "up": up,
            "base_ms": 1e3 * flags[0]["step_time_s"]["median"], "off": off,
            "lse": lse["cross_entropy_impl=logsumexp"]["ratio_to_baseline"]["median"],
            "cold": part("h200/results_second_call.jsonl", "e.jax_cold"),
            "warm": part("h200/results_second_call.jsonl", "e.jax_warm"),
            "h100_ours": part("h100/results.jsonl", "c.jax"),
            "h100_nanogpt": part("h100/results.jsonl", "c.upstream")}  # fmt: skip


# ----------------------------------------------------------------------------------------------
# The tables


def table_timings() -> str:
    rows = [f"| {timings.ROWS[n]} | {' | '.join(timings.cells(r))} |"
            for n, r in timings.records().items()]  # fmt: skip
    return "\n".join(["| machine | `make demo` | `make test` |", "|---|---|---|", *rows])


def table_results() -> str:
    """README's experiments: what each runs, and what was measured of it (the rest: the paper's
    or nanoGPT's own figures, the settings these configs reproduce)."""
    d, f, t_tiny, t_cpu = demo(), figures(), ttsc("trm_sudoku_tiny"), ttsc("trm_sudoku_cpu")
    gc, tc, (g0, g1) = final("gpt_shakespeare_char_cpu"), final("trm_sudoku_cpu"), gpt_tiny()
    tr, trm, trm_r, g = f["trainer"], f["trm"], f["trm_r"], f["gpt"]
    cold, warm, h100 = f["cold"]["best"], f["warm"]["best"], f["h100_nanogpt"]["best"]
    bench = "[benchmarks](docs/benchmarks.md#results-on-a-gpu)"
    rows = [
        ("trm_sudoku_tiny", "`make demo`: tiny TRM-MLP on generated Sudoku (30 blanks, half laid "
         "out as printed puzzles are), CPU", f"measured: held-out exact accuracy {d['final']} at "
         f"step {d['step']}, by ACT step {' → '.join(d['steps'])}; on published-style puzzles "
         "(sudoku-hard-test-1k's, 30 of their own blanks left, symmetric and in patches) "
         f"{d['published']}; test-time scaling gains nothing on it (a run at {t_tiny['plain']:.2f}: "
         f"{t_tiny['at_K']:.2f} at K = {t_tiny['K']})"),
        ("gpt_shakespeare_char_tiny", "nanoGPT's CPU recipe, shortened",
         f"measured: val loss {g0} → {g1} at step 300"),
        ("gpt_shakespeare_char_cpu", "nanoGPT's README CPU recipe, exactly (2000 iterations)",
         f"measured, {gc['n']} seeds: val loss {spread(gc['jax'], 3)} at {gc['step']}; upstream's "
         f"train.py {spread(gc['upstream'], 3)} (README: 1.88)"),
        ("trm_sudoku_cpu", "TRM-MLP on generated Sudoku with 50 blanks, 4000 steps, ~5 min on 2 "
         "CPU cores", f"measured, {tc['n']} seeds: held-out exact accuracy {spread(tc['jax'], 2)}; "
         f"upstream's pretrain.py {spread(tc['upstream'], 2)}; by ACT step 0 → ~0.15 → ~0.4 → … → "
         f"0.6. Test-time scaling (`--trajectories {t_cpu['K']} --noise {t_cpu['sigma']:g}`, one "
         f"seed): {t_cpu['plain']:.3f} → {t_cpu['at_K']:.3f} "
         "([docs](docs/evaluation.md#test-time-scaling))"),
        ("trm_sudoku", f"upstream's TRM-MLP Sudoku-Extreme run (batch 768, {f['steps']:,} steps, "
         f"EMA)", f"paper: 87.4% exact. One H200: the trainer {1e3 * tr['trainer_s_per_step']:.1f}"
         f" ms per step (~{f['steps'] * tr['trainer_s_per_step'] / 3600:.1f} h), "
         f"x{tr['trainer_over_bare']:.3f} its bare step; the step "
         f"{trm['torch_eager']['step_ms_median'] / trm['jax']['step_ms_median']:.2f}x torch eager, "
         f"torch.compile {trm_r['jax/torch_compile']['median']:.2f}x faster; upstream's "
         f"pretrain.py ~{f['upstream_h']:.1f} h. XLA's Triton GEMMs off (its config's default): "
         f"the bare step {1e3 * f['off']['step_time_s']['median']:.1f} ms instead of "
         f"{f['base_ms']:.1f} (x{f['off']['ratio_to_base']:.2f}); the trainer and torch with it not "
         f"measured yet ({bench})"),
        ("trm_sudoku_att", "the attention variant", "paper: ~75% exact"),
        ("trm_maze", "Maze-Hard 30×30", "paper: ~85% exact"),
        ("trm_arc1`, `trm_arc2", "ARC-AGI-1/2 + ConceptARC, upstream's voting evaluator",
         "paper: pass@2 ~45% / ~8%"),
        ("hrm_sudoku", "the HRM baseline", "paper: ~55% exact"),
        ("gpt_shakespeare_char", "nanoGPT's shakespeare_char config", "nanoGPT: val loss ~1.47. "
         f"One H200: {cold['value']:.3f} at step {cold['step']}, {round(cold['t'])} s after the "
         f"command started, {round(warm['t'])} s with a warm compilation cache (on an H100 "
         f"nanoGPT's train.py: {h100['value']:.3f} at step {h100['step']} in {round(h100['t'])} s)"),
        ("gpt2_124m", "nanoGPT's OpenWebText GPT-2 124M config", "nanoGPT: val loss ~2.85. Speed on"
         f" one H200 (12 x 1024 tokens): {g['jax']['step_ms_median']:.1f} ms per step, "
         f"{round(100 * g['jax']['mfu'])}% MFU; torch eager {g['torch_eager']['step_ms_median']:.1f}"
         f" ms, torch.compile {g['torch_compile']['step_ms_median']:.1f} ms. The loss by "
         f"logsumexp, its config's default: x{f['lse']:.3f} the step time (against torch: not "
         "measured yet)"),
    ]  # fmt: skip
    lines = ["| experiment | what | result |", "|---|---|---|"]
    return "\n".join(lines + [f"| `{name}` | {what} | {result} |" for name, what, result in rows])


def table_gpu() -> str:
    """Every GPU figure: what was measured, the result, the record, and the part of `python -m
    bench gpu` that measures it again."""
    f, run2, h200, h100 = (
        figures(),
        "h200_run2/results.jsonl",
        "h200/results.jsonl",
        "h100/results.jsonl",
    )
    combo = _variants(_json("h200_run2/trm_combo_third_call.json"))
    ln = flag_lines("h200_run2/gpt2_flags_third_call.log")["sets"]
    up = f["up"]
    rows = [
        ("trm_sudoku: the trainer against its bare step, the trainer's own batches",
         gpu.show_trainer(f["trainer"]), run2, "trm_sudoku.trainer"),
        ("trm_sudoku: JAX, torch eager, torch.compile, interleaved on Sudoku-Extreme batches",
         gpu.show_speed(part(h200, "b.trm_sudoku")["bench"]), h200, "trm_sudoku.speed"),
        ("gpt2_124m (12 x 1024 tokens, Zipf(1) ids): the same",
         gpu.show_speed(part(h200, "c.gpt2_124m")["bench"]), h200, "gpt2_124m.speed"),
        ("gpt2_124m: candidate step variants against the default (then log_softmax)",
         gpu.show_variants(_json("h200_run2/gpt2_variants_second_call.json")),
         "h200_run2/gpt2_variants_second_call.json", "gpt2_124m.variants"),
        ("gpt_shakespeare_char to val loss 1.47, cold (start-up and compile count)",
         gpu.show_target(f["cold"]), "h200/results_second_call.jsonl", "shakespeare.ours"),
        ("the same on an H100; nanoGPT's train.py there", gpu.show_target(f["h100_ours"]) +
         "; nanoGPT's: " + gpu.show_target(f["h100_nanogpt"]), h100, "shakespeare.nanogpt"),
        ("the same with a warm compilation cache", gpu.show_target(f["warm"]),
         "h200/results_second_call.jsonl", "shakespeare.ours_warm"),
        ("`pytest -m gpu`: cuDNN attention against the written-out one, both models",
         gpu.show_pytest(part(h200, "a.pytest")), h200, "pytest_gpu"),
        ("nanoGPT module by module, torch on CUDA (flash SDPA, cuBLAS, autocast), bf16",
         f"{part(run2, 'a.parity_gpt')['passed']} passed, {part(run2, 'a.parity_gpt')['failed']} "
         "failed", run2, "parity_gpt"),
        ("trm_sudoku: XLA:GPU flag sets against the default of the time (Triton GEMMs on)",
         gpu.show_flags(part(run2, "d.trm_sudoku_flags")), run2, "trm_sudoku.flags"),
        ("gpt2_124m: XLA:GPU flag sets (cuDNN LayerNorm: one base beside it, unconfirmed)",
         gpu.show_flags(part(run2, "d.gpt2_124m_flags")) + "; " + gpu.show_flags({"sets": ln}),
         run2, "gpt2_124m.flags"),
        ("trm_sudoku_att: Triton GEMMs off", "not measured yet", "", "trm_sudoku_att.flags"),
        ("trm_sudoku: step variants (Triton GEMM on)",
         gpu.show_variants(part(run2, "d.trm_sudoku_variants")), run2, "trm_sudoku.variants"),
        ("the same, Triton GEMMs off", gpu.show_variants({"rows": list(combo.values())}),
         "h200_run2/trm_combo_third_call.json", "trm_sudoku.variants"),
        *[(f"{c}: where the {impl} step's time goes, per op", gpu.show_profile(part(run2, k)),
           run2, f"{c}.profile_{impl}")
          for c, impl, k in (("trm_sudoku", "jax", "c.trm_sudoku_jax"),
                             ("trm_sudoku", "torch_compile", "c.trm_sudoku_torch_compile"),
                             ("gpt2_124m", "jax", "c.gpt2_124m_jax"),
                             ("gpt2_124m", "torch_compile", "c.gpt2_124m_torch_compile"))],
        ("upstream's pretrain.py on trm_sudoku's data (eager, AdamATan2's reference kernel)",
         f"{gpu.show_throughput(up)}; {f['steps']:,} steps ~ {f['upstream_h']:.1f} h", h200,
         "trm_sudoku.upstream"),
    ]  # fmt: skip
    lines = ["| measured | result | record (bench/results/) | `--parts` |", "|---|---|---|---|"]
    for what, result, record, key in rows:
        where = f"`{record}`" if record else ""
        lines.append(f"| {what} | {result.replace('|', '/')} | {where} | `{key}` |")
    return "\n".join(lines)


def table_gpu_plan() -> str:
    """`python -m bench gpu`'s parts in the order they run, each with its box and command."""
    ctx = gpu.Ctx(out=Path("OUT"), work=Path("WORK"), assets=Path("ASSETS"), dry_run=False)
    lines = ["| part | box s | command (`python ...`) |", "|---|---|---|"]
    for p in gpu.plan():
        f = p.fields(ctx)
        argv = " ".join(token.format(**f) for token in p.argv.split())
        argv = re.sub(r" --data(-path)?=(?= |$)", "", argv)  # no data set: no flag
        lines.append(f"| `{p.key}` | {p.box:.0f} | `{argv.replace('|', '/')}` |")
    return "\n".join(lines)


def table_cpu_speed() -> str:
    return "\n\n".join(
        speed_markdown(_json(f"cpu/{d}/bench.json")) for d in ("all_threads", "threads1")
    )


def table_cpu_ttq() -> str:
    return "\n\n".join(ttq_markdown(_json(f"cpu/{d}/ttq.json")) for d in ("ttq", "ttq_all_threads"))


def table_remat_policy() -> str:
    r = _json("cpu/variants_trm_sudoku_remat_policy.json")
    lines = ["| variant | lower s | compile s | step (x the first) | XLA temp memory |",
             "|---|---|---|---|---|"]  # fmt: skip
    for i, v in enumerate(r["rows"]):
        name = ", ".join(f"{k}={str(x).lower()}" for k, x in v["overrides"].items()) or "unrolled"
        step = f"{1e3 * v['step_time_s']['median']:.0f} ms (1.00)" if i == 0 else (
            f"{v['ratio_to_baseline']['median']:.2f}")  # fmt: skip
        lines.append(f"| {name} | {v['lower_s']:.1f} | {v['compile_s']:.1f} | {step} | "
                     f"{v['temp_bytes'] / 2**20:.0f} MiB |")  # fmt: skip
    return "\n".join(lines)


def table_curves() -> str:
    out = []
    for name, rec in _json("curves/curves.json")["configs"].items():
        s, runs = rec["summary"], rec["runs"]
        t = {i: round(v["median_s"]) for i, v in s["time_to_target"].items()}
        walls = {i: round(statistics.median(r["wall_s"] for r in runs[i].values())) for i in runs}
        out += [f"**{name}** (`{s['metric']}`, {final(name)['n']} seeds a side):", "",
                *step_table(rec), "", textwrap.fill(f"Our mean within upstream's seed range at "
                f"{s['within_spread'].replace('/', ' of ')} evaluations. Time to {s['metric']} "
                f"{'<=' if s['mode'] == 'min' else '>='} {s['target']} (the first evaluation "
                f"there, seconds from the process's start, median over seeds): ours {t['jax']} s, "
                f"upstream {t['upstream']} s; whole runs {walls['jax']} s and {walls['upstream']} s.", 100),
                ""]  # fmt: skip
    return "\n".join(out[:-1])


# ----------------------------------------------------------------------------------------------
# The docs


def render(text: str) -> str:
    """`text` with every generated table replaced by the generator's."""
    return _REGION.sub(lambda m: m[1] + globals()[f"table_{m[2]}"]() + "\n" + m[4], text)


def stale() -> list[str]:
    """The docs whose generated tables differ from the records (or lack one they should hold)."""
    out = []
    for name, regions in DOCS.items():
        text = (REPO / name).read_text()
        found = [m[2] for m in _REGION.finditer(text)]
        if found != list(regions) or render(text) != text:
            out.append(name)
    return out


def main(argv: list[str] | None = None) -> None:
    p = OneLineParser(prog="python -m bench tables", description=__doc__.split("\n")[0])
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 if a doc differs")
    a = p.parse_args(argv)
    differ = stale()
    if a.check:
        if differ:
            raise ConfigError(
                f"bench tables: out of date: {', '.join(differ)} (python -m bench tables)"
            )
        return
    for name in differ:
        path = REPO / name
        path.write_text(render(path.read_text()))
        print(f"wrote {name}")
