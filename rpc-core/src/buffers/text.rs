//! Received bytes as text: a peer's metadata keys and ASCII values, checked once when they
//! arrive, are read as `&str` many times after.

/// `bytes` as a `str` when every byte is ASCII (below 0x80), else `None`. Eight bytes per step:
/// a short value costs a few instructions where `std::str::from_utf8`'s general check costs
/// several per byte (about 138 instructions for a 15-byte value, by callgrind).
#[inline]
pub(crate) fn ascii_str(bytes: &[u8]) -> Option<&str> {
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let word = |w: &[u8]| {
        let mut b = [0u8; 8];
        b.copy_from_slice(w);
        u64::from_le_bytes(b)
    };
    let mut high = 0u64;
    let mut words = bytes.chunks_exact(8);
    for w in &mut words {
        high |= word(w);
    }
    let rest = words.remainder();
    if bytes.len() >= 8 {
        // The last 8 bytes as one word (overlapping the words before it).
        high |= word(&bytes[bytes.len() - 8..]);
    } else {
        for &b in rest {
            high |= u64::from(b);
        }
    }
    if high & HIGH != 0 {
        return None;
    }
    // SAFETY: every byte of `bytes` is below 0x80 (the high bit of every byte of every word,
    // and of every remaining byte, is clear, checked just above), and a sequence of ASCII
    // bytes is valid UTF-8.
    Some(unsafe { std::str::from_utf8_unchecked(bytes) })
}

#[cfg(test)]
mod tests {
    use super::ascii_str;

    #[test]
    fn ascii_str_takes_exactly_what_is_ascii() {
        // Every byte value at every position of every length up to 20: the word part, the
        // remainder, and both.
        for len in 1..=20 {
            for at in 0..len {
                for b in 0..=255u8 {
                    let mut v = vec![b'a'; len];
                    v[at] = b;
                    let got = ascii_str(&v);
                    if b.is_ascii() {
                        assert_eq!(got, std::str::from_utf8(&v).ok(), "len {len} at {at} byte {b:#x}");
                    } else {
                        assert_eq!(got, None, "len {len} at {at} byte {b:#x}");
                    }
                }
            }
        }
        assert_eq!(ascii_str(b""), Some(""));
        // Valid UTF-8 that is not ASCII is refused too.
        assert_eq!(ascii_str("é".as_bytes()), None);
    }
}
