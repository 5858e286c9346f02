//! ummunotify (work in progress).
#![deny(unsafe_code)]
