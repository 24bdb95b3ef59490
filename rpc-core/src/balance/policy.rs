//! How a balanced channel picks a server: the policies and the hash ring.

use std::net::SocketAddr;

/// How a balanced channel picks the server of each call among the servers that are up
/// (connected and not marked down or not serving).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Policy {
    /// Each call to the next server in turn (one shared counter).
    RoundRobin,
    /// Two servers drawn at random; the call goes to the less loaded one. The load of a server
    /// is what it reported on its last response (protocol 8: its requests admitted and not yet
    /// answered, over all its clients) while that report is fresh
    /// ([`super::BalanceConfig::load_fresh`], 1 s), else the calls this client has in flight on it;
    /// [`super::Balancer::report_load`] overrides both with a load from elsewhere.
    PowerOfTwoChoices,
    /// A ring of `vnodes` points per server (hashes of the server's address and the point's
    /// number); a call's key ([`crate::CallOptions::with_key`]) goes to the first point at or
    /// after its hash whose server is up, so a key stays on its server while that one is up,
    /// and when a server comes or goes only about 1/n of the keys move. A call without a key
    /// is picked round robin. `vnodes`: 1 ..= 4096 (0 is taken as 1, more as 4096); 100 to
    /// 200 keep the servers' shares within a few percent.
    ConsistentHash {
        /// Points per server on the ring.
        vnodes: u32,
    },
}

impl Default for Policy {
    /// [`Policy::RoundRobin`].
    fn default() -> Self {
        Policy::RoundRobin
    }
}

/// A mixing step (splitmix64's finalizer): spreads a key's bits over the ring.
#[inline]
pub(crate) fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// FNV-1a over bytes: a stable hash of a server's address (the same in every process and
/// build, so every client puts a server at the same points).
fn fnv(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The hash ring: `(point, server index)` sorted by point.
#[derive(Debug, Default)]
pub(crate) struct Ring {
    points: Vec<(u64, u32)>,
}

impl Ring {
    /// `vnodes` points per server of `servers` (indexes into that slice).
    pub(crate) fn new(servers: &[SocketAddr], vnodes: u32) -> Ring {
        let vnodes = vnodes.clamp(1, 4096);
        let mut points = Vec::with_capacity(servers.len() * vnodes as usize);
        for (i, a) in servers.iter().enumerate() {
            let base = fnv(a.to_string().as_bytes());
            for v in 0..vnodes {
                points.push((mix(base ^ mix(u64::from(v))), i as u32));
            }
        }
        points.sort_unstable();
        Ring { points }
    }

    /// The servers in ring order from `key`'s point on (each point once, wrapping).
    pub(crate) fn walk(&self, key: u64) -> impl Iterator<Item = usize> + '_ {
        let h = mix(key);
        let start = self.points.partition_point(|p| p.0 < h);
        let n = self.points.len();
        (0..n).map(move |i| self.points[(start + i) % n].1 as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn servers(n: u16) -> Vec<SocketAddr> {
        (0..n).map(|i| SocketAddr::from(([10, 0, 0, 1], 7000 + i))).collect()
    }

    /// The first server of each of `keys` keys.
    fn owners(ring: &Ring, keys: u64, up: impl Fn(usize) -> bool) -> Vec<usize> {
        (0..keys).map(|k| ring.walk(k).find(|&s| up(s)).unwrap()).collect()
    }

    #[test]
    fn shares_are_even_within_a_fifth() {
        let ring = Ring::new(&servers(4), 160);
        let mut count = [0u32; 4];
        for s in owners(&ring, 40_000, |_| true) {
            count[s] += 1;
        }
        for c in count {
            assert!((8_000..=12_000).contains(&c), "uneven shares {count:?}");
        }
    }

    #[test]
    fn a_server_down_moves_only_its_keys() {
        let ring = Ring::new(&servers(4), 160);
        let before = owners(&ring, 10_000, |_| true);
        let after = owners(&ring, 10_000, |s| s != 2);
        for (b, a) in before.iter().zip(&after) {
            if *b != 2 {
                assert_eq!(a, b, "a key of a server still up moved");
            } else {
                assert_ne!(*a, 2);
            }
        }
        assert!(before.contains(&2));
    }

    #[test]
    fn the_ring_is_the_same_for_the_same_servers() {
        let a = Ring::new(&servers(3), 50);
        let b = Ring::new(&servers(3), 50);
        assert_eq!(a.points, b.points);
        assert_eq!(a.points.len(), 150);
    }
}
