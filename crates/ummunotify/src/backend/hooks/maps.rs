//! The extent of a SysV shm attachment, read from `/proc/self/maps` without allocating.
//!
//! `shmdt(addr)` takes no length: the kernel detaches every mapping of the segment from `addr`
//! on. The hook learns the range from the maps line that starts at `addr`, extended over the
//! lines that follow it contiguously with the same inode (the segment's id). Raw syscalls and a
//! stack buffer only: this runs inside a hook.
#![allow(unsafe_code)] // Raw open/read/close into a stack buffer.

use super::calls::syscall6;

const BUF: usize = 8192;

fn hex(s: &[u8]) -> Option<u64> {
    let mut v: u64 = 0;
    if s.is_empty() {
        return None;
    }
    for &c in s {
        let d = (c as char).to_digit(16)? as u64;
        v = v.checked_mul(16)?.checked_add(d)?;
    }
    Some(v)
}

/// `(start, end, inode)` of one maps line.
fn parse(line: &[u8]) -> Option<(u64, u64, &[u8])> {
    let mut f = line.split(|&c| c == b' ').filter(|f| !f.is_empty());
    let range = f.next()?;
    let dash = range.iter().position(|&c| c == b'-')?;
    let start = hex(&range[..dash])?;
    let end = hex(&range[dash + 1..])?;
    let _perms = f.next()?;
    let _offset = f.next()?;
    let _dev = f.next()?;
    let inode = f.next()?;
    Some((start, end, inode))
}

/// The range of the shm attachment starting at `addr`, if a mapping starts there.
pub(super) fn attachment(addr: u64) -> Option<(u64, u64)> {
    let path = c"/proc/self/maps";
    // SAFETY: openat with a NUL-terminated path; the fd is closed below on every path.
    let fd = unsafe {
        syscall6(
            libc::SYS_openat as u64,
            [
                libc::AT_FDCWD as u64,
                path.as_ptr() as u64,
                (libc::O_RDONLY | libc::O_CLOEXEC) as u64,
                0,
                0,
                0,
            ],
        )
    };
    if fd < 0 {
        return None;
    }
    let mut buf = [0u8; BUF];
    let mut have = 0usize;
    let mut found: Option<(u64, u64)> = None;
    let mut inode = [0u8; 24];
    let mut inode_len = 0usize;
    let mut eof = false;
    'outer: while !eof {
        // SAFETY: reads into the free tail of our stack buffer.
        let n = unsafe {
            syscall6(
                libc::SYS_read as u64,
                [
                    fd as u64,
                    buf[have..].as_mut_ptr() as u64,
                    (BUF - have) as u64,
                    0,
                    0,
                    0,
                ],
            )
        };
        if n <= 0 {
            eof = true;
        } else {
            have += n as usize;
        }
        let mut at = 0;
        while let Some(nl) = buf[at..have].iter().position(|&c| c == b'\n') {
            let line = &buf[at..at + nl];
            at += nl + 1;
            let Some((s, e, ino)) = parse(line) else {
                continue;
            };
            match found {
                None if s == addr => {
                    found = Some((s, e));
                    inode_len = ino.len().min(inode.len());
                    inode[..inode_len].copy_from_slice(&ino[..inode_len]);
                }
                Some((fs, fe)) if s == fe && ino == &inode[..inode_len] => found = Some((fs, e)),
                Some(_) => break 'outer,
                None => {}
            }
        }
        buf.copy_within(at..have, 0);
        have -= at;
        if have == BUF {
            have = 0; // a line longer than the buffer: skip it
        }
    }
    // SAFETY: closes the fd opened above.
    unsafe { syscall6(libc::SYS_close as u64, [fd as u64, 0, 0, 0, 0, 0]) };
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_maps_line() {
        let l = b"7f0000001000-7f0000003000 rw-s 00000000 00:01 98311     /SYSV00000000 (deleted)";
        assert_eq!(
            parse(l),
            Some((0x7f00_0000_1000, 0x7f00_0000_3000, &b"98311"[..]))
        );
        assert_eq!(parse(b"garbage"), None);
    }
}
