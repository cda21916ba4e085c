#!/usr/bin/env bash
# Regenerate the sample traces with the real collectors (see README.md here).
#
#   sample_traces/regenerate.sh                    # all five, about 1-2 minutes on 2 CPU cores
#   sample_traces/regenerate.sh chat network       # only these
#   SAMPLES_OUT=/tmp/s sample_traces/regenerate.sh # write somewhere else (the tests' recipe check)
#
# Needs the venv of the README's install command active (tracetool, torch and
# transformers importable). Each recipe runs in a fresh temporary directory:
# `tracetool serve` (the demo model, 1 torch thread, loopback, a free port),
# `tracetool probe` against it (through the delay proxy for `network`),
# SIGTERM to the server (it closes its trace), `tracetool merge`; or
# `tracetool record --pyspy` for the in-process script. The result is
# validated, rewritten as Parquet (`tracetool convert`: one compact file per
# table, the same rows) and checked with `tracetool analyze`: a recording
# whose verdict is not the one the sample is meant to show fails the script
# (exit 1) instead of replacing a good sample.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out_root="${SAMPLES_OUT:-$here}"
all=(chat network long-prompt slow-tokenizer queueing)

die() { echo "regenerate: $*" >&2; exit 2; }
names=("$@")
[[ ${#names[@]} -gt 0 ]] || names=("${all[@]}")
for name in "${names[@]}"; do
  case "$name" in
    chat | network | long-prompt | slow-tokenizer | queueing) ;;
    *) die "unknown sample '$name' (one of: ${all[*]})" ;;
  esac
done
command -v tracetool >/dev/null || die "tracetool is not on PATH: activate the venv of the README's install command"
python -c 'import torch, transformers, tracetool' 2>/dev/null \
  || die "python cannot import torch, transformers and tracetool: activate the venv (pip install -e '.[torch]')"

work="$(mktemp -d "${TMPDIR:-/tmp}/tracetool-samples.XXXXXX")"
children=()
cleanup() {
  local p
  for p in "${children[@]+"${children[@]}"}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# wait_for FILE PATTERN PID: wait (up to 180 s) until FILE has a line matching PATTERN; print
# the first URL on it. Fails when PID exits first (its log is shown).
wait_for() {
  local file=$1 pattern=$2 pid=$3 i
  for ((i = 0; i < 1800; i++)); do
    if grep -q "$pattern" "$file" 2>/dev/null; then
      grep -m1 "$pattern" "$file" | grep -o 'http://[^ ]*' | head -1
      return 0
    fi
    kill -0 "$pid" 2>/dev/null || { cat "$file" >&2; die "process $pid exited before: $pattern"; }
    sleep 0.1
  done
  cat "$file" >&2
  die "timed out waiting for: $pattern"
}

# serve MAX_BATCH: start `tracetool serve` on a free port; sets SERVER_PID and SERVER_URL.
serve() {
  tracetool serve --port 0 --threads 1 --max-batch "$1" -o server 2>server.log &
  SERVER_PID=$!
  children+=("$SERVER_PID")
  SERVER_URL="$(wait_for server.log 'tracetool: serving ' "$SERVER_PID")"
}

# stop PID: SIGTERM and wait (the server closes its trace on SIGTERM and exits 0); forget the PID
# so the exit trap never signals a number the system may have reused.
stop() {
  kill -TERM "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
  local p kept=()
  for p in "${children[@]}"; do [[ $p == "$1" ]] || kept+=("$p"); done
  children=("${kept[@]+"${kept[@]}"}")
}

# finish NAME DIR ANALYZE-ARGS...: validate, write $out_root/NAME as parquet, analyze it.
finish() {
  local name=$1 dir=$2
  shift 2
  tracetool validate "$dir" >/dev/null
  tracetool convert "$dir" --to parquet -o "$name.parquet" >/dev/null
  tracetool analyze --json "$name.parquet" "$@" >"$name.json"
  python "$here/scripts/check_verdict.py" "$name" "$name.json"
  mkdir -p "$out_root"
  rm -rf "${out_root:?}/.$name.new"
  cp -r "$name.parquet" "$out_root/.$name.new"
  rm -rf "${out_root:?}/$name"
  mv "$out_root/.$name.new" "$out_root/$name"
  echo "regenerate: wrote $out_root/$name ($(du -sh "$out_root/$name" | cut -f1))" >&2
}

# Decode-dominant chat: 6 requests of 192 tokens, 2 at a time; network is loopback.
recipe_chat() {
  serve 4
  tracetool probe "$SERVER_URL" -n 6 --concurrency 2 --prompt-tokens 64 --max-tokens 192 --ignore-eos -q -o client
  stop "$SERVER_PID"
  tracetool merge client server -o chat >/dev/null
  finish chat chat --claim network-rtt
}

# Network-bound: 4-token answers through a loopback proxy adding 200 ms RTT (cross-region-like).
recipe_network() {
  serve 4
  local upstream="${SERVER_URL#http://}"
  upstream="${upstream%%/*}"
  python -m tracetool.serving.proxy --upstream "$upstream" --rtt-ms 200 2>proxy.log &
  local proxy_pid=$!
  children+=("$proxy_pid")
  local proxy_url
  proxy_url="$(wait_for proxy.log 'delay proxy' "$proxy_pid")"
  tracetool probe "$proxy_url/v1" -n 8 --concurrency 1 --prompt-tokens 32 --max-tokens 4 --ignore-eos -q -o client
  stop "$proxy_pid"
  stop "$SERVER_PID"
  tracetool merge client server -o network >/dev/null
  finish network network --claim network-rtt
}

# Long prompt, short answer: ~2,500-token prompts (1,000 words), 8 output tokens, one at a time.
recipe_long_prompt() {
  serve 4
  tracetool probe "$SERVER_URL" -n 4 --concurrency 1 --prompt-tokens 1000 --max-tokens 8 --ignore-eos -q -o client
  stop "$SERVER_PID"
  tracetool merge client server -o long-prompt >/dev/null
  finish long-prompt long-prompt --claim long-prompt --claim network-rtt
}

# Pathological tokenizer: an HF generate script whose pre-tokenizer has a catastrophic regex,
# recorded in-process with py-spy sampling its stacks.
recipe_slow_tokenizer() {
  local dir="$PWD"
  (cd "$here/.." && tracetool record --pyspy -o "$dir/slow-tokenizer" -- \
    python sample_traces/scripts/redos_generate.py >/dev/null)
  finish slow-tokenizer slow-tokenizer --claim tokenizer
}

# Queueing: Poisson arrivals at 10 requests/s (up to 16 in flight) against a server that runs 2 at a
# time and completes ~3-4 requests/s. Arrivals are spread (--rate) so that 16 connections opening in
# the same instant do not stall the server's event loop, which would show up as loopback "network".
recipe_queueing() {
  serve 2
  tracetool probe "$SERVER_URL" -n 24 --concurrency 16 --rate 10 --prompt-tokens 32 --max-tokens 32 --ignore-eos -q -o client
  stop "$SERVER_PID"
  tracetool merge client server -o queueing >/dev/null
  finish queueing queueing --claim queueing --claim network-rtt
}

for name in "${names[@]}"; do
  echo "regenerate: recording $name (load: $(cut -d' ' -f1-3 /proc/loadavg))" >&2
  mkdir -p "$work/$name"
  cd "$work/$name"
  "recipe_${name//-/_}"
done
