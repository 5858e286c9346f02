//! Links `libummunotify.so` as a C library is expected to be: SONAME `libummunotify.so.<major>`
//! and a linker version script (`libummunotify.map`) that exports only `ummunotify_*` symbols.
fn main() {
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").expect("cargo sets it");
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it");
    println!("cargo:rerun-if-changed=libummunotify.map");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libummunotify.so.{major}");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={dir}/libummunotify.map");
}
