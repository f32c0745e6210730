# libasync: the two commands of the README.
#   make demo   builds everything and runs examples/console_worker on this terminal
#   make test   runs every test: go vet, go test -race, the C tests (ctest) with
#               the epoll and poll backends, and the C tests again under ASan+UBSan
# Other targets: build, install (PREFIX=/usr/local), bench, clean.

export PATH := $(PATH):/usr/local/go/bin
BUILD ?= build
BUILD_SAN ?= build-asan
PREFIX ?= /usr/local
JOBS ?= 2
CTEST_FLAGS ?= --output-on-failure -j$(JOBS)

.PHONY: all deps build test test-go test-c test-asan demo install bench clean

all: build

deps:
	@bash scripts/deps.sh

build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	cmake --build $(BUILD) -j$(JOBS)

test: test-go test-c test-asan
	@echo "make test: all test suites passed"

test-go: deps
	gofmt -l libasync port cabi bench 2>/dev/null | (! grep .) || (echo "gofmt needed on the files above" >&2; exit 1)
	go vet ./...
	go test -race -count=1 ./...

test-c: build
	ctest --test-dir $(BUILD) $(CTEST_FLAGS)

test-asan: deps
	cmake -S . -B $(BUILD_SAN) -DCMAKE_BUILD_TYPE=Debug -DASYNC_SANITIZE=ON >/dev/null
	cmake --build $(BUILD_SAN) -j$(JOBS)
	ctest --test-dir $(BUILD_SAN) $(CTEST_FLAGS)

demo: build
	$(BUILD)/examples/console_worker/console_worker

install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

bench: deps
	bash bench/run.sh

clean:
	rm -rf $(BUILD) $(BUILD_SAN)
