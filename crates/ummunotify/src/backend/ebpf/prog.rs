//! The BPF programs, generated instruction by instruction (see [`super::asm`]).
//!
//! One program per `sys_enter_*` tracepoint computes the range the call will change from its
//! arguments, finds the calling process's area (`procs[tgid]`), remembers the range for the
//! thread (`inflight[pid_tgid]`), and bumps the word of every registered range it overlaps
//! (and the area's counter once per word). One program on every matching `sys_exit_*`
//! tracepoint takes the remembered range back and does the same again: a range registered
//! while the call was in flight (after the entry looked, before the change completed) is
//! invalidated before the call returns too.
//!
//! Only the tracepoint record (its layout read from tracefs) and maps are touched: no kernel
//! structure is read, so there is nothing to relocate per kernel build (no BTF, no CO-RE).

use super::asm::*;
use super::layout::*;
pub(crate) use crate::backend::syscalls::Syscall;
use crate::backend::syscalls::DESTRUCTIVE_ADVICE;

// Stack slots (offsets from r10).
const TGID: i16 = -8;
const PID_TGID: i16 = -16;
const REC: i16 = -48; // {s0, e0, s1, e1}
const ZERO: i16 = -56;
const IOVEC: i16 = -80;

const MAP_FIXED: i32 = 0x10;
const MAP_FIXED_NOREPLACE: i32 = 0x10_0000;
const MREMAP_MAYMOVE: i32 = 1;
const MREMAP_FIXED: i32 = 2;
const SHM_REMAP: i32 = 0o40000;
const NR_BRK: i32 = 12; // x86-64
const PMADV_MAXVEC: i32 = 8;

struct Gen {
    a: Asm,
    /// Offset of the first argument (or of `ret`) in the tracepoint record.
    arg0: i16,
    maps: Maps,
    out: Label,
}

/// The fds of the maps the programs use.
#[derive(Clone, Copy)]
pub(crate) struct Maps {
    pub(crate) procs: i32,
    pub(crate) state: i32,
    pub(crate) inflight: i32,
}

impl Gen {
    fn new(arg0: i16, maps: Maps) -> Gen {
        let mut a = Asm::default();
        let out = a.label();
        Gen { a, arg0, maps, out }
    }

    fn arg(&mut self, dst: Reg, i: i16) {
        self.a.load(Size::DW, dst, R6, self.arg0 + 8 * i);
    }

    /// `dst = start + PAGE_ALIGN(len)`, `u64::MAX` on overflow.
    fn end_of(&mut self, dst: Reg, start: Reg, len: Reg) {
        let ok = self.a.label();
        self.a
            .mov(dst, len)
            .alu_imm(Alu::Add, dst, PAGE as i32 - 1)
            .alu_imm(Alu::And, dst, -(PAGE as i32))
            .alu_reg(Alu::Add, dst, start)
            .jmp_reg(Jmp::Ge, dst, start, ok)
            .mov_imm(dst, -1);
        self.a.bind(ok);
    }

    fn page_up(&mut self, r: Reg) {
        self.a
            .alu_imm(Alu::Add, r, PAGE as i32 - 1)
            .alu_imm(Alu::And, r, -(PAGE as i32));
    }

    /// Jumps to `out` unless `r` is one of `set`.
    fn require_one_of(&mut self, r: Reg, set: &[i32]) {
        let ok = self.a.label();
        for &v in set {
            self.a.jmp_imm(Jmp::Eq, r, v, ok);
        }
        self.a.ja(self.out);
        self.a.bind(ok);
    }

    fn rec(&mut self, i: i16, r: Reg) {
        self.a.store(Size::DW, R10, REC + 8 * i, r);
    }

    fn rec_imm(&mut self, i: i16, v: i32) {
        self.a.store_imm(Size::DW, R10, REC + 8 * i, v);
    }

    fn pid_tgid(&mut self) {
        self.a
            .call(GET_CURRENT_PID_TGID)
            .store(Size::DW, R10, PID_TGID, R0)
            .alu_imm(Alu::Rsh, R0, 32)
            .store(Size::W, R10, TGID, R0)
            .store_imm(Size::W, R10, ZERO, 0);
    }

    /// `r7 = procs[tgid][0]` if `state[tgid]` is ARMED and not GONE, or go to `out`. `procs`
    /// first: a process without an area pays one miss.
    fn area(&mut self) {
        let out = self.out;
        self.area_only();
        self.state();
        self.a
            .load(Size::DW, R1, R0, STATE_FLAGS)
            .alu_imm(Alu::And, R1, (ARMED | GONE) as i32)
            .jmp_imm(Jmp::Ne, R1, ARMED as i32, out)
            .load(Size::DW, R1, R0, 0)
            .load(Size::DW, R2, R7, OFF_NONCE as i16)
            .jmp_reg(Jmp::Ne, R1, R2, out);
    }

    /// `r0 = &state[tgid]`, or go to `out`.
    fn state(&mut self) {
        let out = self.out;
        self.a
            .load_map(R1, self.maps.state)
            .mov(R2, R10)
            .alu_imm(Alu::Add, R2, TGID as i32)
            .call(MAP_LOOKUP_ELEM)
            .jmp_imm(Jmp::Eq, R0, 0, out);
    }

    /// `r7 = procs[tgid][0]`, whatever its state, or go to `out`.
    fn area_only(&mut self) {
        let out = self.out;
        self.a
            .load_map(R1, self.maps.procs)
            .mov(R2, R10)
            .alu_imm(Alu::Add, R2, TGID as i32)
            .call(MAP_LOOKUP_ELEM)
            .jmp_imm(Jmp::Eq, R0, 0, out)
            .mov(R1, R0)
            .mov(R2, R10)
            .alu_imm(Alu::Add, R2, ZERO as i32)
            .call(MAP_LOOKUP_ELEM)
            .jmp_imm(Jmp::Eq, R0, 0, out)
            .mov(R7, R0);
    }

    /// Bumps the word of every registered range of area r7 that `[s, e)` (record slots `i`,
    /// `i + 1`) overlaps, and the area's counter once per word, and widens the range's hint to
    /// include `[s, e)`. Clobbers r0-r6, r8, r9.
    ///
    /// The verifier walks the loop once per slot and keeps every branch it has not taken yet
    /// pending (at most 8,192), so the body has one data-dependent branch: the overlap test is
    /// arithmetic (`x < y` is bit 63 of `x - y` for values below 2^63; user addresses are).
    fn check(&mut self, i: i16) {
        let done = self.a.label();
        let top = self.a.label();
        let next = self.a.label();
        let clamped = self.a.label();
        let a = &mut self.a;
        a.load(Size::DW, R6, R10, REC + 8 * i)
            .load(Size::DW, R9, R10, REC + 8 * (i + 1))
            .jmp_reg(Jmp::Ge, R6, R9, done)
            // Outside the bounding box of every registration: nothing to scan.
            .load(Size::DW, R1, R7, OFF_HI as i16)
            .jmp_reg(Jmp::Ge, R6, R1, done)
            .load(Size::DW, R1, R7, OFF_LO as i16)
            .jmp_reg(Jmp::Ge, R1, R9, done)
            // e = min(e, 2^63 - 1); s < hi < 2^63 already.
            .mov_imm(R1, -1)
            .alu_imm(Alu::Rsh, R1, 1)
            .jmp_reg(Jmp::Le, R9, R1, clamped)
            .mov(R9, R1);
        a.bind(clamped);
        a.load(Size::W, R2, R7, OFF_COUNT as i16).mov_imm(R8, 0);
        a.bind(top);
        a.jmp_reg(Jmp::Ge, R8, R2, done)
            .jmp_imm(Jmp::Ge, R8, SLOTS as i32, done)
            .mov(R3, R8)
            .alu_imm(Alu::Lsh, R3, 4)
            .alu_reg(Alu::Add, R3, R7)
            // r4 = range start < e
            .load(Size::DW, R4, R3, OFF_RANGES as i16)
            .alu_reg(Alu::Sub, R4, R9)
            .alu_imm(Alu::Rsh, R4, 63)
            // r5 = s < range end
            .load(Size::DW, R1, R3, OFF_RANGES as i16 + 8)
            .mov(R5, R6)
            .alu_reg(Alu::Sub, R5, R1)
            .alu_imm(Alu::Rsh, R5, 63)
            .alu_reg(Alu::And, R4, R5)
            .jmp_imm(Jmp::Eq, R4, 0, next);
        word_ptr(a, R1);
        a.mov_imm(R0, 1)
            .atomic_fetch_add(R1, 0, R0) // r0 = the word before this call's bump
            .mov_imm(R5, 1)
            .atomic_add(R7, OFF_GEN as i16, R5)
            // The hint: widen [lo, hi) to include [s, e), without branches (the verifier's
            // budget): x ^= (x ^ y) & -(bit 63 of a difference).
            .mov(R3, R8)
            .alu_imm(Alu::Mul, R3, HINT_SIZE as i32)
            .alu_reg(Alu::Add, R3, R7)
            .alu_imm(Alu::Add, R3, OFF_HINTS as i32);
        widen(a, 0, R6, true); // lo = min(lo, s)
        widen(a, 8, R9, false); // hi = max(hi, e)
                                // Another call bumped the word between our bump and now (a full barrier after our
                                // stores): our read-modify-write may have raced with its; mark the hint torn.
        word_ptr(a, R1);
        a.mov_imm(R4, 0)
            .atomic_fetch_add(R1, 0, R4) // r4 = the word now
            .alu_imm(Alu::Add, R0, 1)
            .alu_reg(Alu::Xor, R4, R0) // != 0: torn
            .mov(R5, R4)
            .neg(R5)
            .alu_reg(Alu::Or, R4, R5)
            .alu_imm(Alu::Rsh, R4, 63)
            .atomic_or(R3, 16, R4);
        a.bind(next);
        a.alu_imm(Alu::Add, R8, 1).ja(top);
        a.bind(done);
    }

    fn finish(mut self) -> Vec<Insn> {
        let out = self.out;
        self.a.bind(out);
        // 1, not 0: a tracepoint program's 0 tells the kernel to drop the event for every other
        // perf event on that tracepoint, system-wide; 0 silenced the perf backend (and any
        // `perf record` on the node) for every syscall these programs watch.
        self.a.mov_imm(R0, 1).exit();
        self.a.finish()
    }
}

/// `dst = &words[i]` (r8 = i, r7 = area).
fn word_ptr(a: &mut Asm, dst: Reg) {
    a.mov(dst, R8)
        .alu_imm(Alu::Lsh, dst, 3)
        .alu_reg(Alu::Add, dst, R7)
        .alu_imm(Alu::Add, dst, OFF_WORDS as i32);
}

/// `*(r3 + off)` moves to `y` if `y` is lower (`low`) or higher than it, without a branch:
/// `x ^= (x ^ y) & -(bit 63 of the difference)` (both below 2^63). Clobbers r1, r4, r5.
fn widen(a: &mut Asm, off: i16, y: Reg, low: bool) {
    a.load(Size::DW, R4, R3, off);
    if low {
        a.mov(R5, y).alu_reg(Alu::Sub, R5, R4); // y < x
    } else {
        a.mov(R5, R4).alu_reg(Alu::Sub, R5, y); // x < y
    }
    a.alu_imm(Alu::Rsh, R5, 63)
        .neg(R5)
        .mov(R1, R4)
        .alu_reg(Alu::Xor, R1, y)
        .alu_reg(Alu::And, R1, R5)
        .alu_reg(Alu::Xor, R4, R1)
        .store(Size::DW, R3, off, R4);
}

/// Argument filters that need no map: jump to `out` for calls that change nothing.
fn prefilter(g: &mut Gen, kind: Syscall) {
    let out = g.out;
    match kind {
        Syscall::Madvise => {
            g.arg(R1, 2);
            g.require_one_of(R1, &DESTRUCTIVE_ADVICE);
        }
        Syscall::ProcessMadvise => {
            g.arg(R1, 3);
            g.require_one_of(R1, &DESTRUCTIVE_ADVICE);
        }
        Syscall::Mmap => {
            g.arg(R1, 3);
            let fixed = g.a.label();
            g.a.jmp_imm(Jmp::Set, R1, MAP_FIXED_NOREPLACE, out)
                .jmp_imm(Jmp::Set, R1, MAP_FIXED, fixed)
                .ja(out);
            g.a.bind(fixed);
        }
        Syscall::Shmat => {
            g.arg(R1, 2);
            let remap = g.a.label();
            g.a.jmp_imm(Jmp::Set, R1, SHM_REMAP, remap).ja(out);
            g.a.bind(remap);
        }
        _ => {}
    }
}

/// Fills the record `{s0, e0, s1, e1}` (zeroed before) from the arguments; r6 = ctx,
/// r7 = area.
fn compute(g: &mut Gen, kind: Syscall) {
    match kind {
        Syscall::Munmap | Syscall::Madvise | Syscall::Mmap | Syscall::RemapFilePages => {
            g.arg(R1, 0);
            g.a.alu_imm(Alu::And, R1, -(PAGE as i32));
            g.arg(R2, 1);
            g.end_of(R3, R1, R2);
            g.rec(0, R1);
            g.rec(1, R3);
        }
        Syscall::Shmdt => {
            // The segment's size is not in the arguments: everything from addr up.
            g.arg(R1, 0);
            g.a.alu_imm(Alu::And, R1, -(PAGE as i32));
            g.rec(0, R1);
            g.rec_imm(1, -1);
        }
        Syscall::Shmat => {
            g.arg(R1, 1);
            g.a.alu_imm(Alu::And, R1, -(PAGE as i32));
            g.rec(0, R1);
            g.rec_imm(1, -1);
        }
        Syscall::Brk => {
            // Shrinking unmaps [PAGE_ALIGN(new), PAGE_ALIGN(cur)); cur is what the last brk
            // returned (the exit program records it), unknown (0) means "up to the top".
            let done = g.a.label();
            let unknown = g.a.label();
            g.arg(R1, 0);
            g.a.jmp_imm(Jmp::Eq, R1, 0, done);
            g.page_up(R1);
            g.a.load(Size::DW, R2, R7, OFF_BRK as i16)
                .jmp_imm(Jmp::Eq, R2, 0, unknown);
            g.page_up(R2);
            g.a.jmp_reg(Jmp::Ge, R1, R2, done);
            g.rec(0, R1);
            g.rec(1, R2);
            g.a.ja(done);
            g.a.bind(unknown);
            g.rec(0, R1);
            g.rec_imm(1, -1);
            g.a.bind(done);
        }
        Syscall::Mremap => {
            let dest = g.a.label();
            let grow = g.a.label();
            let whole = g.a.label();
            let lo_ok = g.a.label();
            let fixed = g.a.label();
            let done = g.a.label();
            g.arg(R1, 0);
            g.a.alu_imm(Alu::And, R1, -(PAGE as i32));
            g.arg(R2, 1);
            g.page_up(R2);
            g.arg(R3, 2);
            g.page_up(R3);
            g.arg(R4, 3);
            g.arg(R5, 4);
            g.a.jmp_imm(Jmp::Eq, R2, 0, dest) // old_len 0: a new mapping, nothing lost
                .jmp_reg(Jmp::Ge, R3, R2, grow)
                // Shrink: the tail goes, or all of it if the mapping moves.
                .mov(R8, R1)
                .jmp_imm(Jmp::Set, R4, MREMAP_FIXED, lo_ok)
                .alu_reg(Alu::Add, R8, R3);
            g.a.bind(lo_ok);
            g.end_of(R9, R1, R2);
            g.rec(0, R8);
            g.rec(1, R9);
            g.a.ja(dest);
            g.a.bind(grow);
            // Growing: may move (MAYMOVE, DONTUNMAP): the whole old range; in place: nothing.
            g.a.jmp_imm(Jmp::Set, R4, MREMAP_MAYMOVE, whole).ja(dest);
            g.a.bind(whole);
            g.end_of(R9, R1, R2);
            g.rec(0, R1);
            g.rec(1, R9);
            g.a.bind(dest);
            g.a.jmp_imm(Jmp::Set, R4, MREMAP_FIXED, fixed).ja(done);
            g.a.bind(fixed);
            g.a.alu_imm(Alu::And, R5, -(PAGE as i32));
            g.end_of(R9, R5, R3);
            g.rec(2, R5);
            g.rec(3, R9);
            g.a.bind(done);
        }
        Syscall::ProcessMadvise => {
            // One range covering every iovec (at most PMADV_MAXVEC; more, or one that can not
            // be read: everything).
            let whole = g.a.label();
            let done = g.a.label();
            g.arg(R8, 1);
            g.arg(R9, 2);
            g.a.jmp_imm(Jmp::Eq, R9, 0, done)
                .jmp_imm(Jmp::Gt, R9, PMADV_MAXVEC, whole);
            g.rec_imm(0, -1);
            for i in 0..PMADV_MAXVEC {
                let skip_lo = g.a.label();
                let skip_hi = g.a.label();
                g.a.jmp_imm(Jmp::Le, R9, i, done)
                    .mov(R1, R10)
                    .alu_imm(Alu::Add, R1, IOVEC as i32)
                    .mov_imm(R2, 16)
                    .mov(R3, R8)
                    .alu_imm(Alu::Add, R3, 16 * i)
                    .call(PROBE_READ_USER)
                    .jmp_imm(Jmp::Ne, R0, 0, whole)
                    .load(Size::DW, R1, R10, IOVEC)
                    .alu_imm(Alu::And, R1, -(PAGE as i32))
                    .load(Size::DW, R2, R10, IOVEC + 8);
                g.end_of(R3, R1, R2);
                g.a.load(Size::DW, R4, R10, REC)
                    .jmp_reg(Jmp::Ge, R1, R4, skip_lo);
                g.rec(0, R1);
                g.a.bind(skip_lo);
                g.a.load(Size::DW, R4, R10, REC + 8)
                    .jmp_reg(Jmp::Le, R3, R4, skip_hi);
                g.rec(1, R3);
                g.a.bind(skip_hi);
            }
            g.a.ja(done);
            g.a.bind(whole);
            g.rec_imm(0, 0);
            g.rec_imm(1, -1);
            g.a.bind(done);
        }
    }
}

/// The `sys_enter_<kind>` program. `arg0` is the offset of the first argument in the record.
pub(crate) fn enter(kind: Syscall, arg0: i16, maps: Maps) -> Vec<Insn> {
    let mut g = Gen::new(arg0, maps);
    g.a.mov(R6, R1);
    for i in 0..4 {
        g.rec_imm(i, 0);
    }
    prefilter(&mut g, kind);
    g.pid_tgid();
    g.area();
    compute(&mut g, kind);
    g.a.load_map(R1, g.maps.inflight)
        .mov(R2, R10)
        .alu_imm(Alu::Add, R2, PID_TGID as i32)
        .mov(R3, R10)
        .alu_imm(Alu::Add, R3, REC as i32)
        .mov_imm(R4, 0)
        .call(MAP_UPDATE_ELEM);
    g.check(0);
    g.check(2);
    g.finish()
}

/// The program on every `sys_exit_*` tracepoint. `ret` is the offset of `ret` in the record.
pub(crate) fn exit(ret: i16, maps: Maps) -> Vec<Insn> {
    let mut g = Gen::new(ret, maps);
    let out = g.out;
    let checks = g.a.label();
    g.a.mov(R6, R1);
    g.pid_tgid();
    g.a.load_map(R1, g.maps.inflight)
        .mov(R2, R10)
        .alu_imm(Alu::Add, R2, PID_TGID as i32)
        .call(MAP_LOOKUP_ELEM)
        .jmp_imm(Jmp::Eq, R0, 0, out);
    for i in 0..4 {
        g.a.load(Size::DW, R1, R0, 8 * i)
            .store(Size::DW, R10, REC + 8 * i, R1);
    }
    g.a.load_map(R1, g.maps.inflight)
        .mov(R2, R10)
        .alu_imm(Alu::Add, R2, PID_TGID as i32)
        .call(MAP_DELETE_ELEM);
    g.area();
    g.a.load(Size::W, R1, R6, 8) // __syscall_nr
        .jmp_imm(Jmp::Ne, R1, NR_BRK, checks);
    g.arg(R1, 0);
    g.a.store(Size::DW, R7, OFF_BRK as i16, R1);
    g.a.bind(checks);
    g.check(0);
    g.check(2);
    g.finish()
}

/// The program on `sys_enter_prctl` (`arg0`: the offset of `option`): arms the caller's area.
///
/// Only for `prctl(ARM_PRCTL, nonce)` where `state[tgid]` holds that nonce and is not GONE:
/// sets ARMED and writes the tgid into the area's `armed` word. The client calls it from its own
/// process after the daemon's reply, so an area is armed only by a process that holds the nonce
/// *and* runs under the tgid the daemon gave it to, before any exec of that tgid. Arming is
/// decided by one `fetch_or` on the flags: a GONE set concurrently (the leader exiting) either
/// comes first (no `armed` word) or sees ARMED (the area is marked dead).
pub(crate) fn arm(arg0: i16, maps: Maps) -> Vec<Insn> {
    let mut g = Gen::new(arg0, maps);
    let out = g.out;
    g.a.mov(R6, R1)
        .load(Size::W, R1, R6, arg0)
        .jmp_imm(Jmp::Ne, R1, ARM_PRCTL as i32, out);
    g.pid_tgid();
    g.state();
    g.a.mov(R8, R0)
        .load(Size::DW, R1, R8, 0)
        .load(Size::DW, R2, R6, arg0 + 8)
        .jmp_reg(Jmp::Ne, R1, R2, out)
        .load(Size::DW, R1, R8, STATE_FLAGS)
        .jmp_imm(Jmp::Set, R1, GONE as i32, out);
    g.area_only();
    g.a.load(Size::DW, R1, R7, OFF_NONCE as i16)
        .load(Size::DW, R2, R6, arg0 + 8)
        .jmp_reg(Jmp::Ne, R1, R2, out)
        .mov_imm(R1, ARMED as i32)
        .atomic_fetch_or(R8, STATE_FLAGS, R1)
        .jmp_imm(Jmp::Set, R1, GONE as i32, out)
        .load(Size::W, R1, R10, TGID)
        .store(Size::DW, R7, OFF_ARMED as i16, R1);
    g.finish()
}

/// The program on `sched:sched_process_exec` (`leader_only` false) and
/// `sched:sched_process_exit` (`leader_only`: only when the exiting thread is the group
/// leader, `pid == tgid`): sets GONE in `state[tgid]`; if the area was armed, marks it dead:
/// the `dead` word, then every slot's word and the counter bumped once more, so every check of
/// its owner fails from here on (a registration that read its word before the marking sees it
/// bumped; one that read it after sees `dead`: the store and the scan are ordered by a full
/// barrier, as are the registration's).
pub(crate) fn gone(leader_only: bool, maps: Maps) -> Vec<Insn> {
    let mut g = Gen::new(0, maps);
    let out = g.out;
    g.pid_tgid();
    if leader_only {
        g.a.load(Size::DW, R1, R10, PID_TGID)
            .alu_imm(Alu::Lsh, R1, 32)
            .alu_imm(Alu::Rsh, R1, 32)
            .load(Size::W, R2, R10, TGID)
            .jmp_reg(Jmp::Ne, R1, R2, out);
    }
    g.state();
    g.a.mov(R9, R0)
        .mov_imm(R1, GONE as i32)
        .atomic_fetch_or(R9, STATE_FLAGS, R1)
        .jmp_imm(Jmp::Set, R1, GONE as i32, out)
        .alu_imm(Alu::And, R1, ARMED as i32)
        .jmp_imm(Jmp::Eq, R1, 0, out);
    g.area_only();
    g.a.load(Size::DW, R1, R9, 0)
        .load(Size::DW, R2, R7, OFF_NONCE as i16)
        .jmp_reg(Jmp::Ne, R1, R2, out);
    let top = g.a.label();
    let done = g.a.label();
    g.a.mov_imm(R1, 1)
        .atomic_fetch_or(R7, OFF_DEAD as i16, R1)
        .load(Size::W, R2, R7, OFF_COUNT as i16)
        .mov_imm(R8, 0);
    g.a.bind(top);
    g.a.jmp_reg(Jmp::Ge, R8, R2, done)
        .jmp_imm(Jmp::Ge, R8, SLOTS as i32, done);
    word_ptr(&mut g.a, R1);
    g.a.mov_imm(R3, 1)
        .atomic_add(R1, 0, R3)
        .atomic_add(R7, OFF_GEN as i16, R3)
        .alu_imm(Alu::Add, R8, 1)
        .ja(top);
    g.a.bind(done);
    g.a.mov_imm(R3, 1).atomic_add(R7, OFF_GEN as i16, R3);
    g.finish()
}
