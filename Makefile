# tandem: `make run` and `make test` install what is missing, build, and run.
BUILD   ?= build
JOBS    ?= $(shell nproc)
CMAKE_FLAGS ?=
DECK    ?=

# Debian 12 packages tandem builds against (see README, "Dependencies").
PACKAGES = build-essential cmake pkg-config git \
           openmpi-bin libopenmpi-dev \
           libhdf5-dev hdf5-tools \
           libboost-program-options-dev libboost-log-dev \
           libgtest-dev nlohmann-json3-dev libzstd-dev libxxhash-dev \
           libonig-dev libutf8proc-dev \
           libjs-chart.js chromium \
           slurm-wlm munge

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: all deps build run test test-gpu clean

all: build

deps:
	@missing=$$(for p in $(PACKAGES); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "make deps: installing $$missing"; \
	  $(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q $$missing; \
	fi

$(BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS)

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

run: build
	$(BUILD)/tandem $(DECK)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

test-gpu: build
	cd $(BUILD) && ctest --output-on-failure -L gpu

clean:
	rm -rf $(BUILD)
