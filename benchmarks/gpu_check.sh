#!/usr/bin/env bash
# The prepared device call of issues 30 and 31 (docs/gpu.md, docs/benchmarks.md): one GPU, in order of
# what matters most, each part under its own time limit and the whole under BUDGET seconds:
#   1. the tests marked gpu (the varlen packed path trains, placement, IPC weights, OOM, KV freeing)
#   2. the learner against a bare packed bf16 loop, 0.5B preset, responses of 448-512 tokens
#      (benchmarks/learner_speed.py: coevo, bare, coevo_ckpt, coevo_before, bare_fsdp2)
#   3. benchmarks/gpu_step.py parts b (generation vs bare generate), c (the whole GRPO step),
#      a (the default job, no role settings), d (TRL's GRPOTrainer) as the budget allows
# Set-up here (project root, in the venv), once:
#   printf '/.whl/\n' >> .git/info/exclude
#   ../shared/tools/gpu-wheels.sh .whl trl==1.16.0 datasets dill multiprocess     # ~49 MiB
# then the device tool: command "COEVO_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/gpu_check.sh",
# carry [".whl"], timeout_s 590. Everything it measured comes back under $OUT.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
OUT=${OUT:-/tmp/gpu_check}; mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
t0=$(date +%s); budget=${BUDGET:-560}
left() { echo $(( budget - ($(date +%s) - t0) )); }
date; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
site=/tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site .whl/*.whl || exit 1
export PYTHONPATH=$site:$PWD
python3 - <<'EOF'
import inspect, torch, transformers, ray
print("torch", torch.__version__, "transformers", transformers.__version__, "ray", ray.__version__,
      torch.cuda.get_device_name(0))
try:
    from torch.nn.attention.varlen import varlen_attn
    print("varlen_attn", inspect.signature(varlen_attn))
except ImportError as e:
    print("no torch varlen_attn:", e)
EOF

echo "== 1. gpu tests ($(left) s left)"
timeout 80 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_packing.py tests/test_modeling.py \
  tests/test_gpu_placement.py tests/test_hf_generation.py tests/test_out_of_memory.py tests/test_weight_ipc.py \
  2>&1 | tail -25

echo "== 2. learner, 0.5B, long responses ($(left) s left)"
timeout ${LEARNER_S:-175} python3 benchmarks/learner_speed.py --device cuda --preset 0.5b --rlen 512 --prompts 16 \
  --samples 8 --seeds 0 1 2 --warmup 1 --steps 2 --out "$OUT/learner_speed.json" 2>&1 | grep -v Warning | tail -22

echo "== 3. gpu_step parts b c a d ($(left) s left)"
python3 benchmarks/gpu_step.py --device cuda --preset 0.5b --parts ${PARTS:-bcad} --budget $(( $(left) - 5 )) \
  --out "$OUT" 2>&1 | tail -40
date; echo "total $(( $(date +%s) - t0 )) s"
