#!/usr/bin/env bash
# Builds the guest kernel from Debian's linux-source-6.1: `make tinyconfig` plus kernel.config.
# The build lives outside the repository, in $UMN_KERNEL_CACHE (default
# /var/cache/ummunotify-kernel), keyed by the source package version, kernel.config and the recipe version below,
# so a later run on the same machine reuses it (a build that did not finish has no .done and is
# redone). Prints the build directory on its last line.
#
# With UMN_KERNEL_PATCH=file (a -p1 patch against the source), or =directory (a series: its
# *.patch files applied in name order, e.g. kernel/patches/uffd-remove-done/), or several of
# either separated by ':' (applied in that order), the patches are
# applied after extraction and their contents are part of the key: a patched kernel is a build of
# its own, next to the stock one. When the stock build is cached, the patched one starts from a
# copy of it (timestamps kept), so make recompiles only what the patches touch.
#
# With UMN_KERNEL_CONFIG_EXTRA=file (a fragment merged after kernel.config, e.g.
# kernel/debug.config) the fragment is part of the key too; such a build never starts from the
# stock one (a new config recompiles nearly everything anyway).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${UMN_KERNEL_CACHE:-/var/cache/ummunotify-kernel}
tarball=/usr/src/linux-source-6.1.tar.xz
[ -f "$tarball" ] || { echo "build-kernel: $tarball missing (apt-get install linux-source-6.1)" >&2; exit 1; }
version=$(dpkg-query -W -f='${Version}' linux-source-6.1)
# Bump recipe when a change to the steps below must invalidate cached builds.
recipe=2
patches=()
# UMN_KERNEL_PATCH may name several files or series, separated by ':', applied in that order
# (ci.sh: uffd-remove-done, then mmu-notifier-trace, in one patched kernel).
IFS=: read -r -a patch_srcs <<<"${UMN_KERNEL_PATCH:-}"
for patch_src in "${patch_srcs[@]}"; do
    if [ -d "$patch_src" ]; then
        mapfile -t series < <(find "$patch_src" -maxdepth 1 -name '*.patch' | LC_ALL=C sort)
        [ ${#series[@]} -gt 0 ] || { echo "build-kernel: no *.patch in $patch_src" >&2; exit 1; }
        patches+=("${series[@]}")
    elif [ -n "$patch_src" ]; then
        [ -f "$patch_src" ] || { echo "build-kernel: $patch_src missing" >&2; exit 1; }
        patches+=("$patch_src")
    fi
done
extra=${UMN_KERNEL_CONFIG_EXTRA:-}
[ -z "$extra" ] || [ -f "$extra" ] || { echo "build-kernel: $extra missing" >&2; exit 1; }
# The stock key is kernel.config and the recipe; patches and an extra fragment append their text
# (a series hashes as the concatenation of its files, in the order they are applied).
key=$( (cat "$here/kernel.config"; echo "recipe=$recipe"
    [ ${#patches[@]} = 0 ] || cat "${patches[@]}"
    [ -z "$extra" ] || { echo "extra-config"; cat "$extra"; }) | sha256sum | cut -c1-16)
apply_patches() {
    local p
    for p in "${patches[@]}"; do
        echo "build-kernel: applying $p" >&2
        patch -p1 --no-backup-if-mismatch <"$p" >&2
    done
}
stock_dir="$cache/linux-$version-$( (cat "$here/kernel.config"; echo "recipe=$recipe") |
    sha256sum | cut -c1-16)"
dir="$cache/linux-$version-$key"
mkdir -p "$cache"
# One build of a key at a time: a second caller waits, then finds it cached.
exec 9>"$cache/.lock-$key"
flock 9
if [ -f "$dir/.done" ] && [ -f "$dir/arch/x86/boot/bzImage" ]; then
    echo "build-kernel: cached $dir" >&2
    echo "$dir"
    exit 0
fi
mkdir -p "$cache"
rm -rf "$dir"
if [ ${#patches[@]} -gt 0 ] && [ -z "$extra" ] && [ -f "$stock_dir/.done" ]; then
    echo "build-kernel: starting from the stock build $stock_dir" >&2
    cp -a "$stock_dir" "$dir"
    rm -f "$dir/.done"
    # objtool is built with absolute paths: its recorded commands name the stock directory, a
    # changed command rebuilds it, and a new objtool rebuilds every object (a patched build was
    # a full one: 714 CPU-s). Point the commands at the copy.
    grep -rlIZ --fixed-strings "$stock_dir" "$dir/tools" | xargs -0 -r sed -i "s|$stock_dir|$dir|g"
    cd "$dir"
    apply_patches
    echo "build-kernel: make -j$(nproc) bzImage modules_prepare" >&2
    make -s -j"$(nproc)" bzImage >&2
    make -s -j"$(nproc)" modules_prepare >&2
    cp vmlinux.symvers Module.symvers
    touch "$dir/.done"
    echo "$dir"
    exit 0
fi
mkdir -p "$dir"
echo "build-kernel: extracting $tarball ($version)" >&2
tar -xJf "$tarball" -C "$dir" --strip-components=1
cd "$dir"
apply_patches
make -s tinyconfig >&2
# Merge the fragments: kconfig's own merge script, then resolve dependencies.
fragments=("$here/kernel.config")
[ -z "$extra" ] || fragments+=("$extra")
scripts/kconfig/merge_config.sh -m .config "${fragments[@]}" >&2
make -s olddefconfig >&2
missing=0
while IFS= read -r line; do
    case "$line" in CONFIG_*=y) grep -qx "$line" .config || { echo "build-kernel: $line did not stick" >&2; missing=1; } ;; esac
done < <(cat "${fragments[@]}")
for want in CONFIG_MMU_NOTIFIER=y CONFIG_INTERVAL_TREE=y; do
    grep -qx "$want" .config || { echo "build-kernel: $want not selected" >&2; missing=1; }
done
[ "$missing" = 0 ] || exit 1
echo "build-kernel: make -j$(nproc) bzImage modules_prepare" >&2
make -s -j"$(nproc)" bzImage >&2
make -s -j"$(nproc)" modules_prepare >&2
# External modules link against Module.symvers; with every option built in it is vmlinux's.
cp vmlinux.symvers Module.symvers
touch "$dir/.done"
echo "$dir"
