//! `CookieTable`: cookie → region id, storing only the ids.
//!
//! Every region's slot already holds its cookie, so the table is an open-addressing array of
//! 32-bit slot ids (linear probing, backward-shift deletion, no tombstones) and compares cookies
//! by reading them from the slots through the caller's `cookie_of`. At most 3/4 full, growing by
//! half: 4/load bytes per region, 5.3–8 with 1,000,000 regions, against 16/load plus control
//! bytes for a `HashMap<u64, u32>`.
//!
//! Runs under the registry lock only (user threads), so it may allocate.

/// No id in this table position.
const EMPTY: u32 = u32::MAX;

/// Cookie → slot id, see the module documentation.
#[derive(Debug, Default)]
pub(crate) struct CookieTable {
    ids: Vec<u32>,
    len: usize,
    /// Changes with every change of `ids` (a [`Vacancy`] is valid only at its version).
    version: u64,
}

/// Where a cookie that is not in the table would go, while the table does not change: a
/// registration looks for its cookie once, to refuse a duplicate and to insert it (a search
/// for a missing cookie passes the ids of its run, each a read of its slot: see `home`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Vacancy {
    pos: usize,
    version: u64,
}

/// A 64-bit mix of the cookie (splitmix64's finaliser): cookies are often sequential.
pub(crate) fn mix(c: u64) -> u64 {
    let mut z = c.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A `HashMap` keyed by numbers that count up (the cache's own cookies, the hooks filter's
/// granules): the hash keeps a key's low bits as they are (the table's position: consecutive
/// keys go to neighbouring buckets, the lines the last insertion touched) and takes its top 7
/// (the table's tag byte) from [`mix`].
/// With `mix` alone each miss's insertion wrote two cold lines of the table, a visible share
/// of the miss after its kernel calls; SipHash cost about as much as the insertion (issue 23).
/// Keys that share their low bits (aligned addresses) would share a position: not for those.
pub(crate) type CookieMap<V> = std::collections::HashMap<u64, V, BuildMix>;

/// The [`CookieMap`] hasher's builder.
pub(crate) type BuildMix = std::hash::BuildHasherDefault<MixHasher>;

/// Hashes one `u64` for a [`CookieMap`] (other input is folded in byte by byte first).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct MixHasher(u64);

impl std::hash::Hasher for MixHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 ^= n;
    }

    fn finish(&self) -> u64 {
        const TAG: u64 = 0x7f << 57;
        (self.0 & !TAG) | (mix(self.0) & TAG)
    }
}

impl CookieTable {
    /// An empty table; allocates nothing.
    pub(crate) const fn new() -> Self {
        CookieTable {
            ids: Vec::new(),
            len: 0,
            version: 0,
        }
    }

    /// Number of cookies in the table.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Home position of `cookie` in a table of `cap` positions (`cap > 0`): Fibonacci hashing,
    /// the cookie times 2^64/φ, scaled to the table by its high bits.
    ///
    /// Not [`mix`]: a search for a missing cookie reads the slot of every id it passes, and a
    /// random home passes 2.5–8.5 of them at 1/2–3/4 full, each a cache miss after a kernel
    /// call (the cache's miss spent as long on it as on its index insertion: issue 23). The
    /// products of cookies in arithmetic progression — the cache's sequential ones, aligned
    /// addresses, indices shifted left — spread over the table like the golden-ratio sequence,
    /// almost never sharing a run: 0.1–0.9 occupied positions passed per insertion of 2,000 such
    /// cookies, against 2.6–3.6 with `mix`; random cookies are no worse off (3.3 against 3.5).
    /// The high bits depend on every bit of the cookie, so alignment does not matter. A pattern
    /// that defeats it (multiples of the multiplier's inverse) makes searches longer, never
    /// wrong; the cookies are the process's own.
    fn home(cookie: u64, cap: usize) -> usize {
        const FIB: u64 = 0x9e37_79b9_7f4a_7c15;
        ((u128::from(cookie.wrapping_mul(FIB)) * cap as u128) >> 64) as usize
    }

    /// The position holding `cookie`, or the empty one where it would go.
    fn probe(&self, cookie: u64, cookie_of: &impl Fn(u32) -> u64) -> Result<usize, usize> {
        let cap = self.ids.len();
        let mut i = Self::home(cookie, cap);
        loop {
            match self.ids[i] {
                EMPTY => return Err(i),
                id if cookie_of(id) == cookie => return Ok(i),
                _ => i = if i + 1 == cap { 0 } else { i + 1 },
            }
        }
    }

    /// The id registered under `cookie`.
    pub(crate) fn get(&self, cookie: u64, cookie_of: impl Fn(u32) -> u64) -> Option<u32> {
        if self.len == 0 {
            return None;
        }
        self.probe(cookie, &cookie_of).ok().map(|i| self.ids[i])
    }

    /// Adds `id`, whose slot already holds its cookie, which must not be in the table.
    pub(crate) fn insert(&mut self, id: u32, cookie_of: impl Fn(u32) -> u64) {
        debug_assert_ne!(id, EMPTY);
        if (self.len + 1) * 4 > self.ids.len() * 3 {
            self.grow(&cookie_of);
        }
        match self.probe(cookie_of(id), &cookie_of) {
            Err(i) => self.ids[i] = id,
            Ok(_) => debug_assert!(false, "cookie of {id} already in the table"),
        }
        self.len += 1;
        self.version += 1;
    }

    /// `Err(id)` when `cookie` is in the table (under `id`); else where it would go, the table
    /// grown first if one more would overfill it.
    pub(crate) fn vacancy(
        &mut self,
        cookie: u64,
        cookie_of: impl Fn(u32) -> u64,
    ) -> Result<Vacancy, u32> {
        if (self.len + 1) * 4 > self.ids.len() * 3 {
            self.grow(&cookie_of);
        }
        match self.probe(cookie, &cookie_of) {
            Ok(i) => Err(self.ids[i]),
            Err(pos) => Ok(Vacancy {
                pos,
                version: self.version,
            }),
        }
    }

    /// Adds `id`, whose slot holds the cookie `at` was found for: at `at`, or by a new search if
    /// the table changed since.
    pub(crate) fn insert_at(&mut self, at: Vacancy, id: u32, cookie_of: impl Fn(u32) -> u64) {
        if at.version != self.version {
            return self.insert(id, cookie_of);
        }
        debug_assert_ne!(id, EMPTY);
        debug_assert_eq!(self.ids[at.pos], EMPTY);
        debug_assert_eq!(self.probe(cookie_of(id), &cookie_of), Err(at.pos));
        self.ids[at.pos] = id;
        self.len += 1;
        self.version += 1;
    }

    /// Removes `cookie`; returns its id.
    pub(crate) fn remove(&mut self, cookie: u64, cookie_of: impl Fn(u32) -> u64) -> Option<u32> {
        if self.len == 0 {
            return None;
        }
        let mut hole = self.probe(cookie, &cookie_of).ok()?;
        let id = self.ids[hole];
        let cap = self.ids.len();
        // Backward-shift deletion: pull later members of the run into the hole when their home
        // does not lie (cyclically) between the hole and their position.
        let mut j = hole;
        loop {
            j = if j + 1 == cap { 0 } else { j + 1 };
            let other = self.ids[j];
            if other == EMPTY {
                break;
            }
            let home = Self::home(cookie_of(other), cap);
            let stays = if hole <= j {
                hole < home && home <= j
            } else {
                hole < home || home <= j
            };
            if !stays {
                self.ids[hole] = other;
                hole = j;
            }
        }
        self.ids[hole] = EMPTY;
        self.len -= 1;
        self.version += 1;
        Some(id)
    }

    /// Makes room for `additional` more cookies, so that inserting them allocates nothing.
    pub(crate) fn reserve(&mut self, additional: usize, cookie_of: impl Fn(u32) -> u64) {
        let need = self.len.saturating_add(additional);
        if need.saturating_mul(4) > self.ids.len().saturating_mul(3) {
            self.rehash(need.saturating_mul(4).div_ceil(3).max(16), &cookie_of);
        }
    }

    fn grow(&mut self, cookie_of: &impl Fn(u32) -> u64) {
        self.rehash((self.ids.len() + self.ids.len() / 2).max(16), cookie_of);
    }

    /// Moves every id into a table of `cap` positions.
    fn rehash(&mut self, cap: usize, cookie_of: &impl Fn(u32) -> u64) {
        self.version += 1;
        let old = std::mem::replace(&mut self.ids, vec![EMPTY; cap]);
        for id in old.into_iter().filter(|&id| id != EMPTY) {
            if let Err(i) = self.probe(cookie_of(id), cookie_of) {
                self.ids[i] = id;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn matches_a_hash_map() {
        // Slot id -> cookie, as the notifier's slots hold it.
        let mut cookies: Vec<u64> = Vec::new();
        let mut t = CookieTable::new();
        let mut model: HashMap<u64, u32> = HashMap::new();
        let mut free: Vec<u32> = Vec::new();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for step in 0..200_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Few distinct cookies, sequential and scattered, so runs collide and wrap.
            let c = if x & 1 == 0 {
                x % 3000
            } else {
                (x % 3000) << 40
            };
            let of = |id: u32| cookies[id as usize];
            match (x >> 60) % 3 {
                0 | 1 if !model.contains_key(&c) => {
                    assert_eq!(t.get(c, of), None);
                    // Half through a vacancy, as a registration does.
                    let vacancy = (x & 2 == 0).then(|| t.vacancy(c, of).expect("not in the table"));
                    let id = free.pop().unwrap_or(cookies.len() as u32);
                    if id as usize == cookies.len() {
                        cookies.push(c);
                    } else {
                        cookies[id as usize] = c;
                    }
                    match vacancy {
                        Some(v) => t.insert_at(v, id, |id| cookies[id as usize]),
                        None => t.insert(id, |id| cookies[id as usize]),
                    }
                    model.insert(c, id);
                }
                0 | 1 => {
                    let id = model[&c];
                    assert_eq!(t.vacancy(c, of).unwrap_err(), id, "step {step}");
                }
                _ => {
                    let want = model.remove(&c);
                    assert_eq!(t.remove(c, of), want, "step {step}");
                    if let Some(id) = want {
                        free.push(id);
                    }
                }
            }
            assert_eq!(t.len(), model.len());
            if step % 1000 == 0 {
                for (&c, &id) in &model {
                    assert_eq!(t.get(c, |id| cookies[id as usize]), Some(id));
                }
            }
        }
    }

    /// Occupied positions a search for `cookie` passes before its empty one.
    fn passed(t: &CookieTable, cookie: u64) -> usize {
        let cap = t.ids.len();
        let mut i = CookieTable::home(cookie, cap);
        let mut n = 0;
        while t.ids[i] != EMPTY {
            n += 1;
            i = (i + 1) % cap;
        }
        n
    }

    #[test]
    fn cookies_in_progression_rarely_share_a_run() {
        // The cache's cookies (sequential, top bit set), page addresses, shifted indices: the
        // searches that registration makes pass few other ids, each a read of a slot (`home`).
        type Pattern = (&'static str, fn(u64) -> u64);
        let patterns: [Pattern; 3] = [
            ("cache", |i| (1 << 63) | (i + 1)),
            ("pages", |i| 0x7f00_0000_0000 + i * 4096),
            ("shifted", |i| i << 40),
        ];
        for (name, cookie) in patterns {
            let cookies: Vec<u64> = (0..2000).map(cookie).collect();
            let mut t = CookieTable::new();
            let mut total = 0;
            for id in 0..2000u32 {
                let c = cookies[id as usize];
                t.vacancy(c, |id| cookies[id as usize])
                    .expect("a new cookie");
                total += passed(&t, c);
                t.insert(id, |id| cookies[id as usize]);
            }
            // A random home would pass about 3 per insertion here (2.6-3.6 measured).
            assert!(
                total < 2000,
                "{name}: {total} ids passed by 2,000 insertions"
            );
        }
    }

    #[test]
    fn a_stale_vacancy_is_searched_again() {
        let cookies: Vec<u64> = (0..100u64).collect();
        let of = |id: u32| cookies[id as usize];
        let mut t = CookieTable::new();
        let v = t.vacancy(0, of).unwrap();
        // Every other cookie inserted meanwhile: `v` may point at one of them now.
        for id in 1..100 {
            t.insert(id, of);
        }
        t.insert_at(v, 0, of);
        for id in 0..100 {
            assert_eq!(t.get(u64::from(id), of), Some(id));
        }
    }

    #[test]
    fn reserved_room_takes_inserts_without_growing() {
        let cookies: Vec<u64> = (0..1000u64).map(|i| i * 7919).collect();
        let mut t = CookieTable::new();
        t.insert(0, |id| cookies[id as usize]);
        t.reserve(999, |id| cookies[id as usize]);
        let cap = t.ids.len();
        for id in 1..1000u32 {
            t.insert(id, |id| cookies[id as usize]);
        }
        assert_eq!(
            t.ids.len(),
            cap,
            "an insert within the reserved room grew the table"
        );
        for (id, &c) in cookies.iter().enumerate() {
            assert_eq!(t.get(c, |id| cookies[id as usize]), Some(id as u32));
        }
    }
}
