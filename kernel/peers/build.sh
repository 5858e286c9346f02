#!/usr/bin/env bash
# The peers of issue 42, built from their own sources once per machine: libfabric 2.6.0 (verbs,
# rxm, tcp; with its kdreg2 monitor), fabtests v2.6.0 against it and fabtests v1.17.0 against
# Debian 12's libfabric 1.17, and HPE's kdreg2 module (with its tests/) against the stock guest
# kernel (kernel/build-kernel.sh). Nothing of theirs is copied into this repository: the trees
# come from the git mirrors with `git archive`.
#
#   bash kernel/peers/build.sh      # prints the cache directory on its last line
#
# The cache: /var/cache/ummunotify-peers/<key> (UMN_PEERS_CACHE overrides the parent), the key a
# hash of this script, the commits of the tags, the stock kernel's directory (its own key) and
# Debian's libfabric version. A directory with a `done` file is complete; a second caller waits
# on the lock and then finds it. Build times are in <dir>/build-times.txt.
# Sources: UMN_LIBFABRIC_GIT (default /work/.mirror/ofiwg+libfabric/repo), UMN_KDREG2_GIT
# (default /work/.mirror/HewlettPackard+shs-kdreg2/repo, its HEAD or UMN_KDREG2_REV).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
say() { printf 'kernel/peers/build.sh: %s\n' "$*" >&2; }
trap 'say "FAIL at line $LINENO: $BASH_COMMAND (exit $?)"' ERR
. "$repo/kernel/lib.sh"
apt_need "${GUEST_PACKAGES[@]}" autoconf automake libtool pkg-config libibverbs-dev \
    librdmacm-dev libfabric-dev ibverbs-providers git

lf_git=${UMN_LIBFABRIC_GIT:-/work/.mirror/ofiwg+libfabric/repo}
kd_git=${UMN_KDREG2_GIT:-/work/.mirror/HewlettPackard+shs-kdreg2/repo}
lf_new=v2.6.0
lf_old=v1.17.0
kd_rev=${UMN_KDREG2_REV:-HEAD}
for g in "$lf_git" "$kd_git"; do
    git --git-dir="$g" rev-parse -q --verify HEAD >/dev/null ||
        { say "no git repository at $g"; exit 1; }
done
lf_new_c=$(git --git-dir="$lf_git" rev-parse "$lf_new^{commit}")
lf_old_c=$(git --git-dir="$lf_git" rev-parse "$lf_old^{commit}")
kd_c=$(git --git-dir="$kd_git" rev-parse "$kd_rev^{commit}")
deb_lf=$(dpkg-query -W -f='${Version}' libfabric-dev)
case "$deb_lf" in 1.17.*) ;; *) say "Debian's libfabric-dev is $deb_lf, not 1.17"; exit 1 ;; esac
kdir=$(bash "$repo/kernel/build-kernel.sh" | tail -n 1)
# What kdreg2 needs of the kernel (its Kbuild and sources: MMU notifiers, modules).
for opt in CONFIG_MODULES CONFIG_MMU_NOTIFIER; do
    grep -qx "$opt=y" "$kdir/.config" || { say "$kdir lacks $opt=y (kdreg2 needs it)"; exit 1; }
done

cache=${UMN_PEERS_CACHE:-/var/cache/ummunotify-peers}
mkdir -p "$cache"
key=$( (cat "$0"; echo "$lf_new_c $lf_old_c $kd_c $deb_lf $(basename "$kdir")") |
    sha256sum | cut -c1-16)
dir="$cache/peers-$key"
exec 9>"$cache/.lock-$key"
flock 9
if [ -f "$dir/done" ]; then
    say "cached $dir"
    echo "$dir"
    exit 0
fi
rm -rf "$dir"
mkdir -p "$dir/src"
times="$dir/build-times.txt"
: >"$times"
# step NAME CMD...: runs CMD, logging to $dir/NAME.log, and records its wall and CPU time.
step() {
    local name=$1 t0 c0 c1
    shift
    say "$name (log $dir/$name.log)"
    t0=$(date +%s.%N)
    c0=$(awk '{print $14 + $15 + $16 + $17}' /proc/$$/stat)
    if ! ( "$@" ) >"$dir/$name.log" 2>&1; then
        tail -n 40 "$dir/$name.log" >&2
        say "FAIL: $name"
        exit 1
    fi
    c1=$(awk '{print $14 + $15 + $16 + $17}' /proc/$$/stat)
    printf '%s wall=%.0fs cpu=%.0fs\n' "$name" "$(echo "$(date +%s.%N) - $t0" | bc)" \
        "$(echo "($c1 - $c0) / $(getconf CLK_TCK)" | bc -l)" | tee -a "$times" >&2
}
jobs=-j$(nproc)
mk() { nice -n 5 make "$jobs" "$@"; }

# kdreg2: the module against the stock guest kernel, and its tests/ (user programs).
kdreg2_build() {
    mkdir -p "$dir/src/kdreg2"
    git --git-dir="$kd_git" archive "$kd_c" | tar -x -C "$dir/src/kdreg2"
    cd "$dir/src/kdreg2"
    # Its Makefile stamps `git rev-parse` into kdreg2_build.h; the archive has no .git.
    sed -i "s/\`git rev-parse --short HEAD\`/${kd_c:0:7}/" Makefile
    make KDIR="$kdir" modules
    make -C tests tests
    mkdir -p "$dir/kdreg2/tests"
    cp kdreg2.ko "$dir/kdreg2/"
    cp -r include "$dir/kdreg2/"
    (cd tests && cp test_basic test_open_close test_multi_open test_fork test_fork2 test_fork3 \
        test_threads test_resize test_ranks.sh test_fork3_reversed.sh run_tests.sh \
        "$dir/kdreg2/tests/")
}
step kdreg2 kdreg2_build

# libfabric 2.6.0: the providers the rxe guest can use, and the kdreg2 monitor (its configure
# finds kdreg2.h through --with-kdreg2).
libfabric_build() {
    mkdir -p "$dir/src/libfabric-2"
    git --git-dir="$lf_git" archive "$lf_new_c" | tar -x -C "$dir/src/libfabric-2"
    cd "$dir/src/libfabric-2"
    ./autogen.sh
    ./configure --prefix="$dir/libfabric-2" --enable-only --enable-verbs=yes --enable-rxm=yes \
        --enable-tcp=yes --enable-udp=yes --enable-rxd=yes --enable-shm=yes \
        --with-kdreg2="$dir/kdreg2/include" --disable-static CFLAGS="-O2 -g"
    grep -q '#define HAVE_KDREG2 1' config.h
    mk
    make install
}
step libfabric-2.6.0 libfabric_build

# fabtests_build TAG PREFIX LIBFABRIC: fabtests of TAG against the libfabric at LIBFABRIC.
fabtests_build() {
    local tag=$1 prefix=$2 lf=$3 src="$dir/src/fabtests-$1"
    mkdir -p "$src"
    git --git-dir="$lf_git" archive "$tag" fabtests | tar -x -C "$src" --strip-components=1
    cd "$src"
    ./autogen.sh
    # --enable-debug: FT_DEBUG prints the registration times fi_mr_cache_evict judges (its
    # -O0 comes before our CFLAGS, so the tests stay -O2).
    ./configure --prefix="$prefix" --with-libfabric="$lf" --enable-debug CFLAGS="-O2 -g" \
        LDFLAGS="-Wl,-rpath,$lf/lib"
    mk
    make install
}
step fabtests-2.6.0 fabtests_build "$lf_new_c" "$dir/fabtests-2" "$dir/libfabric-2"
step fabtests-1.17.0 fabtests_build "$lf_old_c" "$dir/fabtests-1" /usr

rm -rf "$dir/src"
touch "$dir/done"
say "built $dir"
echo "$dir"
