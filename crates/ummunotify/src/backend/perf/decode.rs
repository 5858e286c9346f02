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
    /// `mmu_notifier:mmu_notifier_invalidate_range_start` (the kernel patch in
    /// `kernel/patches/mmu-notifier-trace/`): task `tid` is about to change the pages of
    /// `[start, end)` of our mm for reason `event` (`enum mmu_notifier_event`).
    RangeStart {
        tid: i32,
        time: u64,
        start: u64,
        end: u64,
        event: u32,
    },
    /// `mmu_notifier_invalidate_range_end`: task `tid`'s change of `[start, end)` is done.
    RangeEnd {
        tid: i32,
        time: u64,
        start: u64,
        end: u64,
    },
    /// The kernel dropped records (or throttled the event): anything may have changed.
    Lost,
    /// A record this backend does not use.
    Other,
}

/// Maps tracepoint ids to calls: `(id, call, is_exit)`.
pub(super) type Ids = [(u64, Syscall, bool); 2 * Syscall::ALL.len()];

/// `MMU_NOTIFY_UNMAP` (`enum mmu_notifier_event`): munmap, mremap; every other reason (clear,
/// protection, soft-dirty, release, migrate, exclusive) leaves the mapping.
pub(super) const MMU_NOTIFY_UNMAP: u32 = 0;

/// The two MMU-notifier tracepoints: their ids, where their fields lie in the raw record
/// (tracefs `format`: both events share one class), and the mm they are filtered to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Mmu {
    pub(super) start_id: u64,
    pub(super) end_id: u64,
    /// Offsets in the raw record of `mm`, `start`, `end` (8 bytes each) and `event` (4).
    pub(super) mm_at: usize,
    pub(super) start_at: usize,
    pub(super) end_at: usize,
    pub(super) event_at: usize,
    /// Our mm (the kernel's pointer, learned at open); 0 while it is being learned.
    pub(super) mm: u64,
}

/// The offset of field `name` of `size` bytes in a tracefs `format` text
/// (`\tfield:unsigned long start;\toffset:16;\tsize:8;\tsigned:0;`).
pub(super) fn field_offset(format: &str, name: &str, size: usize) -> Option<usize> {
    format.lines().find_map(|l| {
        let mut decl = None;
        let (mut off, mut sz) = (None, None);
        for part in l.trim().split(';') {
            let part = part.trim();
            if let Some(d) = part.strip_prefix("field:") {
                decl = d.rsplit([' ', '*']).next();
            } else if let Some(o) = part.strip_prefix("offset:") {
                off = o.parse::<usize>().ok();
            } else if let Some(z) = part.strip_prefix("size:") {
                sz = z.parse::<usize>().ok();
            }
        }
        (decl == Some(name) && sz == Some(size))
            .then_some(off)
            .flatten()
    })
}

/// Decodes one whole record `r` of the MMU-notifier events. A sample of another mm (the
/// kernel's filter should have dropped it) is [`Record::Other`]; one of an unknown
/// tracepoint or too short is [`Record::Lost`].
pub(super) fn decode_mmu(r: &[u8], m: &Mmu) -> Record {
    let Some(ty) = u32_at(r, 0) else {
        return Record::Lost;
    };
    match ty {
        PERF_RECORD_LOST | PERF_RECORD_THROTTLE | PERF_RECORD_LOST_SAMPLES => Record::Lost,
        PERF_RECORD_SAMPLE => mmu_sample(r, m).unwrap_or(Record::Lost),
        _ => Record::Other,
    }
}

/// The mm of a range-start sample (learning our own).
pub(super) fn sample_mm(r: &[u8], m: &Mmu) -> Option<(i32, u64, u64)> {
    if u32_at(r, 0)? != PERF_RECORD_SAMPLE {
        return None;
    }
    let tid = u32_at(r, 12)? as i32;
    let raw_size = u32_at(r, 24)? as usize;
    let raw = r.get(28..28 + raw_size)?;
    let id = u16::from_ne_bytes(raw.get(0..2)?.try_into().ok()?) as u64;
    (id == m.start_id).then_some(())?;
    Some((tid, u64_at(raw, m.mm_at)?, u64_at(raw, m.start_at)?))
}

fn mmu_sample(r: &[u8], m: &Mmu) -> Option<Record> {
    let tid = u32_at(r, 12)? as i32;
    let time = u64_at(r, 16)?;
    let raw_size = u32_at(r, 24)? as usize;
    let raw = r.get(28..28 + raw_size)?;
    let id = u16::from_ne_bytes(raw.get(0..2)?.try_into().ok()?) as u64;
    if id != m.start_id && id != m.end_id {
        return None;
    }
    if u64_at(raw, m.mm_at)? != m.mm {
        return Some(Record::Other);
    }
    let start = u64_at(raw, m.start_at)?;
    let end = u64_at(raw, m.end_at)?;
    if id == m.start_id {
        let event = u32_at(raw, m.event_at)?;
        Some(Record::RangeStart {
            tid,
            time,
            start,
            end,
            event,
        })
    } else {
        Some(Record::RangeEnd {
            tid,
            time,
            start,
            end,
        })
    }
}

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

    const FORMAT: &str = "name: mmu_notifier_invalidate_range_start\nID: 412\nformat:\n\
        \tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
        \tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n\
        \tfield:const void * mm;\toffset:8;\tsize:8;\tsigned:0;\n\
        \tfield:unsigned long start;\toffset:16;\tsize:8;\tsigned:0;\n\
        \tfield:unsigned long end;\toffset:24;\tsize:8;\tsigned:0;\n\
        \tfield:unsigned int event;\toffset:32;\tsize:4;\tsigned:0;\n\
        \tfield:unsigned int flags;\toffset:36;\tsize:4;\tsigned:0;\n";

    fn mmu() -> Mmu {
        Mmu {
            start_id: 412,
            end_id: 413,
            mm_at: field_offset(FORMAT, "mm", 8).unwrap(),
            start_at: field_offset(FORMAT, "start", 8).unwrap(),
            end_at: field_offset(FORMAT, "end", 8).unwrap(),
            event_at: field_offset(FORMAT, "event", 4).unwrap(),
            mm: 0xffff_8880_0123_4000,
        }
    }

    /// A sample whose raw part is the MMU-notifier class's record.
    fn mmu_bytes(id: u16, tid: u32, mm: u64, start: u64, end: u64, event: u32) -> Vec<u8> {
        let mut fields = vec![mm, start, end, u64::from(event)];
        fields.push(0);
        let mut r = sample_bytes(id, tid, 9, &[]);
        // Rebuild with the class's layout: common fields (8), then mm, start, end, event.
        let mut raw = vec![0u8; 8];
        raw[0..2].copy_from_slice(&id.to_ne_bytes());
        for f in &fields[..3] {
            raw.extend_from_slice(&f.to_ne_bytes());
        }
        raw.extend_from_slice(&event.to_ne_bytes());
        raw.extend_from_slice(&0u32.to_ne_bytes());
        raw.extend_from_slice(&[0; 4]);
        r.truncate(24);
        r.extend_from_slice(&(raw.len() as u32).to_ne_bytes());
        r.extend_from_slice(&raw);
        let size = r.len() as u16;
        r[6..8].copy_from_slice(&size.to_ne_bytes());
        r
    }

    #[test]
    fn reads_the_field_offsets_from_the_format() {
        let m = mmu();
        assert_eq!((m.mm_at, m.start_at, m.end_at, m.event_at), (8, 16, 24, 32));
        // The size must match too: a kernel with another layout is refused, not misread.
        assert_eq!(field_offset(FORMAT, "event", 8), None);
        assert_eq!(field_offset(FORMAT, "nosuch", 8), None);
    }

    #[test]
    fn decodes_range_start_and_end_of_our_mm_only() {
        let m = mmu();
        let s = mmu_bytes(412, 7, m.mm, 0x1000, 0x3000, 1);
        assert_eq!(
            decode_mmu(&s, &m),
            Record::RangeStart {
                tid: 7,
                time: 9,
                start: 0x1000,
                end: 0x3000,
                event: 1
            }
        );
        assert_eq!(sample_mm(&s, &m), Some((7, m.mm, 0x1000)));
        let e = mmu_bytes(413, 7, m.mm, 0x1000, 0x3000, 1);
        assert_eq!(
            decode_mmu(&e, &m),
            Record::RangeEnd {
                tid: 7,
                time: 9,
                start: 0x1000,
                end: 0x3000
            }
        );
        // Another mm: not ours (the kernel's filter should have dropped it). An unknown id,
        // a truncated sample: never guessed at.
        assert_eq!(
            decode_mmu(&mmu_bytes(412, 7, m.mm + 64, 0, 4096, 0), &m),
            Record::Other
        );
        assert_eq!(
            decode_mmu(&mmu_bytes(999, 7, m.mm, 0, 4096, 0), &m),
            Record::Lost
        );
        assert_eq!(decode_mmu(&s[..40], &m), Record::Lost);
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
