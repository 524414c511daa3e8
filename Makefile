# Every command sets itself up on a fresh Debian machine (see README.md).
export CARGO_TARGET_DIR ?= $(HOME)/.cache/freqcap-target

.PHONY: deps testdeps pydeps test bench schemas run

# Native build dependencies, Redis for the cluster and RESP tests, faketime
# for a node minutes ahead (tests/cluster.rs), curl for
# HTTP/2 (tests/e2e.rs), pip for the Python test tools,
# installed only when missing (needs root or sudo).
deps:
	@for p in libclang-dev build-essential pkg-config redis-server redis-tools faketime curl python3-pip; do \
	  dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q $$missing; fi

# Python test tools (tests/requirements.txt: schemathesis), installed only when
# a pinned version is missing. PIP_BREAK_SYSTEM_PACKAGES lets pip install into
# a distribution's own Python too (a CI machine has no other use for it).
pydeps:
	@if python3 -m pip freeze 2>/dev/null | grep -vxFf - tests/requirements.txt | grep -q '^[^#]'; then \
	  PIP_BREAK_SYSTEM_PACKAGES=1 PIP_ROOT_USER_ACTION=ignore \
	    python3 -m pip install -q -r tests/requirements.txt; fi

# Chromium, for the ad-ops page's test (tests/ui.rs): for the tests only, it
# is large.
testdeps:
	@dpkg -s chromium >/dev/null 2>&1 || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q chromium; }

# All tests, in the release profile (one profile for tests, benches and the binary),
# with the client, tower and otlp features (src/client/, src/tower.rs,
# src/service/otlp.rs) built and tested.
FEATURES = --features client,tower,otlp
test: deps testdeps pydeps
	cargo test --release --all-targets $(FEATURES)
	cargo test --release --doc $(FEATURES)

bench: deps
	cargo bench --bench limits
	cargo bench --bench engine

# Regenerate the checked-in JSON Schemas and OpenAPI document after changing
# a definition or API type.
schemas:
	cargo run --release -- schemas --out schemas

# Runs the freqcap binary; by default the service on its embedded default
# (127.0.0.1:8080, RocksDB in ./freqcap-data, durability wal).
# Other commands: make run ARGS="replay < ops.jsonl", ARGS="validate examples/policy.json".
ARGS ?= serve
run: deps
	cargo run --release -- $(ARGS)
