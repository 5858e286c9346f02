//! Test support (work in progress).
