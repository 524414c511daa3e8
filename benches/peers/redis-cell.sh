#!/usr/bin/env bash
# Builds the redis-cell module (github.com/brandur/redis-cell) at a pinned
# commit and prints the path of its .so on stdout (build output goes to
# stderr), for `redis-server --loadmodule` and ops/redis-cell-table.py:
#
#   benches/peers/redis-cell.sh
#   REDIS_CELL_SO=$(benches/peers/redis-cell.sh) ops/redis-cell-table.py
#
# Pinned to 4d42338 ("chore: bump deps, normalise version specs", #90):
# v0.5.0 plus a dependency bump; the commit tests/data/redis_cell_table.json
# was recorded with.
#
#   REDIS_CELL_CACHE  cache folder (default ~/.cache/freqcap-peers/redis-cell):
#                     src/ (a clone), target/ (its own CARGO_TARGET_DIR), and a
#                     stamp naming the commit built
#   REDIS_CELL_SRC    git repository to clone from (path or URL); default: the
#                     local mirror /work/.mirror/brandur+redis-cell/repo when it
#                     exists, else https://github.com/brandur/redis-cell
#
# Idempotent: when the .so for the pinned commit is already built it only
# prints the path. Needs git, cargo with Rust >= 1.85 (the crate is edition
# 2024), and a C compiler (its build.rs compiles a stub with the cc crate);
# the first build downloads the crate's dependencies (Cargo.lock, --locked).
# Linux: the module is target/release/libredis_cell.so.
set -euo pipefail
shopt -s inherit_errexit

COMMIT=4d4233870d3caa7cf51ee90b0ee778d12969e99a
CACHE=${REDIS_CELL_CACHE:-$HOME/.cache/freqcap-peers/redis-cell}
SRC=$CACHE/src
TARGET=$CACHE/target
SO=$TARGET/release/libredis_cell.so
STAMP=$CACHE/built-commit

# shellcheck source=benches/peers/checkout.sh
source "$(dirname "$0")/checkout.sh"
die() { echo "redis-cell.sh: $*" >&2; exit 1; }
log() { echo "redis-cell.sh: $*" >&2; }

if [[ -f $SO && -f $STAMP && $(cat "$STAMP") == "$COMMIT" ]]; then
    echo "$SO"
    exit 0
fi

command -v git >/dev/null || die "git not found"
command -v cargo >/dev/null || die "cargo not found (Rust >= 1.85)"

if [[ -n ${REDIS_CELL_SRC:-} ]]; then
    ORIGIN=$REDIS_CELL_SRC
elif [[ -d /work/.mirror/brandur+redis-cell/repo ]]; then
    ORIGIN=/work/.mirror/brandur+redis-cell/repo
else
    ORIGIN=https://github.com/brandur/redis-cell
fi

mkdir -p "$CACHE"
peer_checkout "$ORIGIN" "$SRC" "$COMMIT"

log "building redis-cell $COMMIT (CARGO_TARGET_DIR=$TARGET)"
rm -f "$STAMP"
(cd "$SRC" && CARGO_TARGET_DIR=$TARGET cargo build --release --locked >&2)
[[ -f $SO ]] || die "cargo build finished but $SO is missing"
echo "$COMMIT" >"$STAMP"
echo "$SO"
