#!/usr/bin/env bash
# ThreadSanitizer over the notifier's multi-threaded tests. TSan needs nightly (-Zsanitizer is
# rejected by stable) and, properly, a std rebuilt with it (-Zbuild-std, needs rust-src). Without
# rust-src this runs with -Cunsafe-allow-abi-mismatch=sanitizer: std is uninstrumented, so races
# inside std go unseen and reports involving std internals may be false. Not part of CI.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! rustc +nightly --version >/dev/null 2>&1; then
    echo "**************** SKIP tsan: no nightly toolchain"; exit 0
fi
flags="-Zsanitizer=thread"
if rustup +nightly component list --installed 2>/dev/null | grep -q rust-src; then
    build_std=(-Zbuild-std --target x86_64-unknown-linux-gnu)
else
    build_std=()
    flags="$flags -Cunsafe-allow-abi-mismatch=sanitizer"
fi
RUSTFLAGS="$flags" RUSTDOCFLAGS="$flags" CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target/tsan} \
TSAN_OPTIONS="halt_on_error=1 ${TSAN_OPTIONS:-}" \
    cargo +nightly test "${build_std[@]}" -p ummunotify --test notifier --test cache_basic "$@"
