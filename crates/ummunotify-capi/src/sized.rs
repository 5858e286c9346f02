//! Public structs that can grow: each starts with `size_t size`, which the caller sets to
//! `sizeof` of the struct it was compiled with (the convention of Linux's `clone3`/`openat2`
//! arguments). A smaller size than this library's first version is refused; a larger one (a
//! program built against a newer header) is accepted for output, and for input only if every
//! byte this library does not know is zero, so no option it can not honour is silently ignored.
use std::mem::size_of;

/// Why a caller's struct was refused.
pub(crate) enum SizeError {
    /// `size` below the first version's size (uninitialised, or not set).
    TooSmall(usize),
    /// Input with non-zero bytes beyond what this library knows.
    UnknownFields(usize),
}

impl SizeError {
    pub(crate) fn message(&self, what: &str) -> String {
        match self {
            SizeError::TooSmall(n) => format!("{what}.size is {n}: set it to sizeof({what})"),
            SizeError::UnknownFields(n) => format!(
                "{what}.size is {n} and sets fields this library (version {}) does not know",
                env!("CARGO_PKG_VERSION")
            ),
        }
    }
}

/// The caller's `size` field (the struct's first `usize`).
///
/// # Safety
/// `p` must point to a readable struct that starts with a `usize`.
unsafe fn size_field<T>(p: *const T) -> usize {
    // SAFETY: (caller) the first field is a readable usize.
    unsafe { p.cast::<usize>().read() }
}

/// Reads a caller's input struct: its first `min(size, size_of::<T>())` bytes over `defaults`
/// (which holds the values of fields an older caller's version lacks).
///
/// # Safety
/// `p` must point to `(*p).size` readable bytes starting with a `usize`; `T` is plain data
/// whose first field is that `usize`.
pub(crate) unsafe fn read<T: Copy>(p: *const T, defaults: T, min: usize) -> Result<T, SizeError> {
    // SAFETY: (caller) readable.
    let size = unsafe { size_field(p) };
    if size < min {
        return Err(SizeError::TooSmall(size));
    }
    let known = size_of::<T>();
    if size > known {
        // SAFETY: (caller) `size` bytes are readable.
        let extra = unsafe { std::slice::from_raw_parts(p.cast::<u8>().add(known), size - known) };
        if extra.iter().any(|b| *b != 0) {
            return Err(SizeError::UnknownFields(size));
        }
    }
    let mut v = defaults;
    // SAFETY: `min(size, known)` bytes are readable at `p` (caller) and writable in `v`; T is
    // plain data, so any bytes the caller wrote for its fields make a valid value.
    unsafe {
        std::ptr::copy_nonoverlapping(
            p.cast::<u8>(),
            (&mut v as *mut T).cast::<u8>(),
            size.min(known),
        )
    };
    Ok(v)
}

/// Writes `v` into the caller's output struct, at most `(*p).size` bytes, keeping its `size`.
///
/// # Safety
/// `p` must point to `(*p).size` writable bytes starting with a readable `usize`; `T` is plain
/// data whose first field is that `usize`.
pub(crate) unsafe fn write<T: Copy>(p: *mut T, v: &T, min: usize) -> Result<(), SizeError> {
    // SAFETY: (caller) readable.
    let size = unsafe { size_field(p) };
    if size < min {
        return Err(SizeError::TooSmall(size));
    }
    let n = size.min(size_of::<T>());
    let skip = size_of::<usize>();
    // SAFETY: `skip..n` lies inside both `*v` and the caller's `size` writable bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(
            (v as *const T).cast::<u8>().add(skip),
            p.cast::<u8>().add(skip),
            n - skip,
        )
    };
    Ok(())
}
