#!/usr/bin/env bash
# Everything one GPU session's call carries, prepared once on a machine with PyPI, in the root of
# the checkout the call is made from (docs/benchmarks.md, "What a GPU session runs"):
#
#   bash bench/gpu_prepare.sh --data DIR --nanogpt SRC --trm SRC --adam-atan2 SRC [--python PY]
#
#   .whl/   Python 3.12 manylinux wheels of what the trainer and upstream's scripts import and the
#           device image lacks (grain, hydra-core, omegaconf, ...; wandb is not carried: the runs
#           use logging.wandb=disabled). pip's own recipe from the device notes, --no-deps, every
#           version pinned, one version of each.
#   .gpu/   upstream/{nanoGPT,TinyRecursiveModels,adam-atan2}: the files of each checkout the runs
#           read (SRC: a working checkout or a bare git directory; upstream/COMMITS names the
#           commits), never committed; data/: `python -m bench gpu prepare --data DIR` (DIR holds
#           tinyshakespeare/input.txt and sudoku/{sudoku-extreme-1k-train-only,sudoku-hard-test-1k}).
#
# Both folders are git-ignored. At the end it checks that what a call sends (tracked and
# untracked-not-ignored files, plus .whl and .gpu) stays within the 64 MiB a call may carry.
set -euo pipefail

PY=python3 DATA="" NANOGPT="" TRM="" ADAM=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --python) PY=$2; shift 2 ;;
    --data) DATA=$2; shift 2 ;;
    --nanogpt) NANOGPT=$2; shift 2 ;;
    --trm) TRM=$2; shift 2 ;;
    --adam-atan2) ADAM=$2; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "gpu_prepare.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ -f pyproject.toml && -d bench ]] || { echo "gpu_prepare.sh: run it in the repository root" >&2; exit 2; }
for v in DATA NANOGPT TRM ADAM; do
  [[ -n "${!v}" ]] || { echo "gpu_prepare.sh: --${v,,} is required (see --help)" >&2; exit 2; }
done
LIMIT=$((64 * 1024 * 1024))

# ---- wheels: the device image has jax, flax, optax, orbax, torch, numpy, etils, tqdm, scipy,
# absl-py, protobuf, cloudpickle, psutil, pyyaml, einops, pytest (KINDS.md's package list)
WHEELS=(
  grain==0.2.18 array-record==0.8.6 portpicker==1.6.0  # the trainer's input pipeline
  hydra-core==1.3.8 omegaconf==2.3.1                     # its configuration
  coolname==5.0.0 pydantic==2.9.2 pydantic-core==2.23.4 annotated-types==0.7.0  # upstream pretrain.py
)
rm -rf .whl && mkdir -p .whl
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  -d .whl "${WHEELS[@]}"
# omegaconf pins antlr4-python3-runtime 4.9.*, published as a source archive only: a pure-Python
# wheel built from it installs anywhere
"$PY" -m pip wheel -q --no-deps --no-binary=:all: -w .whl antlr4-python3-runtime==4.9.3
rm -f .whl/*.tar.gz

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
"$PY" -m bench gpu prepare --data "$DATA" --assets .gpu

# ---- what a call sends
tree=$(git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
whl=$(du -sb .whl | cut -f1) gpu=$(du -sb .gpu | cut -f1)
total=$((tree + whl + gpu))
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
echo "tree $(mib "$tree") + .whl $(mib "$whl") + .gpu $(mib "$gpu") = $(mib "$total") of $(mib $LIMIT)"
ls .whl
if ((total > LIMIT)); then
  echo "gpu_prepare.sh: over the 64 MiB a call may carry" >&2
  exit 1
fi
