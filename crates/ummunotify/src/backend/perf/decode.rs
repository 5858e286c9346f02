//! Records as the rings hold them, and what each traced syscall may change. Pure: no kernel.
//!
//! A sample (`PERF_SAMPLE_TID | TIME | RAW`) is `header, pid u32, tid u32, time u64, raw size
//! u32, raw bytes`; the raw bytes are the tracepoint's fields (tracefs `format`): `common_type`
//! u16 at 0 (the tracepoint id), `__syscall_nr` at 8, then the arguments as u64 from 16
//! (`sys_enter_*`) or the return value at 16 (`sys_exit_*`).

use crate::backend::hooks::calls::{mmap_range, mremap_ranges, pages, Ranges};
use crate::backend::syscalls::drops_pages;
pub(super) use crate::backend::syscalls::Syscall;

const PERF_RECORD_LOST: u32 = 2;
const PERF_RECORD_THROTTLE: u32 = 5;
const PERF_RECORD_SAMPLE: u32 = 9;
const PERF_RECORD_LOST_SAMPLES: u32 = 13;

/// The largest record this backend's events write (an 8-byte header, 8 pid/tid, 8 time, 4 size,
/// 8 common fields + 8 syscall nr + 6 × 8 arguments, padded): a ring with less free space than
/// this may have dropped one.
pub(super) const MAX_RECORD: u64 = 104;

/// The top of the user address space (57-bit, the larger of x86-64's two layouts): "everything".
pub(super) const TOP: u64 = 1 << 57;

const PAGE: u64 = 4096;

/// A decoded record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Record {
    /// A traced syscall began in thread `tid` at `time` with these arguments.
    Enter {
        tid: i32,
        time: u64,
        call: Syscall,
        args: [u64; 6],
    },
    /// A traced syscall of `tid` returned `ret` at `time`.
    Exit {
        tid: i32,
        time: u64,
        call: Syscall,
        ret: i64,
    },
    /// The kernel dropped records (or throttled the event): anything may have changed.
    Lost,
    /// A record this backend does not use.
    Other,
}

/// Maps tracepoint ids to calls: `(id, call, is_exit)`.
pub(super) type Ids = [(u64, Syscall, bool); 2 * Syscall::ALL.len()];

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// The record type and total size in a record's 8-byte header.
pub(super) fn header(h: &[u8; 8]) -> (u32, u16) {
    let ty = u32::from_ne_bytes([h[0], h[1], h[2], h[3]]);
    let size = u16::from_ne_bytes([h[6], h[7]]);
    (ty, size)
}

/// Decodes one whole record `r` (header included). A sample of an unknown tracepoint, or one
/// too short for its fields, is [`Record::Lost`]: the backend must not guess.
pub(super) fn decode(r: &[u8], ids: &Ids) -> Record {
    let Some(ty) = u32_at(r, 0) else {
        return Record::Lost;
    };
    match ty {
        PERF_RECORD_LOST | PERF_RECORD_THROTTLE | PERF_RECORD_LOST_SAMPLES => Record::Lost,
        PERF_RECORD_SAMPLE => sample(r, ids).unwrap_or(Record::Lost),
        _ => Record::Other,
    }
}

fn sample(r: &[u8], ids: &Ids) -> Option<Record> {
    let tid = u32_at(r, 12)? as i32;
    let time = u64_at(r, 16)?;
    let raw_size = u32_at(r, 24)? as usize;
    let raw = r.get(28..28 + raw_size)?;
    let id = u16::from_ne_bytes(raw.get(0..2)?.try_into().ok()?) as u64;
    let &(_, call, exit) = ids.iter().find(|e| e.0 == id)?;
    if exit {
        let ret = u64_at(raw, 16)? as i64;
        return Some(Record::Exit {
            tid,
            time,
            call,
            ret,
        });
    }
    let mut args = [0u64; 6];
    for (i, a) in args.iter_mut().enumerate() {
        // Calls with fewer arguments have shorter records: the rest stay 0.
        *a = u64_at(raw, 16 + 8 * i).unwrap_or(0);
    }
    Some(Record::Enter {
        tid,
        time,
        call,
        args,
    })
}

/// What a call with `args` may change, and whether it unmaps (`true`) or drops pages.
/// `brk_top` is the highest program break seen (a shrinking `brk` unmaps from the new break up
/// to the old one, which the record does not carry). Conservative where the record can not say:
/// `shmdt` and `shmat(SHM_REMAP)` take everything from their address up (the segment's size is
/// not in the record), a page-dropping `process_madvise` everything (its ranges are in the
/// caller's memory, not in the record).
pub(super) fn effect(call: Syscall, args: [u64; 6], brk_top: u64) -> (Ranges, bool) {
    const SHM_REMAP: u64 = 0o40000;
    let up = |x: u64| x.saturating_add(PAGE - 1) & !(PAGE - 1);
    let from = |a: u64| Some((a & !(PAGE - 1), TOP)).filter(|r| r.0 < r.1);
    match call {
        Syscall::Munmap => ([pages(args[0], args[1]), None], true),
        Syscall::Mremap => (mremap_ranges(args), true),
        Syscall::Madvise => {
            let r = if drops_pages(args[2]) {
                pages(args[0], args[1])
            } else {
                None
            };
            ([r, None], false)
        }
        Syscall::Brk => {
            let r = if args[0] != 0 && up(args[0]) < up(brk_top) {
                Some((up(args[0]), up(brk_top)))
            } else {
                None
            };
            ([r, None], true)
        }
        Syscall::Mmap => ([mmap_range(args), None], true),
        Syscall::Shmdt => ([from(args[0]), None], true),
        Syscall::Shmat => {
            let r = if args[2] & SHM_REMAP != 0 && args[1] != 0 {
                from(args[1])
            } else {
                None
            };
            ([r, None], true)
        }
        Syscall::ProcessMadvise => {
            let r = if drops_pages(args[3]) {
                Some((0, TOP))
            } else {
                None
            };
            ([r, None], false)
        }
        Syscall::RemapFilePages => ([pages(args[0], args[1]), None], true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids() -> Ids {
        let mut ids = [(0, Syscall::Munmap, false); 2 * Syscall::ALL.len()];
        for (i, c) in Syscall::ALL.iter().enumerate() {
            ids[2 * i] = (100 + 2 * i as u64, *c, false);
            ids[2 * i + 1] = (101 + 2 * i as u64, *c, true);
        }
        ids
    }

    fn sample_bytes(id: u16, tid: u32, time: u64, fields: &[u64]) -> Vec<u8> {
        let mut raw = vec![0u8; 16];
        raw[0..2].copy_from_slice(&id.to_ne_bytes());
        for f in fields {
            raw.extend_from_slice(&f.to_ne_bytes());
        }
        raw.extend_from_slice(&[0; 4]); // the kernel pads size + raw to 8 bytes
        let mut r = vec![0u8; 8];
        r[0..4].copy_from_slice(&PERF_RECORD_SAMPLE.to_ne_bytes());
        r.extend_from_slice(&tid.to_ne_bytes());
        r.extend_from_slice(&tid.to_ne_bytes());
        r.extend_from_slice(&time.to_ne_bytes());
        r.extend_from_slice(&(raw.len() as u32).to_ne_bytes());
        r.extend_from_slice(&raw);
        let size = r.len() as u16;
        r[6..8].copy_from_slice(&size.to_ne_bytes());
        r
    }

    #[test]
    fn decodes_enter_and_exit_by_tracepoint_id() {
        let ids = ids();
        let e = sample_bytes(100, 7, 55, &[0x1000, 0x2000]);
        assert_eq!(
            decode(&e, &ids),
            Record::Enter {
                tid: 7,
                time: 55,
                call: Syscall::Munmap,
                args: [0x1000, 0x2000, 0, 0, 0, 0]
            }
        );
        let x = sample_bytes(101, 7, 56, &[(-22i64) as u64]);
        assert_eq!(
            decode(&x, &ids),
            Record::Exit {
                tid: 7,
                time: 56,
                call: Syscall::Munmap,
                ret: -22
            }
        );
        // An id nobody opened, a truncated sample, a LOST record: never guessed at.
        assert_eq!(decode(&sample_bytes(999, 7, 1, &[]), &ids), Record::Lost);
        assert_eq!(decode(&e[..30], &ids), Record::Lost);
        let mut lost = [0u8; 24];
        lost[0..4].copy_from_slice(&PERF_RECORD_LOST.to_ne_bytes());
        assert_eq!(decode(&lost, &ids), Record::Lost);
    }

    #[test]
    fn effects_are_the_pages_each_call_may_change() {
        let m = |c, a: [u64; 6]| effect(c, a, 0x60_0000);
        assert_eq!(
            m(Syscall::Munmap, [0x1001, 0x10, 0, 0, 0, 0]).0,
            [Some((0x1000, 0x2000)), None]
        );
        // madvise: DONTNEED drops, WILLNEED keeps.
        assert_eq!(
            m(Syscall::Madvise, [0x4000, 0x1000, 4, 0, 0, 0]),
            ([Some((0x4000, 0x5000)), None], false)
        );
        assert_eq!(
            m(Syscall::Madvise, [0x4000, 0x1000, 3, 0, 0, 0]).0,
            [None, None]
        );
        // mmap: only MAP_FIXED replaces.
        assert_eq!(
            m(Syscall::Mmap, [0x8000, 0x1000, 3, 0x22, 0, 0]).0,
            [None, None]
        );
        assert_eq!(
            m(Syscall::Mmap, [0x8000, 0x1000, 3, 0x32, 0, 0]).0,
            [Some((0x8000, 0x9000)), None]
        );
        // brk: shrinking below the highest break seen unmaps up to it; growing changes nothing.
        assert_eq!(
            m(Syscall::Brk, [0x50_0001, 0, 0, 0, 0, 0]).0,
            [Some((0x50_1000, 0x60_0000)), None]
        );
        assert_eq!(m(Syscall::Brk, [0x70_0000, 0, 0, 0, 0, 0]).0, [None, None]);
        assert_eq!(m(Syscall::Brk, [0, 0, 0, 0, 0, 0]).0, [None, None]);
        // shmdt: from its address up; process_madvise(DONTNEED): everything.
        assert_eq!(
            m(Syscall::Shmdt, [0x7000_0000, 0, 0, 0, 0, 0]).0,
            [Some((0x7000_0000, TOP)), None]
        );
        assert_eq!(
            m(Syscall::ProcessMadvise, [3, 0x1234, 1, 4, 0, 0]).0,
            [Some((0, TOP)), None]
        );
        // mremap move: the old range and the fixed destination.
        assert_eq!(
            m(Syscall::Mremap, [0x1_0000, 0x2000, 0x2000, 3, 0x9_0000, 0]).0,
            [Some((0x1_0000, 0x1_2000)), Some((0x9_0000, 0x9_2000))]
        );
    }
}
