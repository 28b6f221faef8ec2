#!/usr/bin/env bash
# Every check that needs a GPU, as one script that ends in under 8 minutes on one H200 with nothing but
# the repo, torch and the carried folders of `benchmarks/gpu_prepare.sh` (.whl: the pinned transformers;
# .gpu: a config-only Llama-3.1-8B with a tokenizer). Writes into $RESULTS (default $OUT, else
# results/ttft_h200): exactness.json (verify in fp32/bf16/fp16, replayed-vs-plain tokens and step times),
# engine_tests.txt (the engine's tests on tiny random models, on CUDA), Table 10 at Llama-3.1-8B shapes
# (table.csv, calls.csv, machine.json), engine_timings.txt, and throughput.txt (items per hour of a
# 3-agent synthetic cell). A step that fails is reported and the next one runs; the exit code counts them.
set -uo pipefail
cd "$(dirname "$0")/.."
RESULTS=${RESULTS:-${OUT:-results/ttft_h200}}
MODEL=config:.gpu/llama-3.1-8b
mkdir -p "$RESULTS"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl &&
    export PYTHONPATH=/tmp/site:$PWD
fi
failed=0
step() {  # step NAME SECONDS COMMAND...: run with a time limit, its output to $RESULTS/NAME
  local name=$1 limit=$2
  shift 2
  echo "== $name ($(date +%T))"
  timeout "$limit" "$@" >"$RESULTS/$name" 2>"$RESULTS/$name.err" || { echo "!! $name failed"; failed=$((failed + 1)); }
  tail -n 25 "$RESULTS/$name"
}
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv || true
step exactness.json 120 python3 benchmarks/gpu_exactness.py --model "$MODEL" --length 4096
step engine_tests.txt 90 env BCR_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
  -m "not real_model and not notebooks and not browser" \
  tests/test_backbone.py tests/test_kv.py tests/test_static.py tests/test_exactness.py tests/test_families.py
step table10.txt 150 python3 benchmarks/table10.py --model "$MODEL" --dtype bfloat16 --lengths 512,2048,4096 \
  --rho 0.1,0.2,0.4 --samples 3 --out "$RESULTS"
step engine_timings.txt 45 python3 benchmarks/engine_timings.py --model "$MODEL" --dtype bfloat16 --lengths 4096
run_dir=$(mktemp -d)
started=$(date +%s)
step throughput.txt 60 python3 -m bcr_core run --model "$MODEL" --dtype bfloat16 --benchmark synthetic --agents 3 \
  --n 4 --max-new-tokens 16 --conditions dense,kvcomm,bcr-chunk:chunk=16 --out "$run_dir"
echo "items per hour: $(python3 -c "print(round(4 * 3600 / max(1, $(date +%s) - $started)))") (4 items, 3 conditions, load included)" |
  tee -a "$RESULTS/throughput.txt"
echo "== $failed step(s) failed"
exit "$failed"
