# The two entry points of the README. Each does all the set-up it needs on a fresh machine.
#   make quickstart   set up, build, fine-tune the quickstart model offline, show it learning
#   make test         set up, build, run every test (and again under ASan+UBSan)
JOBS ?= $(shell nproc)
BUILD ?= build/release
ASAN_BUILD ?= build/asan
# ccache (CMakeLists.txt uses it when installed) keys objects by paths relative to this checkout, so
# a clone in another folder (CI's) reuses what a build here compiled.
export CCACHE_BASEDIR := $(CURDIR)
export CCACHE_NOHASHDIR := 1

.PHONY: setup build test test-fast test-asan quickstart bench clean

setup:
	bash scripts/setup.sh

build: setup
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release
	cmake --build $(BUILD) -j $(JOBS)

test-fast: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

test-asan: setup
	cmake -S . -B $(ASAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKTUNE_SANITIZE=ON -DKTUNE_CUDA=OFF
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1 KTUNE_SANITIZED=1 ctest --output-on-failure -j $(JOBS) -LE slow

test: test-fast test-asan

quickstart: build
	bash scripts/quickstart.sh $(BUILD)

bench: build
	bash bench/run.sh $(BUILD)

clean:
	rm -rf build
