#!/usr/bin/env bash
# Builds limitador-server (github.com/Kuadrant/limitador, the Rust Envoy rate
# limit service) at a pinned commit and prints the path of the binary on
# stdout (build output goes to stderr), for benches/grpc.sh's PEER=limitador:
#
#   benches/peers/limitador.sh
#   LIMITADOR_BIN=$(benches/peers/limitador.sh) benches/grpc.sh
#
# Pinned to 2981b2b (main of 2026-11, limitador-server 2.4.0-dev, its
# dependencies from Cargo.lock, --locked), built with its own release profile
# (lto = true, codegen-units = 1) and its default features (memory, disk =
# RocksDB, redis storages).
#
#   LIMITADOR_CACHE  cache folder (default ~/.cache/freqcap-peers/limitador):
#                    src/ (a clone), target/ (its own CARGO_TARGET_DIR), and a
#                    stamp naming the commit built
#   LIMITADOR_SRC    git repository to clone from (path or URL); default: the
#                    local mirror /work/.mirror/Kuadrant+limitador/repo when it
#                    exists, else https://github.com/Kuadrant/limitador
#
# Idempotent: when the binary for the pinned commit is already built it only
# prints the path. Needs git, cargo, protoc (Debian: protobuf-compiler; its
# build.rs compiles the RLS protos with tonic-prost-build), a C/C++ compiler
# and libclang (RocksDB, vendored OpenSSL). The first build takes ~30 min on
# two cores and ~3 GB of disk.
set -euo pipefail
shopt -s inherit_errexit

COMMIT=2981b2bd389d42cf668519f9aa981a53541c4278
CACHE=${LIMITADOR_CACHE:-$HOME/.cache/freqcap-peers/limitador}
SRC=$CACHE/src
TARGET=$CACHE/target
BIN=$TARGET/release/limitador-server
STAMP=$CACHE/built-commit

# shellcheck source=benches/peers/checkout.sh
source "$(dirname "$0")/checkout.sh"
die() { echo "limitador.sh: $*" >&2; exit 1; }
log() { echo "limitador.sh: $*" >&2; }

if [[ -x $BIN && -f $STAMP && $(cat "$STAMP") == "$COMMIT" ]]; then
    echo "$BIN"
    exit 0
fi

command -v git >/dev/null || die "git not found"
command -v cargo >/dev/null || die "cargo not found"
command -v protoc >/dev/null || die "protoc not found (apt-get install -y protobuf-compiler)"

if [[ -n ${LIMITADOR_SRC:-} ]]; then
    ORIGIN=$LIMITADOR_SRC
elif [[ -d /work/.mirror/Kuadrant+limitador/repo ]]; then
    ORIGIN=/work/.mirror/Kuadrant+limitador/repo
else
    ORIGIN=https://github.com/Kuadrant/limitador
fi

mkdir -p "$CACHE"
# default.profraw (a stray coverage file, ~1 GB) is not needed and is absent
# from partial mirrors: left out of the checkout.
peer_checkout "$ORIGIN" "$SRC" "$COMMIT" '/*' '!/default.profraw'

log "building limitador-server $COMMIT (CARGO_TARGET_DIR=$TARGET)"
rm -f "$STAMP"
(cd "$SRC" && CARGO_TARGET_DIR=$TARGET cargo build --release --locked -p limitador-server >&2)
[[ -x $BIN ]] || die "cargo build finished but $BIN is missing"
echo "$COMMIT" >"$STAMP"
echo "$BIN"
