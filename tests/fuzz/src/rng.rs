//! A seeded generator with no dependency: SplitMix64. The same seed and case number give the same
//! input on every machine and every build.

/// SplitMix64 (Steele, Lea and Flood): tiny, fast, and good enough to pick mutations.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// The generator of case `case` of a run seeded with `seed`. Cases are independent, so any
    /// one of them can be regenerated without the ones before it (`--seed S --case N`).
    pub fn for_case(seed: u64, case: u64) -> Self {
        let mut mix = Self(seed ^ case.wrapping_mul(0xD1B5_4A32_D192_ED03));
        Self(mix.next_u64())
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }

    /// A number in `lo..=hi`.
    pub fn between(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo + 1)
    }

    /// True once in `n` times.
    pub fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }

    /// True `p` times in a hundred.
    pub fn percent(&mut self, p: usize) -> bool {
        self.below(100) < p
    }

    /// One of `items`, which must not be empty.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    /// A count of items: usually none to a few, sometimes dozens, rarely hundreds.
    pub fn count(&mut self) -> usize {
        match self.below(40) {
            0..=9 => 0,
            10..=21 => 1,
            22..=33 => self.between(2, 4),
            34..=38 => self.between(5, 40),
            _ => self.between(100, 600),
        }
    }
}
