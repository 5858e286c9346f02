#!/bin/bash
# Builds bench/call_floor.c against the release libummunotify.so (cargo build --release -p
# ummunotify-capi first) and the shipped header, then runs it: the C library's hit from C,
# batch by batch against two empty calls with its signatures (see call_floor.c).
#
# usage: bench/call_floor.sh [batches]         (builds, then runs; default 100 batches)
#        bench/call_floor.sh --build-only      (builds; prints the program's path)
# The program, its floor library and the staged libummunotify.so.0 (with the SONAME the
# program links against) go to $TARGET/call-floor, TARGET=${CARGO_TARGET_DIR:-<repo>/target}.
set -eu
REPO=$(cd "$(dirname "$0")/.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$REPO/target}
DIR=$TARGET/call-floor
lib=$TARGET/release/libummunotify.so
[ -f "$lib" ] || { echo "call_floor: $lib not found (cargo build --release -p ummunotify-capi)" >&2; exit 1; }
mkdir -p "$DIR"
cp "$lib" "$DIR/libummunotify.so.0"
ln -sf libummunotify.so.0 "$DIR/libummunotify.so"
gcc -O2 -Wall -Werror -shared -fPIC -DUMN_FLOOR_LIB -o "$DIR/libumnfloor.so" "$REPO/bench/call_floor.c"
gcc -O2 -Wall -Werror -I"$REPO/include" -o "$DIR/call_floor" "$REPO/bench/call_floor.c" \
    -L"$DIR" -lumnfloor -lummunotify -Wl,-rpath,"$DIR"
if [ "${1:-}" = "--build-only" ]; then echo "$DIR/call_floor"; exit 0; fi
exec "$DIR/call_floor" "$@"
