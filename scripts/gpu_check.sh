#!/usr/bin/env bash
# GPU check (docs/system-collectors.md): a random-init bf16 Llama-3.2-1B-shaped decode loop at 4k and
# 32k context with NVML+GPM sampling, then the analyzer; prints measured ITL against the roofline ideal,
# bandwidth efficiency, GPM DRAM bandwidth utilisation during decode, and a verdict.
#
#   scripts/gpu_check.sh                 # defaults; extra arguments go to scripts/gpu_check.py
#   scripts/gpu_check.sh --out /tmp/gpu-check-trace --decode-tokens 300
#
# Exit codes: 0 ok, 1 the run failed, 2 cannot run here (no CUDA GPU / torch / transformers),
# 124 it ran past its 9-minute limit.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -z "${VIRTUAL_ENV:-}" ] && [ -f .venv/bin/activate ]; then
  # shellcheck disable=SC1091
  . .venv/bin/activate
fi
exec timeout 540 python scripts/gpu_check.py "$@"
