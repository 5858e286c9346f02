#!/usr/bin/env bash
# Validates the Spack recipe (packaging/spack/packages/ummunotify/package.py) offline with a
# Spack checkout: `spack info` loads it with Spack's own Python, `spack audit packages` runs
# Spack's directive, attribute and property audits on it. The scope holds only this repository
# and Spack's own recipes of the dependencies (rust, libfabric, pkgconf, pkg-config, copied from
# the checkout's builtin repository into a temporary one): auditing against all 8,000 builtin
# recipes takes 5 minutes here, this 10 s. With UMN_SPACK_DEV_BUILD=1, also `spack dev-build`
# of this tree (below).
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
[ -n "${UMN_SPACK_DEV_BUILD:-}" ] || exit 0

# 2. UMN_SPACK_DEV_BUILD=1: `spack dev-build` of this tree, offline: the concretizer is clingo
# from PyPI in a venv (no bootstrap download), rust (the toolchain cargo
# runs from), pkgconf and libfabric are the machine's, registered as externals; the whole
# builtin repository (the concretizer needs the recipes behind them). Cargo reuses target/.
# Installs into a temporary tree and runs the recipe's install test (umn --help), then checks
# the installed files.
# The venv and Spack's index of its builtin recipes (a cold one takes 2 minutes) are kept
# between runs outside the tree, as kernel/build-kernel.sh keeps its kernels.
cache=${UMN_SPACK_CACHE:-/var/cache/ummunotify-spack}
mkdir -p "$cache"
venv=$cache/venv
[ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import clingo' 2>/dev/null ||
    { python3 -m venv "$venv" && "$venv/bin/pip" install -q clingo; } || fail "clingo venv"
cargo=$(command -v cargo) || fail "no cargo"
toolchain=$(cd "$repo" && rustc --print sysroot)
rustv=$(rustc --version | cut -d' ' -f2)
pcv=$(pkg-config --version)
fabv=$(pkg-config --modversion libfabric 2>/dev/null || echo 1.17.0)
printf 'repos::\n- %s\n- %s\n' "$repo/packaging/spack" "$SPACK_ROOT/var/spack/repos/builtin" \
    >"$scope/repos.yaml"
cat >"$scope/packages.yaml" <<YAML
packages:
  all:
    providers:
      pkgconfig: [pkgconf]
  rust:
    buildable: false
    externals: [{spec: rust@$rustv, prefix: $toolchain}]
  pkgconf:
    buildable: false
    externals: [{spec: pkgconf@$pcv, prefix: /usr}]
  libfabric:
    buildable: false
    externals: [{spec: libfabric@$fabv, prefix: /usr}]
YAML
printf 'config:\n  install_tree:\n    root: %s\n  build_stage: [%s]\n' "$scope/opt" "$scope/stage" \
    >"$scope/config.yaml"
printf 'bootstrap:\n  enable: false\n' >"$scope/bootstrap.yaml"
export SPACK_USER_CACHE_PATH=$cache/user-cache
(cd "$repo" && "$venv/bin/python" "$spack" -C "$scope" dev-build --test=root -d "$repo" \
    ummunotify@main) >&2 || fail "spack dev-build"
rm -rf "$repo"/build-linux-*   # spack's build log directory in the source tree
prefix=$(find "$scope/opt" -maxdepth 3 -type d -name 'ummunotify-main-*' | head -n 1)
for f in lib/libummunotify.so.0 lib/libummunotify.a lib/pkgconfig/ummunotify.pc \
    lib/libummunotify-fabric.so lib/libummunotify-compat.so include/ummunotify.h bin/umn; do
    [ -e "$prefix/$f" ] || fail "spack dev-build installed no $f"
done
say "ok: spack dev-build installed ummunotify@main into $prefix (cargo ${cargo%/*})"
