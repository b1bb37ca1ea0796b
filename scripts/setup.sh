#!/usr/bin/env bash
# Create the project's virtual environment and install bertforge with its test extras and the classic
# baselines the demo runs beside its BERT lines.
#
#   bash scripts/setup.sh [VENV_DIR]      (default .venv)
#
# PyTorch comes as a CPU build on machines without an NVIDIA GPU: a plain `pip install torch` on
# Linux pulls a multi-GB CUDA build. Order of preference:
#   1. a torch wheel already on this machine (pip's find-links, e.g. /opt/wheels) - no download;
#   2. no GPU: the CPU wheel from PyTorch's own CPU index;
#   3. a GPU: the normal PyPI build.
# Set BERTFORGE_TORCH_SPEC to choose another torch (e.g. "torch==2.6.0").
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv}
PY=${PYTHON:-python3}

if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)

if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  spec=${BERTFORGE_TORCH_SPEC:-torch==2.13.0}
  # torch alone (--no-deps): its small pure-Python dependencies come with bertforge's below.
  if "${PIP[@]}" install --no-deps --no-index "$spec" 2>/dev/null; then
    echo "setup: installed $spec from a wheel on this machine"
  elif command -v nvidia-smi >/dev/null 2>&1; then
    "${PIP[@]}" install "${BERTFORGE_TORCH_SPEC:-torch>=2.3}"
  else
    "${PIP[@]}" install --no-deps "${BERTFORGE_TORCH_SPEC:-torch>=2.3}" --index-url https://download.pytorch.org/whl/cpu
  fi
fi

# torch is now present, so the `torch>=` range in pyproject.toml installs nothing more.
"${PIP[@]}" install -e ".[test,baselines]" 2>&1 | grep -v "^WARNING: Location" || true
"$VENV/bin/python" -c "import bertforge, torch; print(f'setup: bertforge {bertforge.__version__}, torch {torch.__version__}')"
# CPU inference's fused loops (int8's passes, attention's softmax), compiled for this CPU now rather than at
# the first inference (the demo's); where they cannot be built, inference runs PyTorch ops instead.
"$VENV/bin/python" -c "from bertforge.fast.kernels import cpu_kernels; \
print('setup: CPU kernels ' + ('built for this CPU' if cpu_kernels() else 'not built: PyTorch ops instead'))"
