#!/usr/bin/env bash
# The inputs of `python -m bench gpu`, prepared once in the repository root (docs/benchmarks.md,
# "Reproduce the GPU figures"):
#
#   bash bench/gpu_prepare.sh --data DIR --nanogpt SRC --trm SRC --adam-atan2 SRC [--python PY]
#                             [--wheels]
#
#   .gpu/   upstream/{nanoGPT,TinyRecursiveModels,adam-atan2}: the files of each checkout the runs
#           read (SRC: a working checkout or a bare git directory; upstream/COMMITS names the
#           commits); data/shakespeare_char (our builder's bins from DIR/tinyshakespeare/input.txt)
#           and data/sudoku-extreme-1k-train-only (a copy of DIR/sudoku/'s).
#   .whl/   with --wheels: Python 3.12 manylinux wheels, every version pinned, of what a GPU
#           machine without a package index may lack; install them there with
#           `pip install --no-index --no-deps --target DIR .whl/*.whl`.
#
# Both folders are git-ignored.
set -euo pipefail

PY=python3 DATA="" NANOGPT="" TRM="" ADAM="" WHEELS=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --python) PY=$2; shift 2 ;;
    --data) DATA=$2; shift 2 ;;
    --nanogpt) NANOGPT=$2; shift 2 ;;
    --trm) TRM=$2; shift 2 ;;
    --adam-atan2) ADAM=$2; shift 2 ;;
    --wheels) WHEELS=1; shift ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "gpu_prepare.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ -f pyproject.toml && -d bench ]] || { echo "gpu_prepare.sh: run it in the repository root" >&2; exit 2; }
for v in DATA NANOGPT TRM ADAM; do
  [[ -n "${!v}" ]] || { echo "gpu_prepare.sh: --${v,,} is required (see --help)" >&2; exit 2; }
done

# ---- wheels: what the trainer and upstream's scripts import beyond jax, flax, optax, orbax,
# torch, numpy, scipy, einops and pytest
if ((WHEELS)); then
  rm -rf .whl && mkdir -p .whl
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    -d .whl grain==0.2.18 array-record==0.8.6 portpicker==1.6.0 hydra-core==1.3.8 omegaconf==2.3.1 \
    coolname==5.0.0 pydantic==2.9.2 pydantic-core==2.23.4 annotated-types==0.7.0
  # omegaconf pins antlr4-python3-runtime 4.9.*, a source archive only: built into a wheel here
  "$PY" -m pip wheel -q --no-deps --no-binary=:all: -w .whl antlr4-python3-runtime==4.9.3
  rm -f .whl/*.tar.gz
fi

# ---- upstream checkouts: only the files the runs read
copy_files() {  # copy_files SRC DEST PATH...
  local src=$1 dest=$2; shift 2
  rm -rf "$dest" && mkdir -p "$dest"
  local git=()
  if [[ -f "$src/HEAD" && -d "$src/objects" ]]; then git=(git --git-dir="$src")
  elif [[ -e "$src/.git" ]]; then git=(git -C "$src")
  fi
  if [[ ${#git[@]} -gt 0 ]]; then
    "${git[@]}" archive HEAD "$@" | tar -x -C "$dest"
    echo "$(basename "$dest") $("${git[@]}" rev-parse HEAD)" >>.gpu/upstream/COMMITS
  else
    (cd "$src" && cp -r --parents "$@" "$OLDPWD/$dest")
    echo "$(basename "$dest") unknown (not a git checkout: $src)" >>.gpu/upstream/COMMITS
  fi
}
mkdir -p .gpu/upstream && : >.gpu/upstream/COMMITS
copy_files "$NANOGPT" .gpu/upstream/nanoGPT train.py model.py configurator.py config
copy_files "$TRM" .gpu/upstream/TinyRecursiveModels pretrain.py puzzle_dataset.py config models \
  utils evaluators dataset/common.py
copy_files "$ADAM" .gpu/upstream/adam-atan2 adam_atan2

# ---- data
"$PY" -m data.shakespeare_char --input "$DATA/tinyshakespeare/input.txt" --out-dir .gpu/data/shakespeare_char
rm -rf .gpu/data/sudoku-extreme-1k-train-only
cp -r "$DATA/sudoku/sudoku-extreme-1k-train-only" .gpu/data/
du -sh .gpu $( ((WHEELS)) && echo .whl)
