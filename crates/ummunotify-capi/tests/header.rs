//! The committed `include/ummunotify.h` must be what the pinned cbindgen generates from the
//! current source: CI fails when someone changes the C API without regenerating the header.
//!
//! Regenerate with `UMMUNOTIFY_BLESS=1 cargo test -p ummunotify-capi --test header`.
use std::path::Path;

#[test]
fn header_is_current() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let committed_path = crate_dir.join("../../include/ummunotify.h");
    let config =
        cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("read cbindgen.toml");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen failed")
        .write(&mut generated);
    let generated = String::from_utf8(generated).expect("header is UTF-8");
    if std::env::var_os("UMMUNOTIFY_BLESS").is_some() {
        std::fs::write(&committed_path, &generated).expect("write include/ummunotify.h");
        return;
    }
    let committed = std::fs::read_to_string(&committed_path).unwrap_or_default();
    assert!(
        committed == generated,
        "include/ummunotify.h is stale: regenerate it with \
         `UMMUNOTIFY_BLESS=1 cargo test -p ummunotify-capi --test header` and commit it"
    );
}
