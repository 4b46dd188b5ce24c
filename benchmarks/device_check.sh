#!/usr/bin/env bash
# Device check: the analyses on DEVICE against the CPU paths, then device/CPU timings
# (benchmarks/device_check.py). Under 10 minutes on one GPU; `cpu` runs the correctness half.
#   bash benchmarks/device_check.sh [DEVICE]     # DEVICE: cuda (default), cuda:1, cpu
set -euo pipefail
DEVICE=${1:-cuda}
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
[ -x "$PYTHON" ] || PYTHON=python3
exec timeout 590 "$PYTHON" benchmarks/device_check.py --device "$DEVICE"
