//! Misses for `strace -c -f` and `bench/miss_instructions.sh`: N cache misses (no-op registrar),
//! one every other page, in rising address order (as `umn bench`'s misses), or with `random`
//! after N in an order shuffled by a fixed seed (new regions amid the others: no search can
//! be skipped). It exits without tearing the cache down, so what it costs is the misses.
use ummunotify::cache::{Cache, Config};
use ummunotify::registrar::NoopRegistrar;

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2000);
    let random = std::env::args().nth(2).is_some_and(|a| a == "random");
    let mut order: Vec<usize> = (0..n).collect();
    if random {
        // Fisher-Yates with xorshift64: the same order on every run.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for i in (1..n).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            order.swap(i, (x % (i as u64 + 1)) as usize);
        }
    }
    let pg = 4096;
    // SAFETY: a fresh anonymous mapping.
    let arena = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            2 * n * pg,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    } as usize;
    let cache = Cache::new(NoopRegistrar, Config::default().max_regions(1 << 21)).unwrap();
    let t = std::time::Instant::now();
    for &i in &order {
        drop(cache.get(arena + 2 * i * pg, pg).unwrap());
    }
    eprintln!(
        "{:.0} ns per miss",
        t.elapsed().as_nanos() as f64 / n as f64
    );
    std::process::exit(0);
}
