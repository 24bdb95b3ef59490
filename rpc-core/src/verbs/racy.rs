//! Copies of memory that another thread (the software NIC executing a peer's transfer) may read
//! or write at the same time: registered memory a peer can RDMA WRITE, or that a posted WR reads.
//!
//! A plain copy (`ptr::copy`, a slice copy) racing another thread's access to the same bytes is
//! a data race, undefined behaviour in Rust's memory model, even when the program does not care
//! which bytes it gets. These copies access the shared side with relaxed atomic loads or stores
//! only (aligned `AtomicU64` words, `AtomicU8` at the unaligned ends), so a racing access makes
//! the copied bytes some mix of old and new ones and nothing worse. On x86-64 and AArch64 a
//! relaxed atomic load or store of a word is an ordinary `mov`/`ldr`/`str`: the cost over
//! `memcpy` is that the compiler does not vectorize the loop.
//!
//! A real NIC's DMA is outside the memory model; the same copies serve the `ibverbs` provider's
//! `read_at`/`write_at`, where they cost nothing that matters.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};

const WORD: usize = std::mem::size_of::<u64>();

/// Bytes to skip from `p` to the next 8-byte boundary (0..8), at most `n`.
#[inline(always)]
fn head_len(p: usize, n: usize) -> usize {
    (p.wrapping_neg() & (WORD - 1)).min(n)
}

/// At or above this many bytes, x86-64 copies with `rep movsb` ([`bulk`]).
#[cfg(target_arch = "x86_64")]
const BULK: usize = 1024;

/// Copies `n` bytes with `rep movsb`: on x86-64 every byte of it is loaded and stored with a
/// single-copy-atomic byte access, so it is what a loop of relaxed `AtomicU8` loads and stores
/// does (the Rust program it stands for), at `memcpy`'s speed (ERMSB): the per-byte atomic
/// memcpy of Rust RFC 3301 (`AtomicPerByte`), which that RFC notes plain `memcpy` instructions
/// implement. Forward order: the ranges must not overlap.
///
/// # Safety
/// `src` valid for reads and `dst` for writes of `n` bytes; the ranges do not overlap; every
/// other access to them meanwhile is atomic (or a device's).
#[cfg(target_arch = "x86_64")]
#[inline]
unsafe fn bulk(src: *const u8, dst: *mut u8, n: usize) {
    // SAFETY: the caller's contract; `rep movsb` touches exactly `[src, src + n)` and
    // `[dst, dst + n)`, forward (the direction flag is clear at a Rust call boundary), and
    // leaves the flags and `rsi`/`rdi`/`rcx` as declared.
    unsafe {
        std::arch::asm!(
            "rep movsb",
            inout("rcx") n => _,
            inout("rsi") src => _,
            inout("rdi") dst => _,
            options(nostack, preserves_flags),
        );
    }
}

/// Copies `n` bytes from shared memory at `src` (which others may write meanwhile) into `dst`.
///
/// # Safety
/// `src` must be valid for reads of `n` bytes, `dst` for writes of `n` bytes, and the ranges
/// must not overlap. Nobody may access `dst` but through atomics meanwhile; `src` may be written
/// by other threads (with atomics, or by a device).
#[inline]
pub(crate) unsafe fn load(src: *const u8, dst: *mut u8, n: usize) {
    #[cfg(target_arch = "x86_64")]
    if n >= BULK {
        // SAFETY: the caller's contract, which `bulk` shares.
        return unsafe { bulk(src, dst, n) };
    }
    let h = head_len(src as usize, n);
    let mut i = 0;
    while i < h {
        // SAFETY: `i < n`: inside both ranges (caller's contract); byte accesses need no alignment.
        unsafe { *dst.add(i) = (*(src.add(i) as *const AtomicU8)).load(Relaxed) };
        i += 1;
    }
    while i + WORD <= n {
        // SAFETY: `src + i` is 8-aligned (`h` made it so) and `[i, i + 8)` is inside both ranges;
        // the store into `dst` (ours alone) may be unaligned.
        unsafe {
            let w = (*(src.add(i) as *const AtomicU64)).load(Relaxed);
            (dst.add(i) as *mut u64).write_unaligned(w);
        }
        i += WORD;
    }
    while i < n {
        // SAFETY: as for the head.
        unsafe { *dst.add(i) = (*(src.add(i) as *const AtomicU8)).load(Relaxed) };
        i += 1;
    }
}

/// Copies `n` bytes from `src` into shared memory at `dst` (which others may read or write
/// meanwhile).
///
/// # Safety
/// `src` must be valid for reads of `n` bytes, `dst` for writes of `n` bytes, and the ranges
/// must not overlap. Nobody may write `src` meanwhile; `dst` may be accessed by other threads
/// (with atomics, or by a device).
#[inline]
pub(crate) unsafe fn store(src: *const u8, dst: *mut u8, n: usize) {
    #[cfg(target_arch = "x86_64")]
    if n >= BULK {
        // SAFETY: the caller's contract, which `bulk` shares.
        return unsafe { bulk(src, dst, n) };
    }
    let h = head_len(dst as usize, n);
    let mut i = 0;
    while i < h {
        // SAFETY: `i < n`: inside both ranges (caller's contract).
        unsafe { (*(dst.add(i) as *const AtomicU8)).store(*src.add(i), Relaxed) };
        i += 1;
    }
    while i + WORD <= n {
        // SAFETY: `dst + i` is 8-aligned and `[i, i + 8)` is inside both ranges; `src` (not
        // written by anyone meanwhile) may be read unaligned.
        unsafe {
            let w = (src.add(i) as *const u64).read_unaligned();
            (*(dst.add(i) as *const AtomicU64)).store(w, Relaxed);
        }
        i += WORD;
    }
    while i < n {
        // SAFETY: as for the head.
        unsafe { (*(dst.add(i) as *const AtomicU8)).store(*src.add(i), Relaxed) };
        i += 1;
    }
}

/// Copies `n` bytes between two ranges of shared memory, either of which others may access
/// meanwhile (the software NIC's transfers: a SEND, WRITE or READ from one MR into another).
/// The ranges may overlap (a QP sending to itself within one MR); then the result is some mix,
/// as on a NIC.
///
/// # Safety
/// `src` must be valid for reads and `dst` for writes of `n` bytes; every other access to either
/// range meanwhile is atomic (or a device's).
#[inline]
pub(crate) unsafe fn copy(src: *const u8, dst: *mut u8, n: usize) {
    let (s, d) = (src as usize, dst as usize);
    let overlap = s < d + n && d < s + n;
    #[cfg(target_arch = "x86_64")]
    if n >= BULK && !overlap {
        // SAFETY: the caller's contract; the ranges do not overlap.
        return unsafe { bulk(src, dst, n) };
    }
    if !overlap && (s ^ d) & (WORD - 1) == 0 {
        // Same alignment: word to word.
        let h = head_len(dst as usize, n);
        let mut i = 0;
        while i < h {
            // SAFETY: `i < n`: inside both ranges (caller's contract).
            unsafe {
                (*(dst.add(i) as *const AtomicU8))
                    .store((*(src.add(i) as *const AtomicU8)).load(Relaxed), Relaxed)
            };
            i += 1;
        }
        while i + WORD <= n {
            // SAFETY: both `src + i` and `dst + i` are 8-aligned (same alignment, `h` bytes
            // skipped) and `[i, i + 8)` is inside both ranges.
            unsafe {
                let w = (*(src.add(i) as *const AtomicU64)).load(Relaxed);
                (*(dst.add(i) as *const AtomicU64)).store(w, Relaxed);
            }
            i += WORD;
        }
        while i < n {
            // SAFETY: as for the head.
            unsafe {
                (*(dst.add(i) as *const AtomicU8))
                    .store((*(src.add(i) as *const AtomicU8)).load(Relaxed), Relaxed)
            };
            i += 1;
        }
        return;
    }
    // Different alignments, or overlapping ranges: through a buffer on the stack (in L1), loaded
    // with aligned words from `src` and stored with aligned words into `dst`, a chunk at a time;
    // from the end when `dst` is after an overlapping `src` (as `memmove`).
    const CHUNK: usize = 512;
    let mut bounce = [0u64; CHUNK / WORD];
    let b = bounce.as_mut_ptr() as *mut u8;
    let chunks = n.div_ceil(CHUNK);
    for c in 0..chunks {
        let c = if overlap && d > s { chunks - 1 - c } else { c };
        let at = c * CHUNK;
        let k = (n - at).min(CHUNK);
        // SAFETY: `[at, at + k)` is inside both ranges; the bounce buffer (ours alone) holds `k`
        // bytes and overlaps neither; the chunk is loaded whole before it is stored.
        unsafe {
            load(src.add(at), b, k);
            store(b, dst.add(at), k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every alignment and length combination copies exactly the bytes asked for, and nothing
    /// around them.
    #[test]
    fn copies_every_alignment_and_length() {
        let src: Vec<u8> = (0..2000u32).map(|i| (i * 7 + 3) as u8).collect();
        for so in 0..9 {
            for d_off in 0..9 {
                for n in [0, 1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 200, 280, 700, 1000, 1024, 1100, 1900] {
                    for which in 0..3 {
                        let mut dst = vec![0xeeu8; 2000];
                        // SAFETY: both ranges are inside their vectors (so + n <= 1909 < 2000) and
                        // distinct allocations; no other thread touches them.
                        unsafe {
                            let (s, d) = (src.as_ptr().add(so), dst.as_mut_ptr().add(d_off));
                            match which {
                                0 => load(s, d, n),
                                1 => store(s, d, n),
                                _ => copy(s, d, n),
                            }
                        }
                        assert_eq!(&dst[d_off..d_off + n], &src[so..so + n], "{which} {so} {d_off} {n}");
                        assert!(dst[..d_off].iter().all(|&b| b == 0xee), "{which} {so} {d_off} {n}: before");
                        assert!(
                            dst[d_off + n..].iter().all(|&b| b == 0xee),
                            "{which} {so} {d_off} {n}: after"
                        );
                    }
                }
            }
        }
    }

    /// Overlapping ranges copy as `memmove` does, either way round.
    #[test]
    fn overlapping_copies_are_memmove() {
        for (from, to, n) in [(0, 3, 1500), (3, 0, 1500), (0, 8, 1200), (8, 0, 1200), (5, 6, 700)] {
            let mut v: Vec<u8> = (0..2000u32).map(|i| (i * 13 + 1) as u8).collect();
            let mut want = v.clone();
            want.copy_within(from..from + n, to);
            // SAFETY: both ranges are inside `v`; no other thread touches it.
            unsafe { copy(v.as_ptr().add(from), v.as_mut_ptr().add(to), n) };
            assert!(v == want, "{from} -> {to}, {n} bytes");
        }
    }
}
