//! Kernel-bypass RPC over RDMA verbs.
//!
//! Layers, each calling only the one below (see `DESIGN.md`):
//! 1. [`verbs`]: the NIC boundary (`sim` software NIC, `ibverbs` over libibverbs).
//!
//! Quick start: see the repository's README.

#[allow(unsafe_code)] // The NIC boundary: raw memory and FFI, every block with a `// SAFETY:` note.
pub mod verbs;
