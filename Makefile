# Two entry points for a fresh Debian machine (as root or with sudo):
#   make demo   installs what is needed, builds, runs the main demo
#   make test   installs what is needed, builds, runs every test
# Both are idempotent; a second run only rebuilds what changed.
SHELL := /bin/bash
BUILD ?= build
JOBS ?= $(shell nproc)
# CUDA parts: AUTO where a GPU is visible, else a CPU build (the CUDA sources
# are still compile-checked by `make cuda-compile`).
CUDA ?= $(shell nvidia-smi -L >/dev/null 2>&1 && echo AUTO || echo OFF)

.PHONY: setup configure build test demo cuda-compile clean

setup:
	@bash scripts/setup.sh

configure: setup
	@cmake -S . -B $(BUILD) -G Ninja -DCOLOSSUS_CUDA=$(CUDA) > $(BUILD).configure.log 2>&1 || { cat $(BUILD).configure.log; exit 1; }

build: configure
	@ninja -C $(BUILD) -j $(JOBS)

test: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

demo: build
	@bash scripts/demo.sh $(BUILD)

# Compiles the sources only a CUDA build has (kernels, their registrations, the
# NCCL backend); nothing links or runs, so this works on machines with the CUDA
# toolkit but no GPU. The device scripts build and link the whole CUDA tree.
# compute_80 PTX (the oldest architecture the kernels target, so nothing newer
# slips in) and sm_90 machine code: half the time of the default fat build
# (sm_80/86/89/90), whose extra targets compile the same source.
CUDA_COMPILE_ARCHS ?= 80-virtual;90-real
cuda-compile: setup
	@cmake -S . -B build-cuda -G Ninja -DCOLOSSUS_CUDA=ON -DCOLOSSUS_TESTS=OFF -DCOLOSSUS_CUDA_ARCHS="$(CUDA_COMPILE_ARCHS)" > build-cuda.configure.log 2>&1 || { cat build-cuda.configure.log; exit 1; }
	@ninja -C build-cuda -j $(JOBS) colossus_cuda_objects

clean:
	rm -rf $(BUILD) build-cuda $(BUILD).configure.log build-cuda.configure.log
