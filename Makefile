# The README's two commands. Everything clever lives in CMake and scripts/.
#   make demo   install what is missing, build, train the tiny CPU recipe
#   make test   install what is missing, build, run the whole ctest suite, then fuzz each parser
#               for FUZZ_SECONDS (clang + libFuzzer, installed when missing; CI runs this)
#   make fuzz   the fuzzing alone, longer
# Variables: BUILD (build folder), JOBS (parallel compile jobs), CUDA (AUTO|ON|OFF; OFF unless a
# GPU is visible), BUILD_TYPE (CMake build type of a new build folder; default Release, e.g.
# RelWithDebInfo for debug info), CTEST_ARGS (e.g. "-L unit"), SAN=1 (ASan + UBSan build in
# build-san; docs/reliability.md, "Sanitizers"; `make test SAN=1` does not fuzz), TSAN=1
# (ThreadSanitizer build in build-tsan: `make test TSAN=1` builds and runs only the tests labelled
# `threaded`, and does not fuzz),
# FUZZ_SECONDS (seconds each fuzz target runs: default 30 in `make test`, 60 in `make fuzz`;
# `make test FUZZ_SECONDS=0` skips the fuzzing and the clang build: a developer's opt-out, which
# CI never sets), FUZZ_BUILD (the fuzz targets' build folder; default BUILD-fuzz).
SAN   ?= 0
TSAN  ?= 0
ifeq ($(SAN),1)
BUILD ?= build-san
SAN_FLAGS := -DCIUIC_SANITIZE=ON
else ifeq ($(TSAN),1)
BUILD ?= build-tsan
SAN_FLAGS := -DCIUIC_TSAN=ON
else
BUILD ?= build
SAN_FLAGS :=
endif
# Warnings are errors in a build folder that `make test` creates (CI's: a fresh clone) and in any
# build configured with CI=true in the environment (CMake option CIUIC_WERROR); a folder that
# `make build` or `make demo` configured keeps its setting (switching would recompile everything).
# Not in the sanitizer builds (GCC's false warnings under -fsanitize).
WERROR_FLAGS :=
ifeq ($(SAN)$(TSAN),00)
test: WERROR_FLAGS := -DCIUIC_WERROR=ON
endif
JOBS  ?= $(shell nproc)
CUDA  ?= $(shell nvidia-smi -L >/dev/null 2>&1 && echo AUTO || echo OFF)
BUILD_TYPE ?=
CTEST_ARGS ?=

.PHONY: all setup setup-tests configure build demo test fuzz fuzz-run format format-check clean
all: build

setup:
	@scripts/setup-deps.sh

# What the Python tests import (transformers; torch's runtime wheels so that `import torch` works).
setup-tests:
	@scripts/setup-deps.sh --tests

$(BUILD)/build.ninja: | setup
	cmake -S . -B $(BUILD) -G Ninja -DCIUIC_WITH_CUDA=$(CUDA) $(SAN_FLAGS) $(WERROR_FLAGS) $(if $(BUILD_TYPE),-DCMAKE_BUILD_TYPE=$(BUILD_TYPE))

configure: setup $(BUILD)/build.ninja

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# The demo builds only what it runs (target `runtime`: ciuic-run and the plugins, not the tests
# and benchmarks) and prints the time of each phase.
demo:
	@t0=$$(date +%s) && $(MAKE) --no-print-directory configure && t1=$$(date +%s) && \
	cmake --build $(BUILD) -j $(JOBS) --target runtime && t2=$$(date +%s) && \
	scripts/demo.sh $(BUILD) && t3=$$(date +%s) && \
	echo "make demo: set-up and configure $$((t1 - t0)) s, build $$((t2 - t1)) s, data + training + evaluation $$((t3 - t2)) s"

# The tests build only what ctest runs (target `test-deps`: the runtime, test programs and test
# plugins; not the benchmarks, which `make build` builds). With TSAN=1 only the threaded tests
# (target `test-deps-threaded`, ctest label `threaded`).
ifeq ($(TSAN),1)
TEST_TARGET := test-deps-threaded
TEST_LABEL := -L threaded
else
TEST_TARGET := test-deps
TEST_LABEL :=
endif
test: setup-tests configure
	cmake --build $(BUILD) -j $(JOBS) --target $(TEST_TARGET)
	cd $(BUILD) && ctest --output-on-failure -j 2 $(TEST_LABEL) $(CTEST_ARGS)
	@if [ "$(FUZZ_SECONDS)" = 0 ]; then echo "make test: no fuzzing (FUZZ_SECONDS=0)"; \
	elif [ "$(SAN)" = 1 ]; then echo "make test: no fuzzing with SAN=1 (clang's fuzz targets link the plain build)"; \
	elif [ "$(TSAN)" = 1 ]; then echo "make test: no fuzzing with TSAN=1"; \
	else $(MAKE) --no-print-directory fuzz-run FUZZ_SECONDS=$(FUZZ_SECONDS); fi

# libFuzzer on the parsers (tests/fuzz, docs/reliability.md "Fuzzing"): clang builds the targets
# against this build's libraries (FUZZ_BUILD), then each runs FUZZ_SECONDS from the committed
# seeds; a finding fails the step and names the input. setup-deps.sh --fuzz installs clang, and
# fails when it cannot: CI never skips the fuzzing silently.
FUZZ_BUILD ?= $(BUILD)-fuzz
test: FUZZ_SECONDS ?= 30
fuzz: FUZZ_SECONDS ?= 60
fuzz: configure
	@$(MAKE) --no-print-directory fuzz-run FUZZ_SECONDS=$(FUZZ_SECONDS)

# (internal: after configure)
fuzz-run:
	@if [ "$(SAN)" = 1 ] || [ "$(TSAN)" = 1 ]; then echo "make fuzz: not with SAN=1 or TSAN=1 (clang's fuzz targets link the plain build)" >&2; exit 2; fi
	scripts/setup-deps.sh --fuzz
	cmake --build $(BUILD) -j $(JOBS) --target runtime
	cmake -S tests/fuzz/libfuzzer -B $(FUZZ_BUILD) -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCIUIC_MAIN_BUILD=$(abspath $(BUILD))
	cmake --build $(FUZZ_BUILD) -j $(JOBS)
	scripts/fuzz.sh $(FUZZ_BUILD) $(FUZZ_SECONDS)

# clang-format with .clang-format (scripts/format.sh; docs/plugins.md, "Code style"):
# `make format FILES="a.cpp b.h"` formats those files in place; `make format-check [FILES=...]`
# lists the files that differ from clang-format's output (every tracked C++ file without FILES)
# and fails if one does. The tree is formatted whole (since bc5cbe2): `make test` runs the same
# check as the ctest `format_check`, so CI fails on a file clang-format 14 would change.
FILES ?=
format:
	@scripts/format.sh $(FILES)
format-check:
	@scripts/format.sh --check $(FILES)

clean:
	rm -rf $(BUILD) $(FUZZ_BUILD)
