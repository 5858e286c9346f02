#!/usr/bin/env bash
# Checks the daemon's unit (packaging/systemd/umn-daemon.service):
#  1. `systemd-analyze security --offline=yes` rates it at most UMN_UNIT_MAX_EXPOSURE (3.0);
#  2. `umn daemon` runs the way the unit runs it and serves a client. systemd is not PID 1 where
#     CI runs, so the unit is emulated from its own lines: its User= (created from
#     sysusers.d/ummunotify.conf by systemd-sysusers, as the packages do), exactly its
#     AmbientCapabilities= as ambient, inheritable and bounding set (setpriv), NoNewPrivileges,
#     LimitNOFILE (prlimit), a mount namespace with every mount read-only but the runtime
#     directory, empty /tmp, /home, /root and a minimal /dev (ProtectSystem=strict, ProtectHome,
#     PrivateTmp, PrivateDevices), its own network namespace (PrivateNetwork), and the seccomp
#     parts (SystemCallFilter, SystemCallArchitectures, RestrictAddressFamilies,
#     MemoryDenyWriteExecute: sandbox.py). The daemon's /proc status must show that uid and
#     exactly those capabilities; `umn doctor` and `umn coverage --backend ebpf` as nobody must
#     be served by it (every kind the eBPF backend claims detected through its programs).
#
#   bash packaging/systemd/check.sh [UMN]      # as root; UMN defaults to target/release/umn
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
unit=$here/umn-daemon.service
umn=$(realpath "${1:-$here/../../target/release/umn}")
max=${UMN_UNIT_MAX_EXPOSURE:-3.0}
say() { echo "packaging/systemd/check.sh: $*" >&2; }
fail() { say "FAIL: $*"; exit 1; }
get() { sed -n "s/^$1=//p" "$unit" | tail -n 1; }

# 1. The exposure score.
score=$(systemd-analyze security --offline=yes "$unit" 2>&1 |
    sed -n 's/.*Overall exposure level for .*: \([0-9.]*\) .*/\1/p')
[ -n "$score" ] || fail "systemd-analyze security gave no score"
awk -v s="$score" -v m="$max" 'BEGIN { exit !(s <= m) }' || fail "exposure $score > $max"
say "systemd-analyze security --offline=yes: exposure $score (at most $max)"

# 2. The user, the capabilities, the sandbox; a client served.
[ "$(id -u)" = 0 ] || fail "needs root (setpriv, unshare)"
user=$(get User)
[ "$user" = ummunotify ] || fail "User=$user: clients trust only uid 0 and user ummunotify"
systemd-sysusers "$here/ummunotify.conf"
uid=$(id -u "$user")
caps=$(get AmbientCapabilities)
[ "$caps" = "$(get CapabilityBoundingSet)" ] || fail "ambient and bounding sets differ"
[ "$(get NoNewPrivileges)" = yes ] || fail "NoNewPrivileges is not yes"
set_=-all
for c in $caps; do c=${c#CAP_}; set_="$set_,+${c,,}"; done
nofile=$(get LimitNOFILE)
# Where the check runs without CAP_SYS_RESOURCE, the hard limit may be below the unit's.
if [ "$(ulimit -Hn)" != unlimited ] && [ "$(ulimit -Hn)" -lt "$nofile" ]; then
    say "LimitNOFILE=$nofile above this shell's hard limit: emulated as $(ulimit -Hn)"
    nofile=$(ulimit -Hn)
fi
tmp=$(mktemp -d /run/umn-unit-check.XXXXXX) # not under /tmp: the sandbox hides /tmp
chmod 755 "$tmp"
rt=$tmp/ummunotify # RuntimeDirectory=ummunotify, owned by the user, RuntimeDirectoryMode
mkdir -p "$tmp/bin" "$rt"
chown "$user:$user" "$rt"
chmod "$(get RuntimeDirectoryMode)" "$rt"
install -m 755 "$umn" "$tmp/bin/umn"
install -m 755 "$here/sandbox.py" "$tmp/bin/sandbox.py"
cp "$unit" "$tmp/bin/unit"
dpid=
cleanup() { [ -z "$dpid" ] || kill "$dpid" 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
# ExecStart's arguments with the socket in the emulated runtime directory.
read -r -a args <<<"$(get ExecStart | sed "s|^/usr/bin/umn ||; s|/run/ummunotify/|$rt/|")"
unshare --mount --net --propagation private -- sh -ec '
    rt=$1 tmp=$2; shift 2
    mount --bind "$rt" "$rt"
    findmnt -rn -o TARGET | sort -u | while read -r m; do
        case $m in "$rt" | /proc | /proc/* | /dev | /dev/*) continue ;; esac
        mount -o remount,bind,ro "$m" 2>/dev/null || true
    done
    mount -o remount,bind,rw "$rt"
    for d in /tmp /var/tmp /home /root; do [ -d "$d" ] && mount -t tmpfs -o mode=1777 tmp "$d"; done
    mount -t tmpfs -o mode=755 dev /dev
    for n in null zero urandom random; do touch "/dev/$n"; mount --bind "/proc/1/root/dev/$n" "/dev/$n" 2>/dev/null || true; done
    exec "$@"' sh "$rt" "$tmp" \
    prlimit --nofile="$nofile" -- \
    setpriv --reuid="$uid" --regid="$(id -g "$user")" --clear-groups --no-new-privs \
    --inh-caps="$set_" --ambient-caps="$set_" --bounding-set="$set_" \
    python3 "$tmp/bin/sandbox.py" "$tmp/bin/unit" -- "$tmp/bin/umn" "${args[@]}" &
dpid=$!
sock=$rt/ebpf.sock
for _ in $(seq 1 150); do [ -S "$sock" ] && break; kill -0 "$dpid" 2>/dev/null || break; sleep 0.2; done
[ -S "$sock" ] || fail "umn daemon did not create $sock"
st=/proc/$dpid/status
grep -q "^Name:.*umn" "$st" || fail "pid $dpid is $(sed -n 's/^Name:\t//p' "$st"), not umn"
read -r _ ruid euid _ <<<"$(grep '^Uid:' "$st")"
[ "$ruid $euid" = "$uid $uid" ] || fail "daemon uid $ruid/$euid, want $uid"
want=$(setpriv --reuid=0 --inh-caps="$set_" --ambient-caps="$set_" --bounding-set="$set_" \
    sh -c 'grep ^CapAmb: /proc/self/status' | awk '{print $2}')
for f in CapEff CapPrm CapAmb CapBnd; do
    got=$(awk -v f="$f:" '$1 == f {print $2}' "$st")
    [ "$got" = "$want" ] || fail "daemon $f $got, want $want ($caps)"
done
awk '$5 == "/" { split($6, o, ","); exit o[1] != "ro" }' "/proc/$dpid/mountinfo" ||
    fail "the daemon's / is not read-only"
grep -q "^NoNewPrivs:.*1" "$st" || fail "daemon without NoNewPrivs"
grep -q "^Seccomp:.*2" "$st" || fail "daemon without its seccomp filter"
say "daemon pid $dpid: uid $uid ($user), capabilities $want ($caps), seccomp filter, read-only mounts"
out=$(cd "$tmp" && runuser -u nobody -- env UMN_EBPF_SOCKET="$sock" UMN_BACKEND=ebpf \
    "$tmp/bin/umn" doctor 2>&1) || true
grep -q "^ebpf: ok: from umn daemon at $sock" <<<"$out" || { echo "$out" >&2; fail "nobody not served"; }
# Events through the sandboxed daemon's programs: every kind the eBPF backend claims.
# Exit 3 (a case could not run, e.g. the REMOVE race found no window on a loaded machine) is
# not a verdict; a miss or a stale use (exit 1) fails.
rc=0
cov=$(cd "$tmp" && runuser -u nobody -- env UMN_EBPF_SOCKET="$sock" "$tmp/bin/umn" coverage \
    --backend ebpf 2>&1) || rc=$?
echo "$cov" >&2
{ [ "$rc" = 0 ] || [ "$rc" = 3 ]; } && grep -Eq "^([0-9]+) of \1 kinds .*; 0 failed;" <<<"$cov" ||
    fail "umn coverage --backend ebpf as nobody through the daemon (exit $rc)"
kill -0 "$dpid" || fail "daemon exited"
say "ok: nobody served by the daemon as $user with only $caps (doctor, coverage)"
