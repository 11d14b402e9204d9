//! The flow hash of Maglev balancing, shared by the eBPF programs, the agent's userspace
//! backend and `proxy trace`, and equal to what nftables' `jhash` expression computes over the
//! same fields: the kernel's `jhash()` (Bob Jenkins' lookup3, `include/linux/jhash.h`) of the
//! words' little-endian bytes, scaled into the table with `reciprocal_scale` as
//! `nft_jhash_eval` does. One definition, so that every node and every backend that hashes a
//! flow the same way picks the same Maglev slot.
//!
//! Words are addresses and ports as the maps hold them (network byte order read as a native
//! `u32`; a port in the low 16 bits), which on a little-endian machine are exactly the bytes an
//! nftables register holds for `ip saddr` or `tcp sport` (a port register is zero-padded to 4
//! bytes).

/// `JHASH_INITVAL`.
const INITVAL: u32 = 0xdead_beef;

/// The seed every node uses for flow hashes, so that the same flow hashes the same everywhere.
pub const FLOW_SEED: u32 = 0x6b70_726d;

/// Seeds of the two hashes of an endpoint's name that give its Maglev offset and skip.
pub const OFFSET_SEED: u32 = 0x6d61_676f;
pub const SKIP_SEED: u32 = 0x6d61_6773;

#[inline(always)]
fn mix(a: &mut u32, b: &mut u32, c: &mut u32) {
    *a = a.wrapping_sub(*c);
    *a ^= c.rotate_left(4);
    *c = c.wrapping_add(*b);
    *b = b.wrapping_sub(*a);
    *b ^= a.rotate_left(6);
    *a = a.wrapping_add(*c);
    *c = c.wrapping_sub(*b);
    *c ^= b.rotate_left(8);
    *b = b.wrapping_add(*a);
    *a = a.wrapping_sub(*c);
    *a ^= c.rotate_left(16);
    *c = c.wrapping_add(*b);
    *b = b.wrapping_sub(*a);
    *b ^= a.rotate_left(19);
    *a = a.wrapping_add(*c);
    *c = c.wrapping_sub(*b);
    *c ^= b.rotate_left(4);
    *b = b.wrapping_add(*a);
}

#[inline(always)]
fn fin(a: &mut u32, b: &mut u32, c: &mut u32) {
    *c ^= *b;
    *c = c.wrapping_sub(b.rotate_left(14));
    *a ^= *c;
    *a = a.wrapping_sub(c.rotate_left(11));
    *b ^= *a;
    *b = b.wrapping_sub(a.rotate_left(25));
    *c ^= *b;
    *c = c.wrapping_sub(b.rotate_left(16));
    *a ^= *c;
    *a = a.wrapping_sub(c.rotate_left(4));
    *b ^= *a;
    *b = b.wrapping_sub(a.rotate_left(14));
    *c ^= *b;
    *c = c.wrapping_sub(b.rotate_left(24));
}

/// The kernel's `jhash(key, length, seed)` of `N` words (`4 * N` bytes, read little-endian).
/// A fixed-size array and a bounded loop, so the verifier accepts it in the eBPF programs.
#[inline(always)]
pub fn jhash_words<const N: usize>(words: &[u32; N], seed: u32) -> u32 {
    if N == 0 {
        return INITVAL.wrapping_add(seed);
    }
    let init = INITVAL.wrapping_add((4 * N) as u32).wrapping_add(seed);
    let (mut a, mut b, mut c) = (init, init, init);
    // lookup3 mixes whole 12-byte blocks while more than 12 bytes remain; the last 1..=3 words
    // are the tail, added without a mix and finished.
    let full = (N - 1) / 3;
    let mut i = 0;
    while i < full {
        a = a.wrapping_add(words[3 * i]);
        b = b.wrapping_add(words[3 * i + 1]);
        c = c.wrapping_add(words[3 * i + 2]);
        mix(&mut a, &mut b, &mut c);
        i += 1;
    }
    let rest = N - 3 * full;
    if rest >= 3 {
        c = c.wrapping_add(words[3 * full + 2]);
    }
    if rest >= 2 {
        b = b.wrapping_add(words[3 * full + 1]);
    }
    a = a.wrapping_add(words[3 * full]);
    fin(&mut a, &mut b, &mut c);
    c
}

/// The kernel's `jhash(key, length, seed)` of any bytes (endpoint names; not for eBPF).
pub fn jhash_bytes(key: &[u8], seed: u32) -> u32 {
    let init = INITVAL.wrapping_add(key.len() as u32).wrapping_add(seed);
    let (mut a, mut b, mut c) = (init, init, init);
    let mut k = key;
    let word = |s: &[u8], at: usize| -> u32 {
        let mut w = 0u32;
        let mut j = 0;
        while j < 4 && at + j < s.len() {
            w |= u32::from(s[at + j]) << (8 * j);
            j += 1;
        }
        w
    };
    while k.len() > 12 {
        a = a.wrapping_add(word(k, 0));
        b = b.wrapping_add(word(k, 4));
        c = c.wrapping_add(word(k, 8));
        mix(&mut a, &mut b, &mut c);
        k = &k[12..];
    }
    if k.is_empty() {
        return c;
    }
    // The tail's missing bytes count as zero, as the kernel's fall-through `switch` adds none.
    a = a.wrapping_add(word(k, 0));
    b = b.wrapping_add(word(k, 4));
    c = c.wrapping_add(word(k, 8));
    fin(&mut a, &mut b, &mut c);
    c
}

/// The flow hash of an IPv4 flow: `jhash ip saddr . ip daddr . th sport . th dport seed
/// FLOW_SEED` (addresses and ports in network byte order, as the maps hold them).
#[inline(always)]
pub fn flow_hash_v4(saddr: u32, daddr: u32, sport: u16, dport: u16) -> u32 {
    jhash_words(
        &[saddr, daddr, u32::from(sport), u32::from(dport)],
        FLOW_SEED,
    )
}

/// The flow hash of an IPv6 flow: `jhash ip6 saddr . ip6 daddr . th sport . th dport seed
/// FLOW_SEED`.
#[inline(always)]
pub fn flow_hash_v6(saddr: &[u32; 4], daddr: &[u32; 4], sport: u16, dport: u16) -> u32 {
    jhash_words(
        &[
            saddr[0],
            saddr[1],
            saddr[2],
            saddr[3],
            daddr[0],
            daddr[1],
            daddr[2],
            daddr[3],
            u32::from(sport),
            u32::from(dport),
        ],
        FLOW_SEED,
    )
}

/// The Maglev slot of a hash in a table of `size` slots: the kernel's `reciprocal_scale`, as
/// `nft_jhash_eval` maps a hash into `mod size` (a multiply and a shift, no division).
#[inline(always)]
pub fn slot_of(hash: u32, size: u32) -> u32 {
    ((u64::from(hash) * u64::from(size)) >> 32) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes_of(words: &[u32]) -> [u8; 64] {
        let mut out = [0u8; 64];
        for (i, w) in words.iter().enumerate() {
            out[4 * i..4 * i + 4].copy_from_slice(&w.to_le_bytes());
        }
        out
    }

    /// The word form (what the eBPF programs run) equals the byte form for every length the
    /// flow hashes use and around the 12-byte block boundaries.
    #[test]
    fn words_and_bytes_agree() {
        let w: [u32; 10] = [
            0x0100_000a,
            0x0a00_600a,
            0x5000,
            0x901f,
            7,
            8,
            9,
            10,
            11,
            12,
        ];
        let b = bytes_of(&w);
        assert_eq!(jhash_words(&[w[0]], 1), jhash_bytes(&b[..4], 1));
        assert_eq!(jhash_words(&[w[0], w[1]], 2), jhash_bytes(&b[..8], 2));
        assert_eq!(
            jhash_words(&[w[0], w[1], w[2]], 3),
            jhash_bytes(&b[..12], 3)
        );
        let four: [u32; 4] = [w[0], w[1], w[2], w[3]];
        assert_eq!(
            jhash_words(&four, FLOW_SEED),
            jhash_bytes(&b[..16], FLOW_SEED)
        );
        assert_eq!(jhash_words(&w, FLOW_SEED), jhash_bytes(&b[..40], FLOW_SEED));
    }

    /// lookup3's published check values (`hashlittle("", 0)` and "Four score and seven years
    /// ago" with seeds 0 and 1), which the kernel's `jhash` shares.
    #[test]
    fn matches_lookup3_reference_values() {
        assert_eq!(jhash_bytes(b"", 0), 0xdead_beef);
        assert_eq!(
            jhash_bytes(b"Four score and seven years ago", 0),
            0x1777_0551
        );
        assert_eq!(
            jhash_bytes(b"Four score and seven years ago", 1),
            0xcd62_8161
        );
    }

    #[test]
    fn slots_scale_into_the_table() {
        assert_eq!(slot_of(0, 16381), 0);
        assert_eq!(slot_of(u32::MAX, 16381), 16380);
        assert_eq!(slot_of(1 << 31, 7), 3);
    }
}
