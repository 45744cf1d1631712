//! TensorFlow's string fingerprint: `Fingerprint64`, which is FarmHash's
//! `farmhashna::Hash64` (farmhash.cc, "farmhashna"), and `StringToHashBucketFast`.
//!
//! Written from FarmHash's reference C++ line by line; every multiplication and addition wraps
//! as C++'s uint64_t arithmetic does. Checked against golden values produced by TensorFlow
//! 2.18.1 (`fixtures/golden/hash_fingerprint64.json`, made by `fixtures/gen/golden_hash.py`).

use std::num::NonZeroU64;

const K0: u64 = 0xc3a5_c85c_97cb_3127;
const K1: u64 = 0xb492_b66f_be98_f273;
const K2: u64 = 0x9ae1_6a3b_2f90_404f;

#[inline]
fn fetch64(s: &[u8], i: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&s[i..i + 8]);
    u64::from_le_bytes(b)
}

#[inline]
fn fetch32(s: &[u8], i: usize) -> u64 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&s[i..i + 4]);
    u64::from(u32::from_le_bytes(b))
}

#[inline]
fn shift_mix(v: u64) -> u64 {
    v ^ (v >> 47)
}

#[inline]
fn hash_len16(u: u64, v: u64, mul: u64) -> u64 {
    let mut a = (u ^ v).wrapping_mul(mul);
    a ^= a >> 47;
    let mut b = (v ^ a).wrapping_mul(mul);
    b ^= b >> 47;
    b.wrapping_mul(mul)
}

fn hash_len_0_to_16(s: &[u8]) -> u64 {
    let len = s.len();
    let len64 = len as u64;
    if len >= 8 {
        let mul = K2.wrapping_add(len64.wrapping_mul(2));
        let a = fetch64(s, 0).wrapping_add(K2);
        let b = fetch64(s, len - 8);
        let c = b.rotate_right(37).wrapping_mul(mul).wrapping_add(a);
        let d = a.rotate_right(25).wrapping_add(b).wrapping_mul(mul);
        return hash_len16(c, d, mul);
    }
    if len >= 4 {
        let mul = K2.wrapping_add(len64.wrapping_mul(2));
        let a = fetch32(s, 0);
        return hash_len16(len64.wrapping_add(a << 3), fetch32(s, len - 4), mul);
    }
    if len > 0 {
        let a = u32::from(s[0]);
        let b = u32::from(s[len >> 1]);
        let c = u32::from(s[len - 1]);
        // uint32_t arithmetic in the reference, widened only for the multiplications.
        let y = a.wrapping_add(b << 8);
        // len < 4 here, so the conversion cannot fail.
        let len32 = u32::try_from(len).unwrap_or(u32::MAX);
        let z = len32.wrapping_add(c << 2);
        return shift_mix(u64::from(y).wrapping_mul(K2) ^ u64::from(z).wrapping_mul(K0))
            .wrapping_mul(K2);
    }
    K2
}

fn hash_len_17_to_32(s: &[u8]) -> u64 {
    let len = s.len();
    let mul = K2.wrapping_add((len as u64).wrapping_mul(2));
    let a = fetch64(s, 0).wrapping_mul(K1);
    let b = fetch64(s, 8);
    let c = fetch64(s, len - 8).wrapping_mul(mul);
    let d = fetch64(s, len - 16).wrapping_mul(K2);
    hash_len16(
        a.wrapping_add(b)
            .rotate_right(43)
            .wrapping_add(c.rotate_right(30))
            .wrapping_add(d),
        a.wrapping_add(b.wrapping_add(K2).rotate_right(18))
            .wrapping_add(c),
        mul,
    )
}

fn hash_len_33_to_64(s: &[u8]) -> u64 {
    let len = s.len();
    let mul = K2.wrapping_add((len as u64).wrapping_mul(2));
    let a = fetch64(s, 0).wrapping_mul(K2);
    let b = fetch64(s, 8);
    let c = fetch64(s, len - 8).wrapping_mul(mul);
    let d = fetch64(s, len - 16).wrapping_mul(K2);
    let y = a
        .wrapping_add(b)
        .rotate_right(43)
        .wrapping_add(c.rotate_right(30))
        .wrapping_add(d);
    let z = hash_len16(
        y,
        a.wrapping_add(b.wrapping_add(K2).rotate_right(18))
            .wrapping_add(c),
        mul,
    );
    let e = fetch64(s, 16).wrapping_mul(mul);
    let f = fetch64(s, 24);
    let g = y.wrapping_add(fetch64(s, len - 32)).wrapping_mul(mul);
    let h = z.wrapping_add(fetch64(s, len - 24)).wrapping_mul(mul);
    hash_len16(
        e.wrapping_add(f)
            .rotate_right(43)
            .wrapping_add(g.rotate_right(30))
            .wrapping_add(h),
        e.wrapping_add(f.wrapping_add(a).rotate_right(18))
            .wrapping_add(g),
        mul,
    )
}

/// FarmHash's `WeakHashLen32WithSeeds` over `s[i..i + 32]`.
#[inline]
fn weak_hash_len32_with_seeds(s: &[u8], i: usize, a: u64, b: u64) -> (u64, u64) {
    let w = fetch64(s, i);
    let x = fetch64(s, i + 8);
    let y = fetch64(s, i + 16);
    let z = fetch64(s, i + 24);
    let mut a = a.wrapping_add(w);
    let mut b = b.wrapping_add(a).wrapping_add(z).rotate_right(21);
    let c = a;
    a = a.wrapping_add(x).wrapping_add(y);
    b = b.wrapping_add(a.rotate_right(44));
    (a.wrapping_add(z), b.wrapping_add(c))
}

/// TensorFlow's `Fingerprint64(s)` (FarmHash `farmhashna::Hash64`), stable across platforms
/// and releases.
pub fn fingerprint64(s: &[u8]) -> u64 {
    let len = s.len();
    if len <= 16 {
        return hash_len_0_to_16(s);
    }
    if len <= 32 {
        return hash_len_17_to_32(s);
    }
    if len <= 64 {
        return hash_len_33_to_64(s);
    }

    const SEED: u64 = 81;
    let mut x = SEED;
    let mut y = SEED.wrapping_mul(K1).wrapping_add(113);
    let mut z = shift_mix(y.wrapping_mul(K2).wrapping_add(113)).wrapping_mul(K2);
    let mut v = (0u64, 0u64);
    let mut w = (0u64, 0u64);
    x = x.wrapping_mul(K2).wrapping_add(fetch64(s, 0));

    // The loop takes 64-byte blocks while more than 64 bytes remain after them, so that the
    // final step always sees 1 to 64 new bytes; it then rereads the last 64 bytes.
    let end = ((len - 1) / 64) * 64;
    let last64 = len - 64;
    let mut i = 0;
    loop {
        x = x
            .wrapping_add(y)
            .wrapping_add(v.0)
            .wrapping_add(fetch64(s, i + 8))
            .rotate_right(37)
            .wrapping_mul(K1);
        y = y
            .wrapping_add(v.1)
            .wrapping_add(fetch64(s, i + 48))
            .rotate_right(42)
            .wrapping_mul(K1);
        x ^= w.1;
        y = y.wrapping_add(v.0).wrapping_add(fetch64(s, i + 40));
        z = z.wrapping_add(w.0).rotate_right(33).wrapping_mul(K1);
        v = weak_hash_len32_with_seeds(s, i, v.1.wrapping_mul(K1), x.wrapping_add(w.0));
        w = weak_hash_len32_with_seeds(
            s,
            i + 32,
            z.wrapping_add(w.1),
            y.wrapping_add(fetch64(s, i + 16)),
        );
        std::mem::swap(&mut z, &mut x);
        i += 64;
        if i == end {
            break;
        }
    }
    let mul = K1.wrapping_add((z & 0xff) << 1);
    let i = last64;
    w.0 = w.0.wrapping_add(((len - 1) & 63) as u64);
    v.0 = v.0.wrapping_add(w.0);
    w.0 = w.0.wrapping_add(v.0);
    x = x
        .wrapping_add(y)
        .wrapping_add(v.0)
        .wrapping_add(fetch64(s, i + 8))
        .rotate_right(37)
        .wrapping_mul(mul);
    y = y
        .wrapping_add(v.1)
        .wrapping_add(fetch64(s, i + 48))
        .rotate_right(42)
        .wrapping_mul(mul);
    x ^= w.1.wrapping_mul(9);
    y = y
        .wrapping_add(v.0.wrapping_mul(9))
        .wrapping_add(fetch64(s, i + 40));
    z = z.wrapping_add(w.0).rotate_right(33).wrapping_mul(mul);
    v = weak_hash_len32_with_seeds(s, i, v.1.wrapping_mul(mul), x.wrapping_add(w.0));
    w = weak_hash_len32_with_seeds(
        s,
        i + 32,
        z.wrapping_add(w.1),
        y.wrapping_add(fetch64(s, i + 16)),
    );
    std::mem::swap(&mut z, &mut x);
    hash_len16(
        hash_len16(v.0, w.0, mul)
            .wrapping_add(shift_mix(y).wrapping_mul(K0))
            .wrapping_add(z),
        hash_len16(v.1, w.1, mul).wrapping_add(x),
        mul,
    )
}

/// `StringToHashBucketFast`: `Fingerprint64(s) % num_buckets`. TensorFlow's attribute is an
/// int64 >= 1, so every bucket fits in an int64.
pub fn to_hash_bucket_fast(s: &[u8], num_buckets: NonZeroU64) -> u64 {
    fingerprint64(s) % num_buckets.get()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The golden file: TensorFlow 2.18.1's `tf.strings.to_hash_bucket_fast` over the
    /// prefixes (lengths 0..=300) of four 300-byte buffers, written by
    /// `fixtures/gen/golden_hash.py` (which rebuilds the full 64-bit fingerprint from the
    /// buckets for 2**63 - 1 and 3 and checks it against every other bucket count).
    fn golden() -> serde_json::Value {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../fixtures/golden/hash_fingerprint64.json"
        );
        let text = std::fs::read_to_string(path).expect("golden file is committed");
        serde_json::from_str(&text).expect("golden file is JSON")
    }

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
            .collect()
    }

    #[test]
    fn fingerprint64_matches_tensorflow_on_every_golden_case() {
        let golden = golden();
        let num_buckets: Vec<NonZeroU64> = golden["num_buckets"]
            .as_array()
            .expect("num_buckets")
            .iter()
            .map(|n| NonZeroU64::new(n.as_u64().expect("u64")).expect("nonzero"))
            .collect();
        let buffers = golden["buffers"].as_object().expect("buffers");
        let cases = golden["cases"].as_array().expect("cases");
        assert_eq!(cases.len(), 4 * 301, "every length 0..=300 of four buffers");
        let mut lengths_seen = std::collections::BTreeSet::new();
        for case in cases {
            let name = case[0].as_str().expect("buffer name");
            let len = usize::try_from(case[1].as_u64().expect("length")).expect("small");
            let expected = case[2].as_u64().expect("fingerprint");
            let input = &unhex(buffers[name].as_str().expect("hex buffer"))[..len];
            let got = fingerprint64(input);
            assert_eq!(
                got, expected,
                "first mismatch: Fingerprint64 of {name}[..{len}] = {input:02x?}"
            );
            let buckets = case[3].as_array().expect("buckets");
            for (n, want) in num_buckets.iter().zip(buckets) {
                assert_eq!(
                    to_hash_bucket_fast(input, *n),
                    want.as_u64().expect("bucket"),
                    "first mismatch: bucket of {name}[..{len}] with num_buckets {n}"
                );
            }
            lengths_seen.insert(len);
        }
        for len in [
            0, 1, 3, 4, 8, 16, 17, 32, 33, 64, 65, 128, 129, 192, 256, 300,
        ] {
            assert!(lengths_seen.contains(&len), "length {len} covered");
        }
    }

    #[test]
    fn empty_string_is_farmhash_k2() {
        // farmhashna::HashLen0to16 returns k2 for an empty input.
        assert_eq!(fingerprint64(b""), K2);
    }

    proptest! {
        #[test]
        fn any_length_hashes_without_panicking(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let fp = fingerprint64(&bytes);
            let n = NonZeroU64::new(1000).expect("nonzero");
            prop_assert_eq!(to_hash_bucket_fast(&bytes, n), fp % 1000);
        }
    }
}
