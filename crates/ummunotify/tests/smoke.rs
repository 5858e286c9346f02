use ummunotify::*;
#[test]
fn smoke() {
    let n = Notifier::new().unwrap();
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            8192,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    } as usize;
    unsafe { *(p as *mut u8) = 1 };
    let r = n.register(p..p + 8192, Cookie(1)).unwrap();
    let g = n.generation().unwrap();
    assert!(n.is_valid(r));
    assert!(n.unchanged_since(g));
    unsafe { libc::madvise(p as *mut _, 4096, libc::MADV_DONTNEED) };
    assert!(!n.is_valid(r));
    assert!(!n.unchanged_since(g));
    let ev = n.events().unwrap();
    println!("{ev:?}");
    assert_eq!(ev.len(), 1);
    let r2 = n.region(Cookie(1)).unwrap();
    assert!(n.is_valid(r2));
    unsafe { libc::munmap(p as *mut _, 8192) };
    assert!(!n.is_valid(r2));
    let ev = n.events().unwrap();
    println!("{ev:?} {:?}", n.stats());
    n.unregister(Cookie(1)).unwrap();
}
