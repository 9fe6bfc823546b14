"""One source for each figure: every measured result this repository states in more than one place
is checked here against the place that holds it.

- Whole runs against upstream (gpt_shakespeare_char_cpu, trm_sudoku_cpu): the source is the runs
  themselves, bench/results/curves/curves.json (written by `python -m bench curves`). The final
  evaluation's mean [min, max] of each side, the seed counts and the times to target, as the
  README's experiments table, docs/benchmarks.md, docs/training.md and the experiment configs
  state them, and the tables docs/benchmarks.md copies from bench/results/curves/curves.md.
- `make demo` (trm_sudoku_tiny): the source is bench/results/demo_seeds.json (five seeds,
  written by `python -m bench demo`); docs/training.md's "Tiny runs" row, the experiment config,
  docs/evaluation.md and the comment above tests/test_reproductions.py's bound state them.
- `make demo` and `make test` from a fresh clone: the sources are bench/results/timings/*.json
  (written by `python -m bench timings`); the tables of the README and docs/testing.md.
- gpt_shakespeare_char_tiny: the source is docs/training.md's "Tiny runs" table; the README row and
  the experiment config state the same values.
- Test-time scaling: the source is bench/results/ttsc/<name>.json (written by `python -m bench
  ttsc`); docs/evaluation.md's table, the README rows and the reproduction's bound state it.
- The GPU sessions: the sources are bench/results/<device>/results.jsonl (written by `python -m
  bench gpu`); docs/benchmarks.md's table of each session states its figures, and the README rows
  the latest session's (H200).

A rerun of a measurement changes its source; this test then names every place still stating the
old value.
"""

from __future__ import annotations

import json
import os
import re

import pytest

from tests.helpers import REPO

CURVES = os.path.join(REPO, "bench", "results", "curves")


def _read(path: str) -> str:
    with open(os.path.join(REPO, path)) as f:
        return f.read()


def _readme_row(name: str) -> str:
    (row,) = [line for line in _read("README.md").splitlines() if line.startswith(f"| `{name}` ")]
    return row


def _header(name: str) -> str:
    """The comment block an experiment config starts with, as one line of text."""
    lines = _read(f"configs/experiment/{name}.yaml").splitlines()
    comments = [line.lstrip("#").strip() for line in lines if line.startswith("#")]
    return " ".join(comments)


@pytest.fixture(scope="module")
def curves() -> dict:
    with open(os.path.join(CURVES, "curves.json")) as f:
        return json.load(f)["configs"]


def _final(summary: dict, impl: str) -> dict:
    """The last evaluation both sides have (ours also evaluates after the last update)."""
    steps = [s for s in summary["per_step"] if "jax" in s and "upstream" in s]
    return steps[-1][impl] | {"step": steps[-1]["step"]}


def _spread(f: dict, digits: int) -> str:
    return f"{f['mean']:.{digits}f} [{f['min']:.{digits}f}, {f['max']:.{digits}f}]"


# experiment -> (digits in the README / configs / training.md, digits in docs/benchmarks.md' text)
WHOLE_RUNS = {"gpt_shakespeare_char_cpu": (3, 3), "trm_sudoku_cpu": (2, 3)}


@pytest.mark.parametrize("name", sorted(WHOLE_RUNS))
def test_whole_run_results_are_the_runs_in_curves_json(curves, name):
    short, long = WHOLE_RUNS[name]
    summary = curves[name]["summary"]
    ours, theirs = _final(summary, "jax"), _final(summary, "upstream")
    n = ours["n"]
    assert theirs["n"] == n
    places = {
        "README.md": _readme_row(name),
        f"configs/experiment/{name}.yaml": _header(name),
        "docs/training.md": next(
            line for line in _read("docs/training.md").splitlines()
            if line.startswith(f"| {name} ")
        ),
    }  # fmt: skip
    for where, text in places.items():
        for f in (ours, theirs):
            assert _spread(f, short) in text, f"{where} should state {_spread(f, short)}: {text}"
        assert f"{n} seeds" in text, f"{where} should say {n} seeds: {text}"
    bench = " ".join(_read("docs/benchmarks.md").split())  # sentences wrap over lines
    for f in (ours, theirs):
        assert _spread(f, long) in bench, f"docs/benchmarks.md should state {_spread(f, long)}"
    times = summary["time_to_target"]
    for impl in ("jax", "upstream"):
        seconds = round(times[impl]["median_s"])
        assert re.search(rf"\b(ours|upstream) {seconds} s\b", bench), (name, impl, seconds)


def test_benchmarks_tables_are_curves_md(curves):
    """docs/benchmarks.md's per-evaluation tables are bench curves' own table rows."""
    bench = _read("docs/benchmarks.md").splitlines()
    rows = [line for line in open(os.path.join(CURVES, "curves.md")).read().splitlines()]
    rows = [r for r in rows if re.match(r"\| \d+ \|", r)]
    assert len(rows) >= sum(len(c["summary"]["per_step"]) for c in curves.values())
    missing = [r for r in rows if r not in bench]
    assert not missing, missing


def _tiny_row(name: str) -> str:
    (row,) = [
        line for line in _read("docs/training.md").splitlines() if line.startswith(f"| {name} ")
    ]
    return row


def _demo_seeds() -> dict:
    with open(os.path.join(REPO, "bench", "results", "demo_seeds.json")) as f:
        return json.load(f)


def test_demo_figures_are_the_demo_seeds():
    """`make demo` over seeds, bench/results/demo_seeds.json (written by `python -m bench demo`):
    its summary is its seeds' own, and the held-out exact accuracy (mean [min, max]), the mean
    per ACT step and the accuracy on grids made another way (published-style blanks; and random
    ones) are what docs/training.md's "Tiny runs" row, the experiment's header, the README and
    docs/evaluation.md state; on published-style grids the demo is within 0.05 of its own split;
    the reproduction's bounds are under every seed's, which their comments cite."""
    from bench.demo import summary

    r = _demo_seeds()
    s = r["summary"]
    assert s == summary(r["seeds"])
    n, test, other, published = s["n"], s["test"], s["other"], s["published"]
    assert abs(published["exact_accuracy"]["mean"] - test["exact_accuracy"]["mean"]) <= 0.05
    final = f"{_spread(test['exact_accuracy'], 2)} over {n} seeds"
    steps = [f"{x['mean']:.2f}" for x in test["per_step_exact_accuracy"]]
    made_otherwise = f"{_spread(other['exact_accuracy'], 2)} on {r['other']['count']}"
    printed = f"{_spread(published['exact_accuracy'], 2)} on {r['published']['count']}"
    row, header = _tiny_row("trm_sudoku_tiny"), _header("trm_sudoku_tiny")
    evaluation = " ".join(_read("docs/evaluation.md").split())
    for where, text, arrow, figures in (
        ("docs/training.md", row, ", ", (made_otherwise, printed)),
        ("configs/experiment/trm_sudoku_tiny.yaml", header, " -> ", (made_otherwise, printed)),
        ("README.md", _readme_row("trm_sudoku_tiny"), " → ", (printed,)),
    ):
        assert final in text, f"{where} should state {final}: {text}"
        assert arrow.join(steps) in text, f"{where} should state {arrow.join(steps)}: {text}"
        for figure in figures:
            assert figure in text, f"{where} should state {figure}: {text}"
    assert final in evaluation, f"docs/evaluation.md should state {final}"
    gains = [t["test"]["per_step_exact_accuracy"][-1] - t["test"]["per_step_exact_accuracy"][0]
             for t in r["seeds"]]  # fmt: skip
    text = _read("tests/test_reproductions.py")
    assert (
        f"per ACT step {', '.join(steps)} (means; gain {min(gains):.2f} to {max(gains):.2f})"
        in text
    )
    bound = float(re.search(r"DEMO_ACT_GAIN_MIN = ([\d.]+)", text).group(1))
    assert bound < min(gains)
    printed = [t["published"]["exact_accuracy"] for t in r["seeds"]]
    assert f"{min(printed):.3f} to {max(printed):.3f}" in text
    assert float(re.search(r"DEMO_PUBLISHED_MIN = ([\d.]+)", text).group(1)) < min(printed)


def test_timing_tables_are_the_records():
    """README.md's and docs/testing.md's timing rows are bench/results/timings/'s records
    (`python -m bench timings`), "not measured yet" where there is none; the default tier of the
    quiet AVX2 record took under 10 minutes."""
    from bench.timings import TABLE_FILES, records, table_rows

    for name in TABLE_FILES:
        lines = _read(name).splitlines()
        for row in table_rows():
            assert row in lines, f"{name} should have the row {row}"
    avx2 = records()["avx2"]
    if avx2 is not None and "test" in avx2:
        assert avx2["test"]["run"]["wall_s"] < 600, avx2["test"]["run"]


def test_gpt_tiny_figures_are_the_tiny_runs_table():
    row = _tiny_row("gpt_shakespeare_char_tiny")
    last = re.search(r"(\d\.\d\d) @30\d \(from ln 65 = (\d\.\d\d)\)", row)
    start, end = last.group(2), last.group(1)
    assert f"val loss {start} → {end} at step 300" in _readme_row("gpt_shakespeare_char_tiny")
    header = _header("gpt_shakespeare_char_tiny")
    assert f"from {start} (ln 65) to {end} at step 300" in header, header


def test_the_reproduction_bound_cites_the_measured_range(curves):
    """tests/test_reproductions.py sets TRM_EXACT_MIN below the range of all 6 final runs."""
    summary = curves["trm_sudoku_cpu"]["summary"]
    finals = [_final(summary, impl) for impl in ("jax", "upstream")]
    low, high = min(f["min"] for f in finals), max(f["max"] for f in finals)
    text = _read("tests/test_reproductions.py")
    assert f"{low:.3f} to {high:.3f}" in text
    bound = float(re.search(r"TRM_EXACT_MIN = ([\d.]+)", text).group(1))
    assert bound < low


def _ttsc(name: str) -> dict:
    with open(os.path.join(REPO, "bench", "results", "ttsc", f"{name}.json")) as f:
        return json.load(f)


def test_test_time_scaling_figures_are_the_bench_results():
    docs = _read("docs/evaluation.md")
    for name, ks in (("trm_sudoku_cpu", ("16", "32")), ("trm_sudoku_tiny", ("16",))):
        r = _ttsc(name)
        t, plain = r["test"], r["test"]["plain"]["exact_accuracy"]
        for k in ks:
            c = t["curve"][k]
            row = (
                f"| {t['count']} | {plain:.3f} | {r['sigma_star']} | {k} | "
                f"{c['exact_accuracy']:.3f}"
            )
            assert row.replace("**", "") in docs.replace("**", ""), (name, k, row)
            assert f"{c['oracle_exact_accuracy']:.3f} |" in docs, (name, k)
        K = str(r["trajectories"])
        readme = _readme_row(name)
        if name == "trm_sudoku_cpu":
            assert f"{plain:.3f} → {t['curve'][K]['exact_accuracy']:.3f}" in readme, readme
            assert f"`--trajectories {K} --noise {r['sigma_star']:g}`" in readme, readme
            text = _read("tests/test_reproductions.py")
            gain = t["curve"]["16"]["exact_accuracy"] - plain
            assert f"gain {gain:.3f}" in text
            trajectories, noise, bound = re.search(
                r"TTSC_TRAJECTORIES, TTSC_NOISE, TTSC_GAIN_MIN = (\d+), ([\d.]+), ([\d.]+)", text
            ).groups()
            assert (int(trajectories), float(noise)) == (16, r["sigma_star"])
            assert float(bound) < gain / 2
        else:
            assert (
                f"a run at {plain:.2f}: {t['curve'][K]['exact_accuracy']:.2f} at K = {K}" in readme
            )


def _gpu_parts(device: str, name: str = "results.jsonl") -> dict:
    with open(os.path.join(REPO, "bench", "results", device, name)) as f:
        records = [json.loads(line) for line in f]
    return {r["part"]: r for r in records if r.get("kind") == "part"}


def _h100_parts() -> dict:
    return _gpu_parts("h100")


def test_gpu_figures_are_the_h100_session():
    parts = _h100_parts()
    bench_md = _read("docs/benchmarks.md")
    gpu = bench_md[bench_md.index("## GPU: one H100 session") :]
    gpu = gpu[: gpu.index("### What a GPU session runs")]

    def rows(part):
        table = parts[part]["result"]["table"]
        impls = {r["impl"]: r for r in table if "impl" in r}
        return impls, {r["ratio"]: r for r in table if "ratio" in r}

    trm, trm_ratios = rows("b.trm_sudoku")
    jax_ms, eager_ms = trm["jax"]["step_ms_median"], trm["torch_eager"]["step_ms_median"]
    paired = trm_ratios["jax/torch_eager"]
    for figure in (
        f"{jax_ms:.1f} ms per step ({100 * trm['jax']['mfu']:.1f}% MFU)",
        f"{eager_ms:.1f} ms ({100 * trm['torch_eager']['mfu']:.1f}%)",
        f"{eager_ms / jax_ms:.2f}x",
        f"{paired['median']:.3f} [IQR {paired['q1']:.3f}-{paired['q3']:.3f}]",
    ):
        assert figure in gpu, figure
    assert trm["torch_compile"]["status"] == "error" and "not measured" in gpu

    gpt, gpt_ratios = rows("b.gpt2_124m")
    for impl in ("jax", "torch_eager", "torch_compile"):
        ms, mfu = gpt[impl]["step_ms_median"], gpt[impl]["mfu"]
        assert f"{ms:.1f} ms" in gpu and f"{100 * mfu:.1f}%" in gpu, impl
    for ratio in ("jax/torch_eager", "jax/torch_compile"):
        assert f"{gpt_ratios[ratio]['median']:.3f}" in gpu, ratio

    for part, digits in (("c.jax", 4), ("c.upstream", 4)):
        best = parts[part]["result"]["best"]
        assert f"{best['value']:.{digits}f} at step {best['step']}" in gpu, part
        assert f"{best['t']:.1f} s" in gpu, part
    best = parts["c.upstream"]["result"]["best"]  # the README's comparison with nanoGPT's own
    assert f"{best['value']:.3f} at step {best['step']} in {round(best['t'])} s" in _readme_row(
        "gpt_shakespeare_char"
    )

    d = parts["d.jax"]["result"]
    assert f"{d['step_time_ms_median'] / 1e3:.2f} s per step" in gpu
    assert f"~{round(d['projected_h_from_step_time'])} h" in gpu


def _bench_rows(part: dict) -> tuple[dict, dict]:
    table = part["result"]["table"]
    return {r["impl"]: r for r in table if "impl" in r}, {
        r["ratio"]: r for r in table if "ratio" in r
    }


def test_gpu_figures_are_the_h200_session():
    parts = _gpu_parts("h200")
    parts.update(_gpu_parts("h200", "results_second_call.jsonl"))
    bench_md = _read("docs/benchmarks.md")
    gpu = bench_md[bench_md.index("## GPU: one H200 session") :]
    gpu = gpu[: gpu.index("## GPU: one H100 session")]

    t = parts["b.trainer"]["result"]
    for figure in (
        f"`trainer_over_bare` {t['trainer_over_bare']:.3f}",
        f"trainer {1e3 * t['trainer_s_per_step']:.1f} ms per step, bare "
        f"{1e3 * t['bare_s_per_step']:.1f} ms",
        f"**~{t['projected_h']:.1f} h** ({t['projected_h']:.2f} h at the trainer's "
        f"{1e3 * t['trainer_s_per_step']:.1f} ms per step",
    ):
        assert figure in gpu, figure
    row = _readme_row("trm_sudoku")
    assert f"{1e3 * t['trainer_s_per_step']:.1f} ms per step (~{t['projected_h']:.1f} h)" in row
    old = parts["b.trainer_scatter_bf16"]["result"]
    assert (
        f"trainer {1e3 * old['trainer_s_per_step']:.1f} ms per step, bare\n"
        f"{1e3 * old['bare_s_per_step']:.1f} ms, `trainer_over_bare` {old['trainer_over_bare']:.3f}"
    ) in gpu
    blank = t["first_batch_token_counts"]["1"] / sum(t["first_batch_token_counts"].values())
    assert f"{100 * blank:.1f}% of the 62,208" in gpu
    for part, name in (("c.trainer_scatter_f32", "scatter_f32"), ("c.trainer_sparse", "sparse")):
        ms = 1e3 * parts[part]["result"]["trainer_s_per_step"]
        assert f"{name}` {ms:.1f} ms" in gpu, part

    trm, ratios = _bench_rows(parts["b.trm_sudoku"])
    jax_ms, eager_ms, comp_ms = (
        trm[k]["step_ms_median"] for k in ("jax", "torch_eager", "torch_compile")
    )
    paired, vs_compile = ratios["jax/torch_eager"], ratios["jax/torch_compile"]
    for figure in (
        f"**met**: {eager_ms / jax_ms:.2f}x. JAX {jax_ms:.1f} ms per step ({100 * trm['jax']['mfu']:.1f}% MFU)",
        f"torch eager {eager_ms:.1f} ms ({100 * trm['torch_eager']['mfu']:.1f}%)",
        f"paired {paired['median']:.3f} [IQR {paired['q1']:.3f}-{paired['q3']:.3f}]",
        f"torch.compile {comp_ms:.1f} ms ({100 * trm['torch_compile']['mfu']:.1f}%)",
        f"JAX/torch.compile {vs_compile['median']:.3f} [IQR {vs_compile['q1']:.3f}-{vs_compile['q3']:.3f}]",
    ):
        assert figure in gpu, figure
    assert f"{eager_ms / jax_ms:.2f}x torch eager" in row
    assert f"torch.compile {vs_compile['median']:.2f}x faster" in row

    up = parts["d.upstream"]["result"]
    assert f"{up['steps_per_s']:.2f} steps per second over\n{up['measured_steps']} steps" in gpu
    assert f"**~{up['projected_h']:.1f} h**" in gpu and f"~{up['projected_h']:.1f} h" in row
    assert f"{up['projected_h'] / t['projected_h']:.1f}x faster" in gpu

    gpt, gpt_ratios = _bench_rows(parts["c.gpt2_124m"])
    for impl in ("jax", "torch_eager", "torch_compile"):
        ms, mfu = gpt[impl]["step_ms_median"], gpt[impl]["mfu"]
        assert f"{ms:.1f} ms" in gpu and f"{100 * mfu:.1f}%" in gpu, impl
        assert f"{ms:.1f} ms" in _readme_row("gpt2_124m"), impl
    assert f"{round(100 * gpt['jax']['mfu'])}% MFU" in _readme_row("gpt2_124m")
    for ratio in ("jax/torch_eager", "jax/torch_compile"):
        assert f"{gpt_ratios[ratio]['median']:.3f}" in gpu, ratio

    row = _readme_row("gpt_shakespeare_char")
    cold, warm = parts["e.jax_cold"]["result"], parts["e.jax_warm"]["result"]
    assert (
        f"{warm['best']['value']:.4f} at step {warm['best']['step']}, {warm['best']['t']:.1f} s"
        in gpu
    )
    assert f"(first step at {warm['first_step_s']:.1f} s)" in gpu
    assert (
        f"{cold['best']['value']:.4f} at step {cold['best']['step']} in {cold['best']['t']:.1f} s"
        in gpu
    )
    assert f"(first step at {cold['first_step_s']:.1f} s)" in gpu
    assert (
        f"{cold['best']['value']:.3f} at step {cold['best']['step']}, {round(cold['best']['t'])} s"
        in row
    )
    assert f"{round(warm['best']['t'])} s with a warm compilation cache" in row


def _run2(name: str):
    path = os.path.join(REPO, "bench", "results", "h200_run2", name)
    if name.endswith(".json"):
        with open(path) as f:
            return json.load(f)
    with open(path) as f:  # a flag sweep's log: its FLAGS lines
        return [json.loads(line[len("FLAGS ") :]) for line in f if line.startswith("FLAGS {")]


def _variant_rows(result: dict) -> dict:
    """bench.variants rows by their overrides ("" for the default)."""
    return {",".join(f"{k}={v}" for k, v in r["overrides"].items()): r for r in result["rows"]}


def test_gpu_figures_are_the_second_h200_session():
    """Every figure of docs/benchmarks.md "GPU: the second H200 session", and the configs' comments
    and README lines that quote them, against bench/results/h200_run2/."""
    parts = _gpu_parts("h200_run2")
    bench_md = _read("docs/benchmarks.md")
    gpu = bench_md[bench_md.index("## GPU: the second H200 session") :]
    gpu = " ".join(gpu[: gpu.index("## GPU: one H200 session")].split())  # lines joined
    ms = lambda s: 1e3 * s["step_time_s"]["median"]  # noqa: E731
    iqr = lambda r: f"[IQR {r['q1']:.3f}-{r['q3']:.3f}]"  # noqa: E731
    gib = lambda r: f"{r['temp_bytes'] / 2**30:.1f} GiB"  # noqa: E731

    parity = parts["a.parity_gpt"]["result"]
    assert f"{parity['passed']} passed, {parity['failed']} failed" in gpu
    t = parts["b.trainer"]["result"]
    assert (
        f"trainer {1e3 * t['trainer_s_per_step']:.1f} ms per step, bare "
        f"{1e3 * t['bare_s_per_step']:.1f} ms, `trainer_over_bare` {t['trainer_over_bare']:.3f}; "
        f"~{t['projected_h']:.1f} h"
    ) in gpu

    sets = parts["d.trm_sudoku_flags"]["result"]["sets"]
    bases = [f"{ms(s):.1f}" for s in sets if s["name"] == "base"]
    assert f"base {bases[0]} and {bases[1]} ms" in gpu
    (off,) = [s for s in sets if s["name"] == "no_triton_gemm"]
    (cb,) = [s for s in sets if s["name"] == "no_command_buffer"]
    assert f"Triton GEMM off: {ms(off):.1f} ms, **x{off['ratio_to_base']:.3f}**" in gpu
    assert f"command buffers off: x{cb['ratio_to_base']:.3f}" in gpu

    v = _variant_rows(parts["d.trm_sudoku_variants"]["result"])
    split, f32 = v["split_gate_up=True"], v["loss_dtype=float32"]
    assert f"default {ms(v['']):.1f} ms" in gpu
    assert (
        f"`split_gate_up=true` {ms(split):.1f} ms, x{split['ratio_to_baseline']['median']:.3f} "
        f"{iqr(split['ratio_to_baseline'])}"
    ) in gpu
    assert f"`loss_dtype=float32` x{f32['ratio_to_baseline']['median']:.3f}" in gpu
    combo = _variant_rows(_run2("trm_combo_third_call.json"))
    c_split = combo["split_gate_up=True"]
    assert (
        f"default {ms(combo['']):.1f} ms; `split_gate_up=true` {ms(c_split):.1f} ms, "
        f"x{c_split['ratio_to_baseline']['median']:.3f} {iqr(c_split['ratio_to_baseline'])}. "
        f"Temporary memory: {gib(combo[''])}, with `split_gate_up` {gib(c_split)} "
        f"(Triton GEMM on: {gib(v[''])})"
    ) in gpu
    extra = (combo[""]["temp_bytes"] - v[""]["temp_bytes"]) / 2**30
    assert f"It costs {round(extra)} GiB of temporary memory at batch 768 ({gib(combo[''])})" in gpu
    cost = c_split["ratio_to_baseline"]["median"] - 1
    assert f"for {100 * cost:.1f}% of the step time" in gpu

    g = _variant_rows(_run2("gpt2_variants_second_call.json"))
    lse, flat = g["cross_entropy_impl=logsumexp"], g["optim.adamw_flat=True"]
    assert f"default {ms(g['']):.1f} ms" in gpu
    assert (
        f"`cross_entropy_impl=logsumexp` {ms(lse):.1f} ms, "
        f"**x{lse['ratio_to_baseline']['median']:.3f}** {iqr(lse['ratio_to_baseline'])}, "
        f"temporary memory {lse['temp_bytes'] / 2**20:,.0f} MiB instead of "
        f"{g['']['temp_bytes'] / 2**20:,.0f}"
    ) in gpu
    assert (
        f"`optim.adamw_flat=true` {ms(flat):.1f} ms, x{flat['ratio_to_baseline']['median']:.3f} "
        f"{iqr(flat['ratio_to_baseline'])}"
    ) in gpu
    (no_triton,) = [
        s for s in parts["d.gpt2_124m_flags"]["result"]["sets"] if s["name"] == "no_triton_gemm"
    ]
    assert f"Triton GEMM off: x{no_triton['ratio_to_base']:.3f}" in gpu
    base, ln = _run2("gpt2_flags_third_call.log")
    assert (base["name"], ln["name"]) == ("base", "cudnn_layer_norm")
    assert f"cuDNN LayerNorm {ms(ln):.1f} ms beside one base run of {ms(base):.1f} ms" in gpu

    e = parts["d.early_curve"]["result"]
    last = e["rows"][-1]
    worst = max(e["rows"], key=lambda r: r["lm_loss_rel_diff"] or 0)
    assert e["halting_differs_at"] == [] and len(e["rows"]) == e["steps"] == 50
    assert (
        f"lm_loss at step {last['step']}: upstream {last['lm_loss'][0]:.4f}, ours "
        f"{last['lm_loss'][1]:.4f}; the largest relative difference "
        f"{e['lm_loss_rel_diff_max']:.2e} (step {worst['step']})"
    ) in gpu
    halted = [r["step"] for r in e["rows"] if r["halted"] == [768, 768]]
    assert halted == [r["step"] for r in e["rows"] if any(r["halted"])] == [16, 32, 48]
    assert (
        f"upstream's pretrain.py {1e3 * e['upstream_s_per_step']:.0f} ms per step" in gpu
        and f"ours {1e3 * e['ours_s_per_step']:.1f} ms" in gpu
    )

    def top(part, name):
        (row,) = [r for r in parts[part]["result"]["rows"] if r[0] == name]
        return row

    for part, name, fig in (
        ("c.trm_sudoku_jax", "custom-call", "{ms:.1f} ms in {n} calls"),
        ("c.trm_sudoku_jax", "gemm_fusion_dot", "{ms:.1f} ms in {n}"),
        ("c.trm_sudoku_jax", "loop_multiply_fusion", "{ms:.1f} ms"),
        ("c.trm_sudoku_jax", "wrapped_concatenate", "{ms:.1f} ms in {n}"),
        ("c.gpt2_124m_jax", "input_reduce_fusion", "{ms:.1f} ms in {n}"),
        ("c.gpt2_124m_jax", "loop_add_fusion", "{ms:.1f} ms in {n}"),
    ):
        _, t_ms, n = top(part, name)
        assert f"`{name}`) " + fig.format(ms=t_ms, n=n) in gpu or (
            f"`{name}` " + fig.format(ms=t_ms, n=n) in gpu
        ), (part, name)
    for part in ("c.trm_sudoku_jax", "c.trm_sudoku_torch_compile", "c.gpt2_124m_jax",
                 "c.gpt2_124m_torch_compile"):  # fmt: skip
        assert f"{parts[part]['result']['traced_ms_per_step']:.1f} ms" in gpu, part

    # the configs and the README quote the same figures
    trm_cfg = _read("configs/experiment/trm_sudoku.yaml")
    assert f"{off['ratio_to_base']:.2f}x the step time on an H200" in trm_cfg
    gpt_cfg = _read("configs/model/gpt2_124m.yaml")
    assert f"{lse['ratio_to_baseline']['median']:.3f}x the step time" in gpt_cfg
    saved = 1 - lse["temp_bytes"] / g[""]["temp_bytes"]
    assert f"{round(100 * saved)}% less temporary memory" in gpt_cfg
    row = _readme_row("trm_sudoku")
    assert f"bare step {ms(off):.1f} ms instead of {bases[0]} (x{off['ratio_to_base']:.2f})" in row
    row = _readme_row("gpt2_124m")
    assert f"x{lse['ratio_to_baseline']['median']:.3f} in a second H200 session" in row
