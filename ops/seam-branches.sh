#!/bin/sh
# The lines of the engine's operation files (src/engine/*.rs; the seam's folders
# src/engine/placement/ and src/engine/leases/ are not matched) that test the
# store's kind or the fleet mode (issue 46): `self.shared()` or `store.shared()`
# in an if/match/let-else, a local `shared` or `again` flag in a condition,
# `in_owner_mode()`, `owners()`, `shared_record_of`, or a question to
# `self.placement`. Prints them and their count.
#   sh ops/seam-branches.sh [REPO]
cd "${1:-.}" || exit 1
grep -nE '((if|match) (let Some\([^)]*\) = )?(self|store)\.shared\(\)|let Some\([^)]*\) = (self|store)\.shared\(\)|(self|store)\.shared\(\)\.is_(some|none)\(\)|(if|&&|\|\|) !?shared\b|\bshared (&&|\|\|)|filter\(\|_\| !?shared\)|\bshared\.then|in_owner_mode\(\)|self\.owners\(\)|shared_record_of\(|self\.placement\.|may_decide_again|\bagain\b &&|if again)' src/engine/*.rs \
  | grep -vE '^[^:]+:[0-9]+:\s*(//|///|//!)' > /tmp/seam-branches.$$
cat /tmp/seam-branches.$$
echo "$(wc -l < /tmp/seam-branches.$$) lines in $(cut -d: -f1 /tmp/seam-branches.$$ | sort -u | wc -l) files"
rm -f /tmp/seam-branches.$$
