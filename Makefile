# libasync: the two commands of the README.
#   make demo   builds the library and examples/console_worker (nothing else), and
#               runs it on this terminal
#   make test   runs every test: gofmt + go vet, go test -race, the C tests (ctest)
#               with the epoll and poll backends, the C tests again with
#               libasync's C and the tests under ASan+UBSan, then under TSan, the
#               cross-platform builds and tests (scripts/cross.sh: BSDs, macOS,
#               Windows under wine, linux/arm64 under qemu), the installed package
#               (scripts/install_test.sh) and a short fuzz run; SOAK=1 adds the
#               long runs (test-soak)
# Other targets: make help lists them all (test-valgrind: the fiber C tests
# under valgrind memcheck; not part of make test).
# Every step of make test prints a line at least every 30 s or so: ctest and
# the fuzzer print their own; go test goes through scripts/gotest_progress.go;
# builds and other quiet commands go through scripts/progress.sh, which says
# "still running" after 30 s of silence; scripts/cross.sh prints a line per
# step and a progress line every 30 s while a step runs.

export PATH := $(PATH):/usr/local/go/bin
BUILD ?= build
BUILD_SAN ?= build-asan
BUILD_TSAN ?= build-tsan
BUILD_VG ?= build-valgrind
PREFIX ?= /usr/local
JOBS ?= 2
CTEST_FLAGS ?= --output-on-failure -j$(JOBS)
PROGRESS := bash scripts/progress.sh
# no "make[N]: Entering directory" lines from the Makefiles cmake generates
MAKEFLAGS += --no-print-directory

.PHONY: all help deps configure build test test-go test-c test-asan test-tsan test-cross test-install test-fuzz test-valgrind \
	test-many-workers test-soak soak \
	demo install uninstall bench clean

all: build

help:
	@echo "make [target] [PREFIX=/usr/local] [JOBS=2]"
	@echo "  build         build libasync.so, libasync.a, the C tests and examples in $(BUILD)/ (default)"
	@echo "  demo          build the library and examples/console_worker only, then run it on this terminal"
	@echo "  test          the suites below up to test-fuzz; installs missing Debian packages as root (README)"
	@echo "                SOAK=1: also the long runs (test-soak)"
	@echo "  test-go       gofmt, go vet, go test -race"
	@echo "  test-c        the C tests (ctest), epoll and poll backends"
	@echo "  test-asan     the C tests again, libasync's C and the tests under ASan+UBSan, in $(BUILD_SAN)/"
	@echo "  test-tsan     the C tests under ThreadSanitizer, libasync's C instrumented, in $(BUILD_TSAN)/"
	@echo "                (TSAN_SOAK=1 adds the cases that take minutes under TSan)"
	@echo "  test-cross    scripts/cross.sh: BSDs, macOS, Windows DLL under wine, linux/arm64 under qemu"
	@echo "  test-install  scripts/install_test.sh: install to a temporary prefix, build against it"
	@echo "                with pkg-config, CMake find_package and by hand, shared and static"
	@echo "  test-fuzz     a short fuzz run (FUZZTIME=10m FUZZ_KEEP=1 for a long one)"
	@echo "  test-valgrind the fiber C tests under valgrind memcheck (not in make test)"
	@echo "  test-many-workers"
	@echo "                the fiber C tests with ASYNC_WORKERS=16, then 64, in $(BUILD)/"
	@echo "                (BUILD=$(BUILD_SAN): the ASan build; not in make test)"
	@echo "  test-soak     the TSan soak cases, test-many-workers under ASan and TSan, then soak"
	@echo "  soak          long stress with RSS and fd counts sampled (not in make test)"
	@echo "  install       cmake --install to PREFIX (now $(PREFIX))"
	@echo "  uninstall     remove what the last make install installed ($(BUILD)/install_manifest.txt)"
	@echo "  bench         the benchmarks against libuv and friends (docs/PERFORMANCE.md)"
	@echo "  deps          install cmake, gcc, g++, make when missing (as root)"
	@echo "  clean         remove $(BUILD)/, $(BUILD_SAN)/ and $(BUILD_TSAN)/"

deps:
	@bash scripts/deps.sh

configure: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null

build: configure
	@echo "build: libasync (go build: a minute or two the first time), the C tests and examples in $(BUILD)/"
	@$(PROGRESS) build cmake --build $(BUILD) -j$(JOBS)

# SOAK=1 make test: the long runs too (docs/TESTING.md, "Soak"): the cases
# that take minutes under TSan, every fiber case with 16 and with 64 workers
# under ASan and under TSan, FUZZTIME (default 5m then) per fuzz target, and
# make soak.
SOAK ?= 0
ifeq ($(SOAK),1)
FUZZTIME ?= 5m
export FUZZTIME
endif
test: test-go test-c test-asan test-tsan test-cross test-install test-fuzz $(if $(filter 1,$(SOAK)),test-soak)
	@echo "make test: all test suites passed"

test-soak: test-asan test-tsan
	@echo "test-soak: every fiber case with 16 and 64 workers, under ASan ($(BUILD_SAN)/), then TSan ($(BUILD_TSAN)/)"
	@$(MAKE) test-many-workers BUILD=$(BUILD_SAN)
	@$(MAKE) test-many-workers BUILD=$(BUILD_TSAN)
	@$(MAKE) soak

test-go: deps
	@echo "test-go: gofmt"
	@gofmt -l libasync port cabi bench internal scripts 2>/dev/null | (! grep .) || (echo "gofmt needed on the files above" >&2; exit 1)
	@echo "test-go: go vet ./... (builds every package)"
	@$(PROGRESS) "go vet" go vet ./...
	@echo "test-go: go test -race -count=1 ./... (a line per package)"
	@bash -o pipefail -c 'go test -race -count=1 -json ./... 2>&1 | go run scripts/gotest_progress.go'

test-c: build
	@echo "test-c: ctest in $(BUILD)/"
	@$(PROGRESS) ctest ctest --test-dir $(BUILD) $(CTEST_FLAGS)

test-asan: deps
	@cmake -S . -B $(BUILD_SAN) -DCMAKE_BUILD_TYPE=Debug -DASYNC_SANITIZE=ON >/dev/null
	@echo "test-asan: building with ASan+UBSan in $(BUILD_SAN)/ (the Go build of the library may be quiet for a minute)"
	@$(PROGRESS) "asan build" cmake --build $(BUILD_SAN) -j$(JOBS)
	@echo "test-asan: ctest in $(BUILD_SAN)/"
	@$(PROGRESS) "asan ctest" ctest --test-dir $(BUILD_SAN) $(CTEST_FLAGS)

# The C tests under ThreadSanitizer (libasync's own C instrumented, fiber
# switches annotated; docs/TESTING.md, "ThreadSanitizer"). Cases labelled
# tsan_soak take minutes under TSan: left out unless TSAN_SOAK=1. Cases
# TSan cannot run are not registered in a TSan build (word notsan).
TSAN_SOAK ?= $(SOAK)
TSAN_SELECT = $(if $(filter 1,$(TSAN_SOAK)),,-LE '^tsan_soak$$')
test-tsan: deps
	@cmake -S . -B $(BUILD_TSAN) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DASYNC_TSAN=ON >/dev/null
	@echo "test-tsan: building with ThreadSanitizer in $(BUILD_TSAN)/ (the Go build of the library may be quiet for a minute)"
	@$(PROGRESS) "tsan build" cmake --build $(BUILD_TSAN) -j$(JOBS)
	@echo "test-tsan: ctest in $(BUILD_TSAN)/$(if $(filter 1,$(TSAN_SOAK)),, (without the tsan_soak cases: TSAN_SOAK=1 runs them))"
	@$(PROGRESS) "tsan ctest" ctest --test-dir $(BUILD_TSAN) $(CTEST_FLAGS) $(TSAN_SELECT)

test-cross: deps
	@echo "test-cross: scripts/cross.sh (a line per step, and every 30 s while one runs)"
	@bash scripts/cross.sh

# The fiber C tests that carry the ctest label valgrind (the basic scheduler,
# channel, fd I/O and stack cases of fiber_sched, fiber_sync, fiber_io and
# fiber_stack) under valgrind memcheck, any error fails. libasync is built with
# -tags=valgrind (Go's runtime then describes its heap and stacks to memcheck)
# and with DWARF 4 (valgrind 3.19 cannot read Go's DWARF 5). Two cases are left
# out: they hold 100k fiber stacks at once, more guarded stacks than
# valgrind's mapping table takes.
VG_EXCLUDE ?= ^fiber_sched\.(fib_100k|parked_100k)$$
test-valgrind:
	@bash scripts/deps.sh valgrind
	cmake -S . -B $(BUILD_VG) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DASYNC_VALGRIND=ON \
		-DASYNC_GOFLAGS=-tags=valgrind >/dev/null
	GOEXPERIMENT=nodwarf5 cmake --build $(BUILD_VG) -j$(JOBS)
	ctest --test-dir $(BUILD_VG) $(CTEST_FLAGS) -L '^valgrind$$' -E '$(VG_EXCLUDE)'

# The fiber C tests (ctest labels fiber_*) twice, with ASYNC_WORKERS=16 and
# 64 (scripts/many_workers.sh), in $(BUILD), which is built first (and
# configured as make build does if it is not configured yet). Not part of
# make test; BUILD=$(BUILD_SAN) runs it on the ASan build.
test-many-workers:
	@[ -f $(BUILD)/CMakeCache.txt ] || $(MAKE) configure
	@$(PROGRESS) build cmake --build $(BUILD) -j$(JOBS)
	@$(PROGRESS) many-workers bash scripts/many_workers.sh $(BUILD)

test-install: build
	@echo "test-install: scripts/install_test.sh"
	@$(PROGRESS) test-install bash scripts/install_test.sh $(BUILD)

# FUZZTIME=10m FUZZ_KEEP=1 make test-fuzz for a long run that keeps what the
# fuzzer found in libasync/testdata/fuzz (make test leaves the tree as it is).
test-fuzz: deps
	@echo "test-fuzz: scripts/fuzz.sh"
	@FUZZ_KEEP=$${FUZZ_KEEP:-0} $(PROGRESS) fuzz bash scripts/fuzz.sh

# Long stress with RSS and descriptor counts sampled (not part of make test).
soak: build
	bash scripts/soak.sh

# Builds only what the demo needs (libasync and console_worker; the output
# goes to $(BUILD)/demo-build.log and is shown only if the build fails), then
# runs it. It reads commands from stdin; at end of input it shuts down.
demo: configure
	@echo "demo: building libasync and examples/console_worker (a minute or two the first time; log: $(BUILD)/demo-build.log)"
	@$(PROGRESS) "demo build" sh -c 'cmake --build $(BUILD) -j$(JOBS) --target console_worker >$(BUILD)/demo-build.log 2>&1' || \
		{ cat $(BUILD)/demo-build.log; echo "demo: the build failed (log: $(BUILD)/demo-build.log)" >&2; exit 1; }
	@$(BUILD)/examples/console_worker/console_worker

install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

# Removes the files listed in $(BUILD)/install_manifest.txt, which the last
# make install (cmake --install) wrote, wherever PREFIX was then.
uninstall:
	bash scripts/uninstall.sh $(BUILD)/install_manifest.txt

bench: deps
	bash bench/run.sh

clean:
	rm -rf $(BUILD) $(BUILD_SAN) $(BUILD_TSAN)
