//! The region index, page coverage and event coalescing against a naive model
//! (`ummunotify::__fuzz::run`). Corpus: `fuzz/corpus/region_index`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ummunotify::__fuzz::run(data);
});
