# Every command sets itself up on a fresh Debian machine (see README.md).
export CARGO_TARGET_DIR ?= $(HOME)/.cache/freqcap-target

.PHONY: deps test bench schemas run

# Native build dependencies, installed only when missing (needs root or sudo).
deps:
	@for p in libclang-dev build-essential pkg-config; do \
	  dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q $$missing; fi

# All tests, in the release profile (one profile for tests, benches and the binary).
test: deps
	cargo test --release --all-targets
	cargo test --release --doc

bench: deps
	cargo bench --bench limits

# Regenerate the checked-in JSON Schemas after changing a definition type.
schemas:
	cargo run --release -- schemas --out schemas

# Runs the freqcap binary: make run ARGS="validate examples/policy.json".
ARGS ?= --help
run: deps
	cargo run --release -- $(ARGS)
