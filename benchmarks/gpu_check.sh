#!/usr/bin/env bash
# The prepared device calls of issues 30 and 31 (docs/gpu.md, docs/benchmarks.md): one GPU, in order of
# what matters most, each part under its own time limit and the whole under BUDGET seconds.
#   PHASE=1 (the first call):
#     1. the tests marked gpu (the varlen packed path trains, placement, IPC weights, OOM, KV freeing,
#        the compiled static-cache decoding step)
#     2. the learner's peak memory with and without learner.gradient_checkpointing, each alone in its
#        own process (benchmarks/learner_speed.py, 0.5B preset, responses of 448-512 tokens)
#     3. benchmarks/gpu_step.py part b: generation (static cache + CUDA graphs, and the dynamic loop)
#        against bare generate
#   PHASE=2 (the next call, on the still-warm machine: its wheels and compile caches are kept):
#     4. benchmarks/gpu_step.py part c (the whole GRPO step), then a (the default job) as time allows
#   PHASE=all: both, one after the other.
# Set-up here (project root, in the venv), once:
#   printf '/.whl/\n' >> .git/info/exclude
#   ../shared/tools/gpu-wheels.sh .whl trl==1.16.0 datasets dill multiprocess     # ~49 MiB
# then the device tool: command "PHASE=1 COEVO_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/gpu_check.sh",
# carry [".whl"], timeout_s 590. Everything it measured comes back under $OUT.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
OUT=${OUT:-/tmp/gpu_check}; mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
t0=$(date +%s); budget=${BUDGET:-560}; phase=${PHASE:-all}; device=${DEVICE:-cuda}; preset=${PRESET:-0.5b}
left() { echo $(( budget - ($(date +%s) - t0) )); }
date; echo "phase $phase, commit ${COEVO_COMMIT:-?}"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
site=/tmp/site
if [ "$device" = cuda ] && [ ! -d $site/ray ]; then  # a warm machine keeps what an earlier call installed
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site .whl/*.whl || exit 1
fi
export PYTHONPATH=$site:$PWD
python3 -c "import torch, transformers, ray; print('torch', torch.__version__, 'transformers', transformers.__version__,
'ray', ray.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU')"

if [ "$phase" != 2 ]; then
  echo "== 1. gpu tests ($(left) s left)"
  timeout ${TESTS_S:-100} python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_packing.py tests/test_modeling.py \
    tests/test_gpu_placement.py tests/test_hf_generation.py tests/test_out_of_memory.py tests/test_weight_ipc.py \
    2>&1 | tail -25

  echo "== 2. learner peak memory, with and without checkpointing ($(left) s left)"
  for v in coevo coevo_ckpt; do
    timeout ${MEMORY_S:-70} python3 benchmarks/learner_speed.py --device $device --preset $preset --rlen 512 \
      --prompts 16 --samples 8 --variants $v --seeds 0 --warmup 1 --steps 1 --out "$OUT/memory_$v.json" 2>&1 \
      | grep -v Warning | tail -3
  done

  echo "== 3. gpu_step part b ($(left) s left)"
  python3 benchmarks/gpu_step.py --device $device --preset $preset --parts b --budget $(( $(left) - 5 )) \
    --out "$OUT" 2>&1 | tail -12
fi
if [ "$phase" != 1 ]; then
  echo "== 4. gpu_step parts ${PARTS2:-ca} ($(left) s left)"
  python3 benchmarks/gpu_step.py --device $device --preset $preset --parts ${PARTS2:-ca} --budget $(( $(left) - 5 )) \
    --out "$OUT/phase2" 2>&1 | tail -14
fi
date; echo "total $(( $(date +%s) - t0 )) s"
