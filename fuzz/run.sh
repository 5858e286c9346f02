#!/usr/bin/env bash
# A bounded cargo-fuzz run of the region-index target (default 60 s), starting from the committed
# corpus; new inputs go to a scratch copy so the tree stays clean. Needs nightly and cargo-fuzz
# (`cargo install cargo-fuzz --locked`). Usage: fuzz/run.sh [seconds]
set -euo pipefail
cd "$(dirname "$0")"
secs=${1:-60}
if ! cargo fuzz --version >/dev/null 2>&1 || ! rustc +nightly --version >/dev/null 2>&1; then
    msg="cargo-fuzz or a nightly toolchain is missing"
    if [ "${UMN_REQUIRE_ALL:-}" = 1 ]; then echo "FAIL: $msg" >&2; exit 1; fi
    echo "**************** SKIP fuzz: $msg"
    exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp corpus/region_index/* "$work/"
cargo +nightly fuzz run region_index "$work" corpus/region_index -- \
    -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048
