#!/usr/bin/env bash
# Installs CPU-only torch 2.13.0 for PYTHON (used by scripts/setup.sh and deploy/Dockerfile).
#   bash scripts/install-torch.sh [PYTHON]
# 1. From PyTorch's CPU index and nothing else: PyPI's torch for Linux is a multi-GB CUDA build, and
#    locally configured sources (pip.conf, PIP_FIND_LINKS, PIP_*INDEX*) are left out of this try.
# 2. If that index cannot be reached (10 s timeout, no retries): a plain `pip install torch==2.13.0`
#    that uses this machine's pip configuration (a mirror, or a folder with a CPU wheel).
# It prints which source was used.
set -euo pipefail
PYTHON=${1:-python3}
TORCH=torch==2.13.0
CPU_INDEX=https://download.pytorch.org/whl/cpu

installed=$("$PYTHON" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || true)
if [[ $installed == 2.13.0 || $installed == 2.13.0+* ]]; then
  echo "torch: $installed is already installed"
  exit 0
fi

if env -u PIP_FIND_LINKS -u PIP_INDEX_URL -u PIP_EXTRA_INDEX_URL -u PIP_NO_INDEX PIP_CONFIG_FILE=/dev/null \
  "$PYTHON" -m pip install -q --timeout 10 --retries 0 --index-url "$CPU_INDEX" "$TORCH"; then
  source="PyTorch's CPU index ($CPU_INDEX)"
else
  echo "torch: no $TORCH from $CPU_INDEX (unreachable?); falling back to the local pip configuration" >&2
  "$PYTHON" -m pip install -q "$TORCH"
  source="the local pip configuration (pip config list shows it)"
fi
version=$("$PYTHON" -c 'import importlib.metadata as m; print(m.version("torch"))')
echo "torch: $version installed from $source"
if [[ $version != *+cpu && $(uname -s) == Linux ]]; then
  echo "note: torch $version is not a +cpu build; on Linux that is the CUDA build" >&2
fi
