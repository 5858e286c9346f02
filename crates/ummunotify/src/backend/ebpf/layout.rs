//! The area: one `BPF_F_MMAPABLE` array element per process, shared by the programs (which
//! bump words) and the process (which writes ranges and reads words).
//!
//! ```text
//! offset  0  gen     u64  +1 for every word bumped (the 2010 device's counter)
//!         8  count   u32  slots in use are below this (the programs scan 0..count)
//!        16  lo      u64  lowest start of any registered range  } the programs skip calls
//!        24  hi      u64  highest end of any registered range   } outside [lo, hi)
//!        32  brk     u64  what the process's last brk returned (written by the exit program)
//!        40  layout  u64  LAYOUT_VERSION, written by whoever creates the area
//!        48  armed   u64  the tgid the arming program saw (0: not armed; see `prog::arm`)
//!        56  dead    u64  != 0 (DEAD): the process exec'd or its leader exited (set by the
//!                         programs: none writes here again), or the daemon serving the area
//!                         stopped (set by the daemon on SIGTERM/SIGINT/SIGHUP, or by the
//!                         client's watcher on the connection's EOF); every word and gen are
//!                         bumped after it
//!        64  nonce   u64  the daemon's nonce for this area (= state[tgid].nonce): a program
//!                         that found this area and a state of another (a replacement racing
//!                         it) writes nothing
//!       128  ranges  [SLOTS] {start u64, end u64}   end == 0: free
//! 128+16*SLOTS words [SLOTS] u64                    +1 for every call that touched the range
//! 128+24*SLOTS hints [SLOTS] {lo, hi, torn: u64}    union of the calls' ranges since the last
//!                                                   take (EMPTY_LO, 0: none); torn != 0: two
//!                                                   calls raced on the union, use the whole range
//! ```

/// The page size the programs align to (x86-64).
pub(crate) const PAGE: u64 = 4096;
/// Registered ranges per process.
pub const SLOTS: usize = 1024;
pub(crate) const OFF_GEN: usize = 0;
pub(crate) const OFF_COUNT: usize = 8;
pub(crate) const OFF_LO: usize = 16;
pub(crate) const OFF_HI: usize = 24;
pub(crate) const OFF_BRK: usize = 32;
pub(crate) const OFF_LAYOUT: usize = 40;
pub(crate) const OFF_ARMED: usize = 48;
/// The area's dead marker: [`DEAD`] once its program or its daemon is gone.
pub(crate) const OFF_DEAD: usize = 56;
/// The value of a dead area's marker (the programs `or` in 1).
pub(crate) const DEAD: u64 = 1;
pub(crate) const OFF_NONCE: usize = 64;
pub(crate) const OFF_RANGES: usize = 128;
pub(crate) const OFF_WORDS: usize = OFF_RANGES + 16 * SLOTS;
pub(crate) const OFF_HINTS: usize = OFF_WORDS + 8 * SLOTS;
/// Bytes of one area.
pub(crate) const AREA_SIZE: usize = OFF_HINTS + HINT_SIZE * SLOTS;
/// Bytes of one slot's hint.
pub(crate) const HINT_SIZE: usize = 24;
/// `lo` of an empty hint: above every user address and below 2^63, so the programs'
/// branch-free `min` (bit 63 of a difference) works on it.
pub(crate) const EMPTY_LO: u64 = i64::MAX as u64;
/// Changes whenever the layout or the programs' meaning changes (the daemon and its clients
/// must agree).
pub(crate) const LAYOUT_VERSION: u64 = 3;
const _: () = assert!(OFF_NONCE + 8 <= OFF_RANGES);

// Field offsets the programs use as instruction offsets (i16); words and hints are reached
// with register arithmetic.
const _: () = assert!(OFF_RANGES + 8 <= i16::MAX as usize);
const _: () = assert!(OFF_DEAD + 8 <= OFF_RANGES);

/// `state[tgid]`: the daemon's record of the area it gave that tgid, never given to clients.
pub(crate) const STATE_SIZE: usize = 16; // {nonce u64, flags u64}
pub(crate) const STATE_FLAGS: i16 = 8;
/// The process armed its area (the magic prctl with the nonce, from its own tgid).
pub(crate) const ARMED: u64 = 1;
/// The process exec'd or its leader exited: no program writes into its area again.
pub(crate) const GONE: u64 = 2;
/// The `prctl` option that arms an area (`"UMN1"`; no kernel defines it: `EINVAL`).
pub(crate) const ARM_PRCTL: u64 = 0x554d_4e31;
