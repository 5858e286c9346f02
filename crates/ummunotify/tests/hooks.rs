//! The hooks backend against the real kernel: every change kind hooks can see is invalidated
//! before the call returns, through libc and through glibc's internals; what they can not see
//! is shown as missed.
mod common;

use common::*;
use ummunotify::{Backend, Cookie, Notifier};

fn hooks() -> Notifier {
    let n = Notifier::with_backend(Backend::Hooks).expect("hooks backend");
    assert_eq!(n.backend(), Backend::Hooks);
    n
}

#[test]
fn libc_munmap_is_seen_before_it_returns() {
    let n = hooks();
    let p = page();
    let a = map(2 * p);
    let r = n.register(a..a + p, Cookie(1)).unwrap();
    let g = n.generation().unwrap();
    assert!(n.is_valid(r));
    unmap(a + p, p); // the neighbour: nothing registered
    assert!(n.is_valid(r));
    assert!(
        n.unchanged_since(g),
        "an unregistered munmap moved the counter"
    );
    unmap(a, p);
    assert!(!n.is_valid(r));
    assert!(!n.unchanged_since(g));
    let ev = n.events().unwrap();
    assert_eq!(ev.len(), 1);
    assert_eq!(ev[0].cookie, Cookie(1));
}
