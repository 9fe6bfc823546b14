"""One source for each figure: the records under bench/results.

- The docs' tables of measured figures (README.md, docs/testing.md, docs/benchmarks.md) are
  generated from the records by `python -m bench tables` (bench/tables.py): every generated table
  equals the generator's, so a rerun of a measurement names each doc still showing the old one.
- The places that quote a figure in prose (experiment configs' headers, docs/training.md's rows,
  docs/evaluation.md, docs/porting_*.md, the reproduction tests' bounds and comments) state the
  figure the generator reads from the same record, and a reproduction's bound stays under every
  measured run it cites.
"""

from __future__ import annotations

import re

from bench import tables
from bench.demo import summary
from tests.helpers import REPO


def _read(path: str) -> str:
    with open(f"{REPO}/{path}") as f:
        return " ".join(f.read().split())  # sentences and comments wrap over lines


def _header(name: str) -> str:
    """The comment block an experiment config starts with, as one line of text."""
    with open(f"{REPO}/configs/experiment/{name}.yaml") as f:
        return " ".join(x.lstrip("#").strip() for x in f if x.startswith("#"))


def _row(path: str, first: str) -> str:
    with open(f"{REPO}/{path}") as f:
        return next(x for x in f if x.startswith(f"| {first} "))


def test_the_docs_tables_are_the_generators():
    """Every doc region `<!-- bench tables: NAME -->` holds exactly what bench/tables.py makes of
    the records, and each doc has the regions the generator writes."""
    assert tables.stale() == [], "run `python -m bench tables`"


def test_demo_figures_are_the_demo_seeds():
    """bench/results/demo_seeds.json's summary is its seeds' own (`python -m bench demo`); the
    experiment's header, docs/training.md's "Tiny runs" row and docs/evaluation.md state it; on
    published-style grids the demo is within 0.05 of its own split; the reproduction's bounds are
    under every seed's, which their comments cite."""
    r = tables._json("demo_seeds.json")
    s, d = r["summary"], tables.demo()
    assert s == summary(r["seeds"])
    assert (
        abs(s["published"]["exact_accuracy"]["mean"] - s["test"]["exact_accuracy"]["mean"]) <= 0.05
    )
    for text, arrow in ((_row("docs/training.md", "trm_sudoku_tiny"), ", "),
                        (_header("trm_sudoku_tiny"), " -> ")):  # fmt: skip
        for figure in (d["final"], arrow.join(d["steps"]), d["other"], d["published"]):
            assert figure in text, f"should state {figure}: {text}"
    assert d["final"] in _read("docs/evaluation.md")
    gains = [t["test"]["per_step_exact_accuracy"][-1] - t["test"]["per_step_exact_accuracy"][0]
             for t in r["seeds"]]  # fmt: skip
    printed = [t["published"]["exact_accuracy"] for t in r["seeds"]]
    text = _read("tests/test_reproductions.py")
    assert (f"per ACT step {', '.join(d['steps'])} (means; gain {min(gains):.2f} to "
            f"{max(gains):.2f})") in text  # fmt: skip
    assert f"{min(printed):.3f} to {max(printed):.3f}" in text
    assert float(re.search(r"DEMO_ACT_GAIN_MIN = ([\d.]+)", text)[1]) < min(gains)
    assert float(re.search(r"DEMO_PUBLISHED_MIN = ([\d.]+)", text)[1]) < min(printed)


def test_whole_run_figures_are_the_runs_in_curves_json():
    """Each side's final evaluation (mean [min, max]) and the seed count of
    bench/results/curves/curves.json, as the experiments' headers and docs/training.md state
    them; tests/test_reproductions.py's bound under all of trm_sudoku_cpu's final runs."""
    for name, digits in (("gpt_shakespeare_char_cpu", 3), ("trm_sudoku_cpu", 2)):
        f = tables.final(name)
        for text in (_header(name), _row("docs/training.md", name)):
            for side in ("jax", "upstream"):
                assert tables.spread(f[side], digits) in text, (name, side, text)
            assert f"{f['n']} seeds" in text, text
    f = tables.final("trm_sudoku_cpu")
    low, high = min(f[s]["min"] for s in f if s in ("jax", "upstream")), max(
        f[s]["max"] for s in ("jax", "upstream"))  # fmt: skip
    text = _read("tests/test_reproductions.py")
    assert f"{low:.3f} to {high:.3f}" in text
    assert float(re.search(r"TRM_EXACT_MIN = ([\d.]+)", text)[1]) < low


def test_test_time_scaling_figures_are_the_bench_results():
    """docs/evaluation.md's rows and the reproduction's bound: bench/results/ttsc/<name>.json."""
    docs = _read("docs/evaluation.md").replace("**", "")
    for name, ks in (("trm_sudoku_cpu", ("16", "32")), ("trm_sudoku_tiny", ("16",))):
        r = tables._json(f"ttsc/{name}.json")
        t, plain = r["test"], r["test"]["plain"]["exact_accuracy"]
        for k in ks:
            c = t["curve"][k]
            assert (
                f"| {t['count']} | {plain:.3f} | {r['sigma_star']} | {k} | {c['exact_accuracy']:.3f}"
                in docs
            )
            assert f"{c['oracle_exact_accuracy']:.3f} |" in docs, (name, k)
    t = tables.ttsc("trm_sudoku_cpu")
    gain = (
        tables._json("ttsc/trm_sudoku_cpu.json")["test"]["curve"]["16"]["exact_accuracy"]
        - t["plain"]
    )
    text = _read("tests/test_reproductions.py")
    assert f"gain {gain:.3f}" in text
    k, noise, bound = re.search(r"TTSC_TRAJECTORIES, TTSC_NOISE, TTSC_GAIN_MIN = (\d+), ([\d.]+), "
                                r"([\d.]+)", text).groups()  # fmt: skip
    assert (int(k), float(noise)) == (16, t["sigma"]) and float(bound) < gain / 2


def test_gpu_figures_quoted_beside_the_configs_are_the_records():
    """The defaults chosen on a GPU, as the configs' comments and the docs explaining them quote
    their figures: Triton GEMMs off for trm_sudoku, the logsumexp loss for gpt2_124m,
    split_gate_up's cost with and without Triton GEMMs."""
    f = tables.figures()
    off = f"{f['off']['ratio_to_base']:.2f}x the step time on an H200"
    assert off in _read("configs/experiment/trm_sudoku.yaml") and off in _read("docs/training.md")
    g = tables._variants(tables._json("h200_run2/gpt2_variants_second_call.json"))
    saved = 1 - g["cross_entropy_impl=logsumexp"]["temp_bytes"] / g[""]["temp_bytes"]
    gpt = _read("configs/model/gpt2_124m.yaml")
    assert (
        f"{f['lse']:.3f}x the step time" in gpt and f"{round(100 * saved)}% less temporary" in gpt
    )
    assert f"{f['lse']:.3f}x the step time" in _read("docs/porting_nanogpt.md")
    on = tables._variants(tables.part("h200_run2/results.jsonl", "d.trm_sudoku_variants"))
    combo = tables._variants(tables._json("h200_run2/trm_combo_third_call.json"))
    extra = round((combo[""]["temp_bytes"] - on[""]["temp_bytes"]) / 2**30)
    assert f"{extra} GiB more temporary memory" in _read("docs/training.md")
    trm = _read("docs/porting_trm.md")
    for rows in (on, combo):
        assert f"{rows['split_gate_up=True']['ratio_to_baseline']['median']:.3f}x" in trm
    assert f"{extra} GiB less" in trm


def test_gpt_tiny_figures_are_the_tiny_runs_table():
    """gpt_shakespeare_char_tiny's val loss, from docs/training.md's "Tiny runs" row (the README's
    row is generated from it), as the experiment's header states it."""
    start, end = tables.gpt_tiny()
    assert f"from {start} (ln 65) to {end} at step 300" in _header("gpt_shakespeare_char_tiny")


def test_the_avx2_default_tier_takes_under_10_minutes():
    """The default tier of the quiet AVX2 record (bench/results/timings/) took under 10 minutes."""
    from bench.timings import records

    avx2 = records()["avx2"]
    if avx2 is not None and "test" in avx2:
        assert avx2["test"]["run"]["wall_s"] < 600, avx2["test"]["run"]
