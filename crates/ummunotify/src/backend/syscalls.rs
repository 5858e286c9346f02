//! The calls that can change the pages behind a range, as the backends that see calls (hooks,
//! perf tracepoints, eBPF programs on the same tracepoints) name and judge them: one list, so
//! the three never disagree on what counts.

/// The syscalls the tracepoint backends trace (entry and exit).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Syscall {
    Munmap,
    Mremap,
    Madvise,
    Brk,
    Mmap,
    Shmdt,
    Shmat,
    ProcessMadvise,
    RemapFilePages,
}

impl Syscall {
    /// Every traced syscall; a syscall's place here is [`index`](Self::index).
    pub(crate) const ALL: [Syscall; 9] = [
        Syscall::Munmap,
        Syscall::Mremap,
        Syscall::Madvise,
        Syscall::Brk,
        Syscall::Mmap,
        Syscall::Shmdt,
        Syscall::Shmat,
        Syscall::ProcessMadvise,
        Syscall::RemapFilePages,
    ];

    /// The syscall's name in `syscalls:sys_enter_<name>` and `sys_exit_<name>`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Syscall::Munmap => "munmap",
            Syscall::Mremap => "mremap",
            Syscall::Madvise => "madvise",
            Syscall::Brk => "brk",
            Syscall::Mmap => "mmap",
            Syscall::Shmdt => "shmdt",
            Syscall::Shmat => "shmat",
            Syscall::ProcessMadvise => "process_madvise",
            Syscall::RemapFilePages => "remap_file_pages",
        }
    }

    /// The syscall's place in [`ALL`](Self::ALL).
    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// Advice that drops, replaces or poisons pages (the old frames are gone afterwards):
/// `DONTNEED`, `FREE`, `REMOVE`, `PAGEOUT`, `DONTNEED_LOCKED`, `COLLAPSE`, `HWPOISON`,
/// `SOFT_OFFLINE`, `GUARD_INSTALL`. (`PAGEOUT` can not reclaim a pinned page, but it does take
/// the frame of an unpinned one: counted, to be safe.)
pub(crate) const DESTRUCTIVE_ADVICE: [i32; 9] = [4, 8, 9, 21, 24, 25, 100, 101, 102];

/// Whether `advice` (a syscall argument register: the kernel reads its low 32 bits, an `int`)
/// is in [`DESTRUCTIVE_ADVICE`]. No allocation: called from the hooks.
pub(crate) fn drops_pages(advice: u64) -> bool {
    DESTRUCTIVE_ADVICE.contains(&(advice as i32))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_is_in_index_order() {
        for (i, s) in Syscall::ALL.iter().enumerate() {
            assert_eq!(s.index(), i);
        }
    }

    #[test]
    fn the_advice_list_is_libc_s() {
        let named = [
            libc::MADV_DONTNEED,
            libc::MADV_FREE,
            libc::MADV_REMOVE,
            libc::MADV_PAGEOUT,
            24, // MADV_DONTNEED_LOCKED (not in libc 0.2 for every target)
            25, // MADV_COLLAPSE
            libc::MADV_HWPOISON,
            libc::MADV_SOFT_OFFLINE,
            102, // MADV_GUARD_INSTALL
        ];
        assert_eq!(named, DESTRUCTIVE_ADVICE);
        assert!(
            drops_pages(4 | (0xdead << 32)),
            "the high half is not the advice"
        );
        for keep in [libc::MADV_NORMAL, libc::MADV_WILLNEED, libc::MADV_COLD, 103] {
            assert!(!drops_pages(keep as u64), "{keep}");
        }
    }
}
