# Sourced by the peer build scripts (redis-cell.sh, limitador.sh): a clean
# checkout of one pinned commit of a peer's repository. Uses the caller's
# die and log.
#
#   peer_checkout ORIGIN SRC COMMIT [SPARSE_PATTERN...]
#
# ORIGIN: a repository path or URL; SRC: the clone (made once, fetched into
# when the commit is missing); COMMIT: the full hash, checked out detached,
# untracked files removed. SPARSE_PATTERNs (git's non-cone patterns) leave
# paths out of the checkout, e.g. a large file a partial mirror lacks.
peer_checkout() {
    local origin=$1 src=$2 commit=$3 head
    shift 3
    if [[ ! -d $src/.git ]]; then
        rm -rf "$src"
        log "cloning $origin into $src"
        git clone --quiet --no-checkout "$origin" "$src" >&2 || die "cannot clone $origin"
    fi
    if ! git -C "$src" cat-file -e "$commit^{commit}" 2>/dev/null; then
        log "fetching $commit from $origin"
        git -C "$src" fetch --quiet "$origin" >&2 || true
        git -C "$src" cat-file -e "$commit^{commit}" 2>/dev/null \
            || die "commit $commit not found in $origin"
    fi
    if (($# > 0)); then
        git -C "$src" sparse-checkout set --no-cone "$@" >&2
    fi
    git -C "$src" -c advice.detachedHead=false checkout --quiet --force --detach "$commit" >&2
    git -C "$src" clean -fdxq >&2
    head=$(git -C "$src" rev-parse HEAD)
    [[ $head == "$commit" ]] || die "checked out $head, wanted $commit"
}
