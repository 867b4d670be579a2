//! Counter-based randomness: no state, so any draw can be computed
//! directly, and seeded permutations of `0..n` in O(1) memory.

/// SplitMix64's finaliser: a bijective 64-bit mixer with good avalanche.
#[inline]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// 64 random bits for draw `k` of `epoch` under `seed`.
#[inline]
pub fn draw_bits(seed: u64, epoch: u64, k: u64) -> u64 {
    let stream = mix64(seed ^ 0x9e37_79b9_7f4a_7c15)
        .wrapping_add(mix64(epoch.wrapping_add(0x632b_e59b_d9b4_e019)));
    mix64(mix64(stream ^ k.wrapping_mul(0xd1b5_4a32_d192_ed03)).wrapping_add(k))
}

/// A seed of its own for the stream named `name` under `seed` (a mixture's
/// group, by its value).
pub fn mix_key(seed: u64, name: &[u8]) -> u64 {
    // FNV-1a, then mixed with the seed
    let h = name.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    mix64(seed ^ mix64(h ^ 0x6d69_7874_7572_6521))
}

/// A uniform float in [0, 1) from 53 of the given bits.
#[inline]
pub fn unit_f64(bits: u64) -> f64 {
    (bits >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// A seeded bijection of `0..n`: a 4-round Feistel network on the smallest
/// even-bit domain that holds `n`, with cycle walking. O(1) memory.
#[derive(Debug, Clone)]
pub struct Permutation {
    n: u64,
    half_bits: u32,
    mask: u64,
    keys: [u64; 4],
}

impl Permutation {
    pub fn new(n: u64, key: u64) -> Permutation {
        let bits = 64 - n.saturating_sub(1).leading_zeros();
        let half_bits = bits.div_ceil(2);
        let mut keys = [0u64; 4];
        for (i, k) in keys.iter_mut().enumerate() {
            *k = mix64(key ^ (0xa076_1d64_78bd_642f_u64.wrapping_mul(i as u64 + 1)));
        }
        Permutation {
            n,
            half_bits,
            mask: (1u64 << half_bits) - 1,
            keys,
        }
    }

    fn round_trip(&self, x: u64) -> u64 {
        let h = self.half_bits;
        let (mut l, mut r) = (x >> h, x & self.mask);
        for k in self.keys {
            let t = l ^ (mix64(r ^ k) & self.mask);
            l = r;
            r = t;
        }
        (l << h) | r
    }

    /// The image of `i < n`.
    pub fn apply(&self, i: u64) -> u64 {
        debug_assert!(i < self.n);
        let mut x = i;
        loop {
            x = self.round_trip(x);
            if x < self.n {
                return x;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_are_pure_and_streams_differ() {
        assert_eq!(draw_bits(7, 0, 5), draw_bits(7, 0, 5));
        assert_ne!(draw_bits(7, 0, 5), draw_bits(7, 1, 5));
        assert_ne!(draw_bits(7, 0, 5), draw_bits(8, 0, 5));
        assert_ne!(draw_bits(7, 0, 5), draw_bits(7, 0, 6));
    }

    #[test]
    fn unit_floats_are_uniform_enough() {
        let n = 200_000u64;
        let mut buckets = [0u32; 10];
        for k in 0..n {
            let u = unit_f64(draw_bits(1, 2, k));
            assert!((0.0..1.0).contains(&u));
            buckets[(u * 10.0) as usize] += 1;
        }
        // each bucket expects 20,000 with sd ~134; 6 sd bounds
        for b in buckets {
            assert!((19_200..=20_800).contains(&b), "{buckets:?}");
        }
    }
}
