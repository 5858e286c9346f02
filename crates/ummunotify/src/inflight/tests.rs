use super::scan::*;
use super::signal::*;
use super::*;

/// A thread whose blocked set holds an alternate-stack handler's signal but not ours may be
/// inside that handler with its old mask: no signal for it. Ours blocked too, or neither: it
/// may be signalled. Read from this thread's own /proc status.
#[test]
fn a_thread_inside_an_unguarded_handler_is_not_signalled() {
    let tid = crate::sys::gettid();
    let (alrm, ours) = (libc::SIGALRM, libc::SIGRTMAX() - SIGNAL_OFFSET);
    let on_stack = 1u64 << (alrm - 1);
    let with = |sigs: &[i32], f: &mut dyn FnMut()| {
        // SAFETY: sets and restores this thread's own signal mask.
        unsafe {
            let (mut set, mut old): (libc::sigset_t, libc::sigset_t) =
                (std::mem::zeroed(), std::mem::zeroed());
            libc::sigemptyset(&mut set);
            for &s in sigs {
                libc::sigaddset(&mut set, s);
            }
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
            f();
            libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        }
    };
    with(&[alrm], &mut || {
        assert!(in_unguarded_handler(tid, on_stack, ours))
    });
    with(&[alrm, ours], &mut || {
        assert!(!in_unguarded_handler(tid, on_stack, ours))
    });
    with(&[], &mut || {
        assert!(!in_unguarded_handler(tid, on_stack, ours))
    });
    assert!(
        in_unguarded_handler(-1, on_stack, ours),
        "no such thread: unknown"
    );
    assert_eq!(&itoa_digits(1234567)[..8], b"1234567\0");
}

/// A live thread of this process that waits (in a futex, never running our handler) until
/// its sender is used or dropped: its tid, the release, the handle.
fn parked_thread() -> (
    i32,
    std::sync::mpsc::Sender<()>,
    std::thread::JoinHandle<()>,
) {
    let (tx, rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let t = std::thread::spawn(move || {
        tx.send(crate::sys::gettid()).unwrap();
        let _ = go_rx.recv();
    });
    (rx.recv().unwrap(), go_tx, t)
}

#[test]
fn member_sets_iterate_their_members() {
    let mut m = Members::default();
    for i in [0, 5, 63, 64, 200, 255] {
        m.add(i);
    }
    assert_eq!(m.iter().collect::<Vec<_>>(), vec![0, 5, 63, 64, 200, 255]);
    assert!(m.has(64) && !m.has(65));
    let mut o = Members::default();
    o.add(65);
    m.union(&o);
    assert!(m.has(65));
}

#[test]
fn an_entry_blocks_until_resolved_and_acknowledged() {
    let mut f = InFlight::default();
    f.record(0x1000, 0x2000, false);
    assert!(f.overlaps(0x1800, 0x1900) && !f.overlaps(0x2000, 0x3000));
    assert!(f.unresolved(0x1000, 0x2000));
    // Unresolved entries never end by a sweep.
    assert!(!f.sweep());
    // A resolving scan that found nobody in the call: the sender is done.
    let h = InFlight::horizon();
    let _ = f.resolve(h, &[], false);
    assert!(f.sweep());
    assert!(f.is_empty());
    assert_eq!(f.confirmed, 1);
}

#[test]
fn a_member_seen_out_of_the_call_later_stops_holding_its_entry() {
    // A live thread that never runs our handler (signals are not sent in this test).
    let (tid, stop_tx, t) = parked_thread();
    let mut f = InFlight::default();
    let ticket = f.record_fresh(0x1000, 0x2000);
    let h = InFlight::horizon();
    assert!(h >= ticket);
    let member = Candidate {
        tid,
        start: 0,
        end: u64::MAX,
        io_worker: false,
    };
    let _ = f.resolve(h, &[member], false);
    // Named, alive, not acknowledged: it holds the window.
    assert!(!f.sweep() && f.overlaps(0x1000, 0x2000));
    // A later scan that could not list everyone proves nothing.
    f.narrow(InFlight::horizon(), &[], true);
    assert!(!f.sweep());
    // One that lists it still (running, or in madvise over the range) keeps it a member.
    f.narrow(InFlight::horizon(), &[member], false);
    assert!(!f.sweep());
    // In madvise over another range: out of the call that was in the window.
    let elsewhere = Candidate {
        start: 0x9000,
        end: 0xa000,
        ..member
    };
    f.narrow(InFlight::horizon(), &[elsewhere], false);
    assert!(f.sweep());
    assert!(f.is_empty());
    assert_eq!((f.fresh_confirmed, f.confirmed), (1, 0));
    stop_tx.send(()).unwrap();
    t.join().unwrap();
}

#[test]
fn a_full_table_merges_instead_of_dropping() {
    let mut f = InFlight::default();
    for i in 0..ENTRIES as u64 + 3 {
        f.record(i * 0x1000, i * 0x1000 + 0x1000, false);
    }
    assert_eq!(f.len(), ENTRIES);
    assert_eq!(f.merged, 3);
    // The merged entry covers every range that went into it.
    let last = ENTRIES as u64 + 2;
    assert!(f.overlaps(last * 0x1000, last * 0x1000 + 1));
}

#[test]
fn reads_the_flags_of_proc_stat_lines() {
    let line = b"4242 (iou-wrk-4) x) S 1 4242 4242 0 -1 4194368 0 0 0 0 0 0\n";
    assert_eq!(stat_flags(line), Some(4194368));
    assert_eq!(stat_flags(line).unwrap() & PF_IO_WORKER, 0);
    assert_eq!(stat_flags(b"7 (a) R 1 7 7 0 -1 2097232 1"), Some(2097232));
    assert_eq!(stat_flags(b"7 (a) R 1"), None);
    assert_eq!(
        stat_state(b"57 (iou-wrk-54) S 1 1 1 0 -1 4194320"),
        Some(b'S')
    );
    assert_eq!(stat_state(b"7 (a) b) D 1"), Some(b'D'));
    assert_eq!(stat_state(b"7 (a"), None);
    // Our own thread is no io_uring worker; a worker of a ring we drive is one.
    let dir = c"/proc/self/task";
    // SAFETY: opens a directory read-only; closed below.
    let dfd = unsafe { libc::open(dir.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY) };
    assert!(dfd >= 0);
    let me = crate::sys::gettid().to_string();
    assert!(!is_io_worker(dfd, me.as_bytes()));
    // SAFETY: our own fd.
    unsafe { libc::close(dfd) };
}

#[test]
fn a_task_file_of_a_thread_that_is_gone_reads_dead() {
    let (tid, go_tx, t) = parked_thread();
    let path = std::ffi::CString::new(format!("/proc/self/task/{tid}/syscall")).unwrap();
    // SAFETY: a NUL-terminated path; closed below.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    assert!(fd >= 0);
    assert!(task_file_live(fd));
    go_tx.send(()).unwrap();
    t.join().unwrap();
    // join returns when the kernel cleared the thread's tid word, a little before the thread
    // is released: look again for a while.
    let dead = (0..1000).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(1));
        !task_file_live(fd)
    });
    assert!(dead, "the file of an exited thread still reads live");
    // SAFETY: our own fd.
    unsafe { libc::close(fd) };
}

#[test]
fn parses_proc_syscall_lines() {
    let c = parse_syscall(
        b"28 0x7f1234560000 0x4000 0x4 0x0 0x0 0x0 0x7ffd1 0x7f2\n",
        7,
    );
    assert_eq!(
        c,
        Some(Candidate {
            tid: 7,
            start: 0x7f1234560000,
            end: 0x7f1234564000,
            io_worker: false,
        })
    );
    assert_eq!(parse_syscall(b"running\n", 7), None);
    assert_eq!(parse_syscall(b"-1 0x7ffd 0x7f\n", 7), None);
    assert_eq!(parse_syscall(b"0 0x3 0x7f 0x10 0 0 0 0x1 0x2\n", 7), None);
    assert_eq!(
        parse_syscall(b"440 0x3 0x7f 0x1 0x4 0x0 0x0 0x1 0x2\n", 9).map(|c| (c.start, c.end)),
        Some((0, u64::MAX))
    );
}
