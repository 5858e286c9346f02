#!/usr/bin/env bash
# Validates the Spack recipe (packaging/spack/packages/ummunotify/package.py) offline with a
# Spack checkout: `spack info` loads it with Spack's own Python, `spack audit packages` runs
# Spack's directive, attribute and property audits on it. The scope holds only this repository
# and Spack's own recipes of the dependencies (rust, libfabric, pkgconf, pkg-config, copied from
# the checkout's builtin repository into a temporary one): auditing against all 8,000 builtin
# recipes takes 5 minutes here, this 10 s. No `spack install`: Spack would build rust from
# source or need it registered as an external, and clingo from the network.
#
#   SPACK_ROOT=/path/to/spack bash packaging/spack/check.sh
#   UMN_SPACK_GIT=/path/to/spack.git bash packaging/spack/check.sh   # a bare clone: its HEAD
#                                                                     # is unpacked in target/
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
say() { echo "packaging/spack/check.sh: $*" >&2; }
fail() { say "FAIL: $*"; exit 1; }
if [ -z "${SPACK_ROOT:-}" ]; then
    [ -n "${UMN_SPACK_GIT:-}" ] || fail "set SPACK_ROOT (a Spack checkout) or UMN_SPACK_GIT"
    SPACK_ROOT=$repo/target/spack
    head=$(git --git-dir="$UMN_SPACK_GIT" rev-parse HEAD)
    if [ "$(cat "$SPACK_ROOT/.umn-head" 2>/dev/null)" != "$head" ]; then
        rm -rf "$SPACK_ROOT"
        mkdir -p "$SPACK_ROOT"
        git --git-dir="$UMN_SPACK_GIT" archive HEAD | tar -x -C "$SPACK_ROOT"
        echo "$head" >"$SPACK_ROOT/.umn-head"
    fi
fi
spack=$SPACK_ROOT/bin/spack
builtin=$SPACK_ROOT/var/spack/repos/builtin/packages
[ -x "$spack" ] || fail "no $spack"
scope=$(mktemp -d)
trap 'rm -rf "$scope"' EXIT
mkdir -p "$scope/deps/packages"
printf 'repo:\n  namespace: builtin\n' >"$scope/deps/repo.yaml"
for p in rust libfabric pkgconf pkg-config; do
    [ -d "$builtin/$p" ] || fail "no recipe $p in $builtin"
    cp -r "$builtin/$p" "$scope/deps/packages/"
done
printf 'repos::\n- %s\n- %s\n' "$repo/packaging/spack" "$scope/deps" >"$scope/repos.yaml"
# Nothing of the user's or the site's Spack configuration, nothing written to ~/.spack.
export SPACK_USER_CONFIG_PATH=$scope/user SPACK_USER_CACHE_PATH=$scope/cache
export SPACK_DISABLE_LOCAL_CONFIG=1
say "Spack $("$spack" --version) at $SPACK_ROOT"
info=$("$spack" -C "$scope" info ummunotify) || fail "spack info ummunotify"
grep -q "^Package: *ummunotify" <<<"$info" || { echo "$info" >&2; fail "spack info"; }
grep -q "rust" <<<"$info" || { echo "$info" >&2; fail "spack info shows no rust dependency"; }
audit=$("$spack" -C "$scope" audit packages ummunotify 2>&1) || { echo "$audit" >&2; fail "audit"; }
echo "$audit" >&2
! grep -q "issues found$" <<<"$audit" || fail "spack audit packages ummunotify found issues"
say "ok: spack info loads the recipe, spack audit packages: 0 issues"
