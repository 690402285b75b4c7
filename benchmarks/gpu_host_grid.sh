#!/usr/bin/env bash
# Issue 32's scarce-label grid (benchmarks/self_judges.py) on a lent GPU host's 16 CPU cores, CUDA
# hidden, as on the 2-core machine: one process per (recipe, seed, fraction), each with its own HOME
# (cache) and Ray cluster, 17 at once. On 2026-11-28 the host (torch 2.11) reproduced this machine's
# GRPO seeds (torch 2.13) to the last digit. The lines after `pids=()` are the grid: edit them.
# Set-up on the CPU machine, from the project root (all three are git-ignored or excluded there):
#   ../shared/tools/gpu-wheels.sh .whl                     # Ray and coevo's missing deps, ~47 MiB
#   mkdir -p .carry && cp -r ~/.cache/coevo/warmup/<key> .carry/   # the sorting SFT warm start
# then the device tool: command "LIMIT=470 bash benchmarks/gpu_host_grid.sh", carry [".whl", ".carry"],
# timeout_s 570. Results come back as one tarball ($OUT/raw.tgz): the tool returns 8 files a call.
# SMOKE=1 (and OUT, PY): a few steps, to check the script here first.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gridout}; LOGS=/tmp/gridlogs; mkdir -p "$OUT" $LOGS
exec > >(tee -a "$OUT/log.txt") 2>&1
date; nproc; nvidia-smi -L 2>/dev/null
if [ -d .whl ] && ! python3 -c "import ray" 2>/dev/null; then
  site=/tmp/site
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site .whl/*.whl || exit 1
  mkdir -p $site/coevo-0.0.0.dist-info && printf 'Metadata-Version: 2.1\nName: coevo\nVersion: 0.0.0\n' > $site/coevo-0.0.0.dist-info/METADATA
  export PYTHONPATH=$site:$PWD
else
  export PYTHONPATH=$PWD
fi
PY=${PY:-python3}
$PY -c "import torch, transformers, ray, pydantic; print('torch', torch.__version__, 'transformers', transformers.__version__, 'ray', ray.__version__)"
export CUDA_VISIBLE_DEVICES="" OMP_NUM_THREADS=2 MKL_NUM_THREADS=2
mkdir -p benchmarks/results/raw
LIMIT=${LIMIT:-500}
if [ "${SMOKE:-0}" = 1 ]; then
  SIZE="--steps 2 --eval-every 2 --held-out 300 --judge-warmup 4"; GSEEDS="0"; JSEEDS="0"
else
  SIZE="--steps 40 --held-out 1000"; GSEEDS="0 1 2 3 4"; JSEEDS="3 4"
fi
B="benchmarks/self_judges.py --task sorting $SIZE --credit gated"
J="--judge-task distill --judge-task-fraction 0.75"
X="algorithm.advantage=grpo_bernoulli algorithm.lr=1.0e-4"
go() {  # label, then self_judges arguments
  local label=$1; shift
  local home=/tmp/home$label
  mkdir -p $home/.cache/coevo/warmup && cp -r .carry/* $home/.cache/coevo/warmup/
  HOME=$home timeout $LIMIT $PY $B --label $label "$@" > "$LOGS/$label.log" 2>&1
  echo "$label rc $? at $(date +%T)"
}
pids=()
for s in $GSEEDS; do go _gh_grpo_lr125e7_s$s --fractions 0.1 0.25 --seeds $s --recipes grpo -- algorithm.lr=1.25e-5 & pids+=($!); done
for s in $JSEEDS; do for f in 0.1 0.25; do  # one process a (recipe, seed, fraction): 12 of them
  go _gh_dist_spark01_f${f}_s$s --fractions $f --seeds $s $J --recipes spark -- $X spark.coef=0.1 & pids+=($!)
  go _gh_dist_spc128_f${f}_s$s --fractions $f --seeds $s $J --recipes spc -- $X spc.policy_items=128 & pids+=($!)
  go _gh_dist_sjg_f${f}_s$s --fractions $f --seeds $s $J --recipes self_judged_grpo -- $X & pids+=($!)
done; done
wait "${pids[@]}"  # not a bare wait: that waits for the tee of the log too
tar czf "$OUT/raw.tgz" benchmarks/results/raw/self_judges_sorting_gh_* $LOGS  # the raw files and each run's log
uptime; date
