# Quickstart targets (README): `make demo` and `make test` set up everything a
# fresh Debian 12 machine needs (run as root), then run. Both are idempotent;
# a second run with nothing changed rebuilds nothing.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
CMAKE := $(VENV)/bin/cmake
CTEST := $(VENV)/bin/ctest
APT_PACKAGES := build-essential libabsl-dev libgtest-dev libgmock-dev libbenchmark-dev libopenblas-dev libeigen3-dev python3-venv python3-dev \
                libgrpc++-dev protobuf-compiler-grpc protobuf-compiler libprotobuf-dev libgloo-dev libssl-dev
PY_BUILD_DEPS := "scikit-build-core>=0.10" "pybind11>=2.12" "cmake>=3.24" ninja numpy ml_dtypes optree opt_einsum pytest hypothesis
SOURCES := CMakeLists.txt pyproject.toml $(shell find csrc python -type f \( -name '*.cc' -o -name '*.h' \
             -o -name '*.py' -o -name '*.pyi' -o -name '*.proto' -o -name 'CMakeLists.txt' \) 2>/dev/null)
CPP_CONFIG := -G Ninja -DPATHWAYS_BUILD_TESTS=ON -DPATHWAYS_BUILD_PYTHON=OFF -DCMAKE_MAKE_PROGRAM=$(abspath $(VENV)/bin/ninja)

.PHONY: demo test test-cpp test-python bench sanitize sanitize-asan sanitize-tsan sanitize-threads fuzz deps clang-deps clean

demo: $(VENV)/.installed
	$(VPY) examples/figure2.py

test: test-cpp test-python

# Debian packages: installed only when one is missing.
deps:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

$(VENV)/.created: | deps
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q $(PY_BUILD_DEPS)
	touch $@

# The package, built by scikit-build-core into build/<wheel tag> (incremental).
$(VENV)/.installed: $(VENV)/.created $(SOURCES)
	$(VPY) -m pip install -q --no-build-isolation --no-deps .
	touch $@

test-cpp: deps $(VENV)/.created
	$(CMAKE) -S . -B build/cpp $(CPP_CONFIG) >/dev/null
	$(CMAKE) --build build/cpp
	$(CTEST) --test-dir build/cpp --output-on-failure -j2

# What only some tests need: Ray (hosts="ray" on a local Ray cluster), JAX
# (the front end, pinned to the minor version whose jaxprs the lowering
# knows; pathways also works in a process that imported jax and ray, with
# their own copies of gRPC and abseil) and the JAX libraries whose models
# the front-end tests run (flax, optax, equinox, haiku), and tensorstore and Orbax
# for the checkpoints' tests (Orbax reads pathways' checkpoints, and pathways Orbax's).
JAX_REQUIREMENT := "jax>=0.10.2,<0.11"
$(VENV)/.test-deps: $(VENV)/.created
	$(VPY) -m pip install -q ray $(JAX_REQUIREMENT) flax optax equinox dm-haiku "tensorstore>=0.1.84" orbax-checkpoint
	touch $@

# The Python suite three times: hosts in process (the default); each host a
# process of its own on loopback (hosts="local_processes"); and as a tenant
# of a pathways-server, whose hosts a second client process keeps busy.
test-python: $(VENV)/.installed $(VENV)/.test-deps
	cd tests/python && ../../$(VPY) -m pytest -q -p no:cacheprovider .
	cd tests/python && ../../$(VPY) -m pytest -q -p no:cacheprovider --hosts=local_processes .
	cd tests/python && ../../$(VPY) -m pytest -q -p no:cacheprovider --hosts=service .

# The paper's experiments (§5), pathways and its peers side by side: tables
# and plots in benchmarks/results/. Peers come from the [bench] extra.
$(VENV)/.bench: $(VENV)/.created
	$(VPY) -m pip install -q $(JAX_REQUIREMENT) flax optax ray "dask[distributed]" matplotlib
	touch $@

bench: $(VENV)/.installed $(VENV)/.bench
	$(VPY) benchmarks/run_all.py

# C++ tests under AddressSanitizer + UndefinedBehaviorSanitizer, then
# ThreadSanitizer (run with ASLR off: TSan's shadow memory needs it on
# kernels with high mmap randomization).
#
# Under TSan, OpenBLAS (float matmul) runs single-threaded: it waits for its
# worker threads by spinning on plain flags inside the uninstrumented library,
# which TSan cannot see, so every read of a result a worker wrote is reported
# as a race. On the calling thread, OpenBLAS's writes that TSan does see (its
# memset of the output) stay checked against our own threads. A
# `race:libopenblas` suppression would hide those as well; `called_from_lib`
# does not work (TSan ignores only the first of libopenblas's two executable
# segments). `make test` and `make sanitize-asan` run the threaded path.
# tests/tsan_suppressions.txt names the races TSan reports inside other
# uninstrumented libraries (gRPC's poller, abseil's deadlock detector).
# Those with a gRPC frame match only if TSan can restore that stack: with
# its default history (256K accesses a thread), gRPC's serialization of a
# frame on our thread (in StartWrite), long before we reuse the frame after
# its OnWriteDone, was at times '[failed to restore the stack]' and so
# reported; history_size=7 (4M accesses) keeps it.
sanitize: sanitize-asan sanitize-tsan sanitize-threads fuzz

sanitize-asan: deps $(VENV)/.created
	$(CMAKE) -S . -B build/asan $(CPP_CONFIG) -DCMAKE_BUILD_TYPE=Debug -DPATHWAYS_SANITIZE=address,undefined >/dev/null
	$(CMAKE) --build build/asan
	ASAN_OPTIONS=abort_on_error=1:detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  $(CTEST) --test-dir build/asan --output-on-failure -j2

sanitize-tsan: deps $(VENV)/.created
	$(CMAKE) -S . -B build/tsan $(CPP_CONFIG) -DCMAKE_BUILD_TYPE=Debug -DPATHWAYS_SANITIZE=thread >/dev/null
	$(CMAKE) --build build/tsan
	OPENBLAS_NUM_THREADS=1 TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:history_size=7:suppressions=$(abspath tests/tsan_suppressions.txt) setarch $$(uname -m) -R \
	  $(CTEST) --test-dir build/tsan --output-on-failure -j2

# Clang's tools, only for `make sanitize`: its thread-safety analysis and
# libFuzzer (whose runtime is in libclang-rt-14-dev).
CLANG_APT_PACKAGES := clang libclang-rt-14-dev
CLANG_CONFIG := -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++
clang-deps:
	@$(MAKE) --no-print-directory deps APT_PACKAGES="$(CLANG_APT_PACKAGES)"

# Every library and test compiled by clang with -Werror=thread-safety: the
# ABSL_GUARDED_BY / ABSL_EXCLUSIVE_LOCKS_REQUIRED annotations are checked.
sanitize-threads: clang-deps $(VENV)/.created
	$(CMAKE) -S . -B build/threads $(CPP_CONFIG) $(CLANG_CONFIG) -DPATHWAYS_THREAD_SAFETY=ON >/dev/null
	$(CMAKE) --build build/threads

# The fuzz targets (`*_fuzzer.cc` beside their units) under ASan+UBSan, each
# for FUZZ_SECONDS, from the corpus kept in build/fuzz/corpus. A crash
# leaves its input in build/fuzz/ and fails the target.
FUZZ_SECONDS ?= 60
FUZZERS := topology_fuzzer function_fuzzer function_ir_wire_fuzzer data_plane_wire_fuzzer auth_fuzzer
fuzz: deps clang-deps $(VENV)/.created
	$(CMAKE) -S . -B build/fuzz -G Ninja -DCMAKE_MAKE_PROGRAM=$(abspath $(VENV)/bin/ninja) $(CLANG_CONFIG) \
	  -DPATHWAYS_BUILD_PYTHON=OFF -DPATHWAYS_BUILD_FUZZERS=ON -DCMAKE_BUILD_TYPE=Debug \
	  -DPATHWAYS_SANITIZE=address,undefined >/dev/null
	$(CMAKE) --build build/fuzz --target $(FUZZERS)
	@set -o pipefail; for f in $(FUZZERS); do \
	  mkdir -p build/fuzz/corpus/$$f; \
	  echo "fuzzing $$f for $(FUZZ_SECONDS) s"; \
	  ( cd build/fuzz && ASAN_OPTIONS=abort_on_error=1:detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	    ./$$(find . -name $$f -type f -executable | head -1) corpus/$$f -max_total_time=$(FUZZ_SECONDS) \
	    -max_len=512 -print_final_stats=1 2>&1 | tail -4 ) || exit 1; \
	done

clean:
	rm -rf build $(VENV)
