//! Memory a peer makes this end hold, counted across sessions: bodies arriving in pieces
//! (reassembly) and answers waiting on a slow reader (the backlog of bodies on the heap). The
//! session decides what is charged and when (its rules: [`super::Session::set_reassembly`],
//! [`super::Session::charge_backlog`]); a [`HeldBytes`] only counts, shared by the sessions of
//! every worker of a server. A charge is taken when a piece-by-piece body or a waiting answer
//! starts and given back when its [`Charge`] drops (the body complete, the answer sent, the
//! session closed): one atomic add per message that waits, none per byte or per piece.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A server-wide count of bytes held for one purpose, with a cap.
#[derive(Debug)]
pub struct HeldBytes {
    used: AtomicU64,
    peak: AtomicU64,
    cap: u64,
    /// The configuration field of the cap (for the status that names it).
    field: &'static str,
}

impl HeldBytes {
    /// A count capped at `cap` bytes, named by the configuration `field` that sets the cap.
    pub fn new(cap: u64, field: &'static str) -> Arc<HeldBytes> {
        Arc::new(HeldBytes { used: AtomicU64::new(0), peak: AtomicU64::new(0), cap, field })
    }

    /// Bytes held now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Most bytes held at once since the count was made.
    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }

    /// The cap in bytes.
    pub fn cap(&self) -> u64 {
        self.cap
    }

    /// The configuration field that sets the cap (e.g. `ServerConfig::max_reassembly_bytes`).
    pub fn field(&self) -> &'static str {
        self.field
    }

    /// Charges `bytes`.
    ///
    /// # Errors
    /// The reason (naming the cap's field, its value and what was asked) when the charge would
    /// take the count over the cap; nothing is charged then.
    pub fn charge(self: &Arc<Self>, bytes: u64, what: &str) -> Result<Charge, String> {
        let mut used = self.used.load(Ordering::Relaxed);
        loop {
            let next = used.saturating_add(bytes);
            if next > self.cap {
                return Err(format!(
                    "{what} of {bytes} bytes would take the server's {} to {next} bytes, over its \
                     cap of {} bytes",
                    self.field, self.cap
                ));
            }
            match self.used.compare_exchange_weak(used, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => {
                    self.peak.fetch_max(next, Ordering::Relaxed);
                    return Ok(Charge { bytes, held: Some(self.clone()) });
                }
                Err(now) => used = now,
            }
        }
    }

    /// Adds `bytes` without a cap (a gauge, such as registered memory): give them back with
    /// [`HeldBytes::release`].
    pub fn add(&self, bytes: u64) {
        let next = self.used.fetch_add(bytes, Ordering::Relaxed).saturating_add(bytes);
        self.peak.fetch_max(next, Ordering::Relaxed);
    }

    /// Gives back `bytes` added with [`HeldBytes::add`].
    pub fn release(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// Bytes charged to a [`HeldBytes`]; given back when dropped.
#[derive(Debug, Default)]
pub struct Charge {
    bytes: u64,
    held: Option<Arc<HeldBytes>>,
}

impl Charge {
    /// The bytes charged.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        if let Some(h) = self.held.take() {
            h.release(self.bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_stop_at_the_cap_and_come_back_on_drop() {
        let h = HeldBytes::new(100, "ServerConfig::max_reassembly_bytes");
        let a = h.charge(60, "a body").unwrap();
        let e = h.charge(41, "a body").unwrap_err();
        assert!(e.contains("max_reassembly_bytes") && e.contains("100 bytes") && e.contains("41"), "{e}");
        assert_eq!(h.used(), 60);
        let b = h.charge(40, "a body").unwrap();
        assert_eq!((h.used(), h.peak()), (100, 100));
        drop(a);
        drop(b);
        assert_eq!((h.used(), h.peak()), (0, 100));
    }
}
