#!/usr/bin/env bash
# Miri over the pure parts (interval index, coverage, event coalescing, segmented storage, and
# the fuzz harness with a few random sequences). Needs a nightly toolchain with the `miri`
# component; where it is missing, says so and exits 0 (or 1 with UMN_REQUIRE_ALL=1).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! cargo +nightly miri --version >/dev/null 2>&1; then
    msg="cargo miri unavailable (rustup +nightly component add miri rust-src)"
    if [ "${UMN_REQUIRE_ALL:-}" = 1 ]; then echo "FAIL: $msg" >&2; exit 1; fi
    echo "**************** SKIP miri: $msg"
    exit 0
fi
export UMN_FUZZ_CASES=${UMN_FUZZ_CASES:-20}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target/miri}
cargo +nightly miri test -p ummunotify --lib -- index:: coverage:: event:: segvec:: __fuzz::
