#!/usr/bin/env bash
# `make demo`: the whole eagle3 chain on the embedded default (the committed tiny target, CPU).
# Every command is resumable: rerun `make demo` after an interruption and it continues.
#   RUN=runs/demo          run folder (override: make demo RUN=runs/other)
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${RUN:-runs/demo}
E3=".venv/bin/eagle3"
# The tiny target is per-call-overhead bound: one thread is as fast and does not stall when the
# machine is busy (two OpenMP threads on a shared 2-core box can be 100x slower).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
step() { printf '\n\033[1;36m== %s\033[0m\n' "$*"; }

step "0/5 doctor: what this node can run"
$E3 doctor || true

step "1/5 gen-data: regenerate GSM8K prompts with the tiny target"
$E3 gen-data --recipe recipes/tiny/gen-data.yaml --run "$RUN"

step "2/5 cache: loss masks, draft vocab, aux + last hidden states"
$E3 cache --recipe recipes/tiny/cache.yaml --run "$RUN"
$E3 cache --verify "$RUN/cache"

step "3/5 train: the EAGLE-3 head with training-time test"
$E3 train --recipe recipes/tiny/train.yaml --run "$RUN"

step "4/5 eval: acceptance by depth, tau, speedup, losslessness"
$E3 eval --recipe recipes/tiny/eval.yaml --run "$RUN" --target models/tiny-target

step "5/5 serve: preflight + the exact SGLang command (dry run: SGLang serving needs a GPU)"
if ! .venv/bin/python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('sglang') is None)"; then
  echo "serve: sglang is not installed here (make sglang-cpu failed, see .venv/sglang-cpu.log):"
  echo "       the command below is checked by eagle3's preflight only, not by SGLang's own parser"
fi
$E3 serve --target models/tiny-target --head "$RUN/head" --from-eval "$RUN/eval" --dry-run

echo
plots=$(for p in "$RUN/train/learning_curve.png" "$RUN/eval/acceptance.png"; do test -f "$p" && printf '%s ' "$p"; done)
echo "done: $RUN/{data,cache,train,head,eval}; plots: ${plots:-none drawn}"
