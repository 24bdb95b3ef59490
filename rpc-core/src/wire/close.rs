//! Why a session closes: the status and reason a [`super::Kind::Close`] carries.
//!
//! A Close may carry, like an error response, a status code in the header's `status` byte (gRPC
//! canonical; 0 means none given, read as UNAVAILABLE) and an eager body: the reason, at most
//! [`MAX_CLOSE_REASON`] bytes of UTF-8 text (never in the ring, never in pieces). A server sends
//! one when it closes a session over a cap (RESOURCE_EXHAUSTED naming the configuration field
//! and its value), for a protocol violation (INTERNAL), when idle (UNAVAILABLE) or at shutdown.
//!
//! The reason is the peer's text: [`close_reason`] reads it as untrusted (at most
//! [`MAX_CLOSE_REASON`] bytes, lossy UTF-8, control characters replaced), and never panics nor
//! allocates more than that whatever the bytes.

/// Most bytes of a Close's reason (its eager body).
pub const MAX_CLOSE_REASON: usize = 256;

/// Writes `reason` into `out` as a Close's body: at most [`MAX_CLOSE_REASON`] bytes (and at most
/// `out.len()`), cut at a character boundary, control characters written as spaces. Returns the
/// bytes written. Allocates nothing.
pub fn encode_close_reason(reason: &str, out: &mut [u8]) -> usize {
    let room = out.len().min(MAX_CLOSE_REASON);
    let mut n = 0;
    for c in reason.chars() {
        let c = if c.is_control() { ' ' } else { c };
        let w = c.len_utf8();
        if n + w > room {
            break;
        }
        c.encode_utf8(&mut out[n..n + w]);
        n += w;
    }
    n
}

/// The reason a received Close's `body` gives, read as untrusted: its first
/// [`MAX_CLOSE_REASON`] bytes, invalid UTF-8 replaced (U+FFFD), control characters replaced by
/// spaces. Empty for an empty body. Never panics.
pub fn close_reason(body: &[u8]) -> String {
    let b = &body[..body.len().min(MAX_CLOSE_REASON)];
    String::from_utf8_lossy(b).chars().map(|c| if c.is_control() { ' ' } else { c }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn reasons_are_bounded_cut_at_a_char_and_sanitized() {
        let mut out = [0u8; 512];
        let n = encode_close_reason("over max_reassembly_bytes (268435456 bytes)", &mut out);
        assert_eq!(close_reason(&out[..n]), "over max_reassembly_bytes (268435456 bytes)");
        // 200 two-byte characters: 256 bytes hold 128 of them, none cut.
        let long = "é".repeat(200);
        let n = encode_close_reason(&long, &mut out);
        assert_eq!(n, 256);
        assert_eq!(close_reason(&out[..n]), "é".repeat(128));
        // A smaller buffer bounds it too, at a character boundary.
        let n = encode_close_reason(&long, &mut out[..5]);
        assert_eq!(&out[..n], "éé".as_bytes());
        let n = encode_close_reason("a\nb\u{1b}[31m", &mut out);
        assert_eq!(&out[..n], b"a b [31m", "the sender writes no control characters");
        assert_eq!(close_reason(&out[..n]), "a b [31m");
        // A hostile peer's bytes: bounded, lossy, no control characters.
        let hostile: Vec<u8> = (0..1000u32).map(|i| (i * 37) as u8).collect();
        let r = close_reason(&hostile);
        assert!(r.chars().all(|c| !c.is_control()));
        assert!(r.chars().count() <= MAX_CLOSE_REASON);
    }

    proptest! {
        /// Arbitrary bytes never panic and give a bounded reason; whatever text is encoded
        /// decodes to a prefix of its sanitized self.
        #[test]
        fn arbitrary_reasons(bytes in proptest::collection::vec(any::<u8>(), 0..600), text in ".{0,300}") {
            let r = close_reason(&bytes);
            prop_assert!(r.chars().count() <= MAX_CLOSE_REASON);
            prop_assert!(r.chars().all(|c| !c.is_control()));
            let mut out = [0u8; MAX_CLOSE_REASON];
            let n = encode_close_reason(&text, &mut out);
            prop_assert!(n <= MAX_CLOSE_REASON);
            let clean: String = text.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
            prop_assert!(clean.starts_with(&close_reason(&out[..n])));
        }
    }
}
