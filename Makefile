# ucp: build, test, demo, fixtures, benchmarks, fuzzing, lint.
GO       ?= go
PYTHON   ?= /usr/bin/python3
BIN      := bin/ucp
EXAMPLE  ?= testdata/fixtures/deepspeed/megatron_tp2_bf16opt_dp2/checkpoint
FUZZTIME ?= 60s
FUZZFLAGS ?=
OUT      ?= out

# CI (CI=true) turns every skipped real-torch or tool check into a failure.
ifeq ($(CI),true)
export UCP_REQUIRE_TORCH  := 1
export UCP_REQUIRE_TORCH2 := 1
export UCP_REQUIRE_TOOLS  := 1
CI_CHECKS := cuda-check
endif

.PHONY: all build install demo test deps fixtures dcp-fixtures bench fuzz lint clean python cuda-check cross check-deepspeed check-families check-torchtitan megatron-fixtures megatron-grouped-fixtures check-megatron

all: build

build:
	$(GO) build -o $(BIN) ./cmd/ucp

# Installs ucp into $GOBIN when set (as go install does), else into $(PREFIX)/bin.
PREFIX ?= /usr/local
install: build
	@dir="$${GOBIN:-$$($(GO) env GOBIN)}"; dir="$${dir:-$(PREFIX)/bin}"; \
	install -d "$$dir" && install -m 0755 $(BIN) "$$dir/ucp" && echo "installed $$dir/ucp"

# The main job on the bundled example: inspect it, convert it, show and verify the atomic result, then show
# one converted tensor's values and check every state against the source with ucp diff; last, write it
# back as a DeepSpeed checkpoint at another parallelism (TP 1 x DP 3, ZeRO-2) and check that one too.
demo: build
	$(BIN) inspect $(EXAMPLE)
	$(BIN) convert --force $(EXAMPLE) $(OUT)/demo/atomic
	$(BIN) inspect $(OUT)/demo/atomic
	$(BIN) verify $(OUT)/demo/atomic
	$(BIN) inspect $(OUT)/demo/atomic/zero/$$(ls $(OUT)/demo/atomic/zero | grep -v '\.pt$$' | head -1)/fp32.pt
	$(BIN) diff --all $(EXAMPLE) $(OUT)/demo/atomic | head -8
	$(BIN) diff $(EXAMPLE) $(OUT)/demo/atomic
	$(BIN) reshard --force $(OUT)/demo/atomic $(OUT)/demo/tp1_dp3/global_step3 --to deepspeed --tp 1 --dp 3 --zero 2
	$(BIN) diff $(OUT)/demo/tp1_dp3 $(OUT)/demo/atomic
	@echo
	@echo "Done: the atomic checkpoint is in $(OUT)/demo/atomic, the DeepSpeed TP 1 x DP 3 one in $(OUT)/demo/tp1_dp3."
	@echo "Next:"
	@echo "  make install                         # put ucp on your PATH (GOBIN or $(PREFIX)/bin); or use $(BIN)"
	@echo "  ucp convert YOUR_CKPT/ OUT/          # your own checkpoint (ucp help convert; --dry-run shows the plan)"
	@echo "  pip install ./python                 # load OUT/ from PyTorch at any TP/DP (README: Loading from Python)"
	@echo "  make test                            # the test suite (installs what it needs; see README)"

deps:
	./scripts/deps.sh

# The Python package's tests run inside `go test ./capi` (TestPython), with Debian's torch and torch 2.6.
test: deps python cross $(CI_CHECKS)
	$(GO) vet ./...
	$(GO) test -timeout 15m ./...

# ucp builds for macOS and Windows too (without cgo: no libucp.so, no NCCL).
cross:
	GOOS=darwin GOARCH=arm64 $(GO) build ./...
	GOOS=windows GOARCH=amd64 $(GO) build ./...

# python/ucp/libucp.so: the C ABI (capi/) the Python package loads; then PYTHONPATH=python or pip install ./python.
python:
	$(GO) build -buildmode=c-shared -o python/ucp/libucp.so ./capi

# Compiles and vets internal/load's NCCL path (-tags cuda) against CUDA 11.8 and NCCL headers and libraries
# unpacked from Debian packages into /var/cache/ucp/cuda (no GPU or driver needed).
cuda-check:
	GO=$(GO) ./scripts/cuda-check.sh

# python/ucp/libucp.so with the CUDA device path of transport="ucp" (-tags cuda; CUDA and NCCL headers from
# cuda-check's cache; libcuda.so.1 and libnccl.so.2 are opened at run time, so it loads without a GPU too).
python-cuda:
	[ -f /var/cache/ucp/cuda/complete ] || GO=$(GO) ./scripts/cuda-check.sh
	CGO_CFLAGS=-I/var/cache/ucp/cuda/root/usr/include $(GO) build -tags cuda -buildmode=c-shared -o python/ucp/libucp.so ./capi

# gpu-artifacts/: what scripts/gpu-check.sh needs on a GPU machine without Go (libucp.so and the internal/load
# test binary built with -tags cuda, static ucp and benchgen to generate the checkpoint there); carry it.
gpu-artifacts:
	GO=$(GO) ./scripts/gpu-artifacts.sh gpu-artifacts

# Regenerates every committed fixture with Debian's torch (deterministic).
fixtures:
	$(PYTHON) testdata/gen/torch_fixtures.py
	$(PYTHON) testdata/gen/safetensors_fixtures.py
	$(PYTHON) testdata/gen/deepspeed_fixtures.py
	$(PYTHON) testdata/gen/zero3_fixtures.py
	$(PYTHON) testdata/gen/megatron_fixtures.py
	$(MAKE) dcp-fixtures

# Regenerates the DCP fixtures with real torch 2.6 in the Debian 13 chroot (root; about 5 minutes, so
# not part of make test): dcp_fixtures.py writes its cases with real dcp.save (stand-ins only for the
# 2.2, 2.3 and 2.7+ layouts torch 2.6 cannot write); dcp_torch2_fixtures.py trains a model with FSDP2
# and saves it, then builds the zstd and Hugging Face safetensors layouts from that run.
dcp-fixtures:
	./scripts/torch2-chroot.sh run . python3 testdata/gen/dcp_fixtures.py
	./scripts/torch2-chroot.sh run . python3 testdata/gen/dcp_torch2_fixtures.py

# DeepSpeed's own engine (v0.14.5 source tree, run in place on CPU with Debian's torch 1.13 and gloo) trains,
# saves, and loads what ucp reshard wrote at a new DP / ZeRO stage / optimizer; compares every rank's state
# with the truth and runs one step. Not part of make test: CI cannot fetch DeepSpeed.
# The model families against real megatron-core and transformers (scripts/check-families.sh).
check-families:
	@test -n "$(MEGATRON_SRC)" -a -n "$(TRANSFORMERS_SRC)" || { echo "usage: make check-families MEGATRON_SRC=/path/to/megatron-core TRANSFORMERS_SRC=/path/to/transformers-4.57.1"; exit 2; }
	./scripts/check-families.sh "$(MEGATRON_SRC)" "$(TRANSFORMERS_SRC)"

# torchtitan llama3 -> ucp -> transformers logits (scripts/check-torchtitan.sh).
check-torchtitan:
	@test -n "$(TORCHTITAN_SRC)" -a -n "$(TRANSFORMERS_SRC)" || { echo "usage: make check-torchtitan TORCHTITAN_SRC=/path/to/torchtitan-v0.2.0 TRANSFORMERS_SRC=/path/to/transformers-4.57.1"; exit 2; }
	./scripts/check-torchtitan.sh "$(TORCHTITAN_SRC)" "$(TRANSFORMERS_SRC)"

check-deepspeed: build
	@test -n "$(DS_SRC)" || { echo "usage: make check-deepspeed DS_SRC=/path/to/DeepSpeed-v0.14.5"; exit 2; }
	./scripts/check-deepspeed.sh "$(DS_SRC)" $(BIN)

# Regenerates the Megatron torch_dist fixtures with real megatron-core (a Megatron-LM release
# tag's tree, e.g. core_v0.19.0) on CPU in the torch 2.6 chroot; run once per core version.
# Not part of CI: the fixtures are committed.
# The MoE families (mixtral, qwen3_moe, qwen2_moe) against real megatron-core and real transformers on CPU
# (scripts/check-moe.sh; TRANSFORMERS_SHIMS=../shared/tools/transformers-shims by default). Not run by CI.
.PHONY: check-moe
check-moe: build
	@test -n "$(MEGATRON_SRC)" -a -n "$(TRANSFORMERS_SRC)" || { echo "usage: make check-moe MEGATRON_SRC=/path/to/Megatron-LM-core_v0.19.0 TRANSFORMERS_SRC=/path/to/transformers-v4.57.1"; exit 2; }
	./scripts/check-moe.sh "$(MEGATRON_SRC)" "$(TRANSFORMERS_SRC)" $(BIN)

megatron-fixtures:
	@test -n "$(MEGATRON_SRC)" || { echo "usage: make megatron-fixtures MEGATRON_SRC=/path/to/Megatron-LM"; exit 2; }
	./scripts/megatron-fixtures.sh $(MEGATRON_SRC)

# GroupedMLP (legacy grouped GEMM) fixtures, --ckpt-format torch and torch_dist, with real megatron-core
# core_v0.15.3 (GroupedMLP is gone from core 0.17) and the CPU grouped_gemm stand-in (testdata/gen/cpu_shims).
megatron-grouped-fixtures:
	@test -n "$(MEGATRON_SRC)" || { echo "usage: make megatron-grouped-fixtures MEGATRON_SRC=/path/to/Megatron-LM (core_v0.15.3)"; exit 2; }
	./scripts/megatron-grouped-fixtures.sh $(MEGATRON_SRC)

# Real megatron-core (a Megatron-LM release tag's tree: core_v0.19.0, core_v0.18.2, core_v0.15.3) loads
# what `ucp reshard --to megatron --ckpt-format torch_dist` writes at new degrees, bit for bit against the
# fixtures' live truth, trains a step, and times its load against its own checkpoint. Not part of CI.
check-megatron: build
	@test -n "$(MEGATRON_SRC)" || { echo "usage: make check-megatron MEGATRON_SRC=/path/to/Megatron-LM"; exit 2; }
	./scripts/megatron-check.sh $(MEGATRON_SRC) $(BIN)

# The kill -9 loop (cmd/ucp TestKillResume): a generated ~2.2 GB DeepSpeed checkpoint is converted, killed
# right after each phase and after 10 random delays, resumed with --resume and compared file by file with a
# clean run. Needs about 7 GB free in KILLTEST_DIR.
KILLTEST_DIR ?= .killtest
.PHONY: killtest
killtest:
	mkdir -p $(KILLTEST_DIR)
	UCP_KILLTEST=1 UCP_KILLTEST_DIR=$(abspath $(KILLTEST_DIR)) $(GO) test -count=1 -timeout 60m -run '^TestKillResume$$' -v ./cmd/ucp

bench: build
	./scripts/bench.sh

# The scale proof (issue 28): generated ZeRO-2 checkpoints of 12.85 and 25.56 GB converted cold on one node and
# as 3 mpirun node-processes against cp -r; needs about 62 GB free; variables at the top of scripts/scale.sh.
.PHONY: scale
scale:
	./scripts/scale.sh

FUZZ_TARGETS := ./internal/pyobj:FuzzUnpickle ./internal/torchfile:FuzzRead ./internal/safetensors:FuzzRead ./internal/formats/dcp:FuzzMetadata ./internal/atomic:FuzzManifest ./internal/atomic:FuzzJournal
fuzz:
	@for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; name=$${t##*:}; \
		echo "fuzz $$pkg $$name for $(FUZZTIME)"; \
		$(GO) test $$pkg -run='^$$' -fuzz="^$$name$$" -fuzztime=$(FUZZTIME) -fuzzminimizetime=5s $(FUZZFLAGS) || exit 1; \
	done

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet ./...

clean:
	rm -rf bin $(OUT)
