//! Extended verbs that `verbs.h` defines as inline functions over `struct verbs_context`
//! (`ibv_alloc_td`, `ibv_dealloc_td`, `ibv_alloc_parent_domain`, `ibv_create_cq_ex`), called
//! here the way the header does.
//!
//! Not through rdma-sys 0.3.0's Rust versions of them: its `verbs_get_ctx` compares
//! `ibv_context::abi_compat` with `u32::MAX`, where libibverbs marks an extended context with
//! `UINTPTR_MAX` (verbs.h `__VERBS_ABI_IS_EXTENDED`), so on 64-bit hosts every one of them
//! answers `EOPNOTSUPP` without asking the provider: thread domains would never be found, even
//! on mlx5. [`verbs_ctx`] does the header's check.

use std::mem::{offset_of, size_of};

use rdma_sys::{
    ibv_context, ibv_cq_ex, ibv_cq_init_attr_ex, ibv_parent_domain_init_attr, ibv_pd, ibv_td,
    ibv_td_init_attr, verbs_context,
};

/// What libibverbs stores in `ibv_context::abi_compat` of a context that is the `context` field
/// of a `struct verbs_context` (verbs.h `__VERBS_ABI_IS_EXTENDED`: `(void *)UINTPTR_MAX`).
const ABI_IS_EXTENDED: usize = usize::MAX;

/// The `struct verbs_context` around `ctx`, when it is an extended context (verbs.h
/// `verbs_get_ctx`).
///
/// # Safety
/// `ctx` must point to a live `ibv_context`.
unsafe fn verbs_ctx(ctx: *mut ibv_context) -> Option<*mut verbs_context> {
    // SAFETY: a live context (caller); `abi_compat` is a plain pointer field.
    let abi = unsafe { (*ctx).abi_compat } as usize;
    if abi != ABI_IS_EXTENDED {
        return None;
    }
    // An extended context is the last field of its `verbs_context`: step back to its start.
    Some(ctx.wrapping_byte_sub(offset_of!(verbs_context, context)).cast())
}

/// The provider's entry `$op` of `ctx`'s `verbs_context`, if the context is extended, its
/// library knows the entry (its `sz` reaches it: entries are added at the front) and it is set
/// (verbs.h `verbs_get_ctx_op`). Evaluates to an `Option` of the function pointer.
///
/// Use inside an `unsafe` block whose caller guarantees that `$ctx` is a live context.
macro_rules! ctx_op {
    ($ctx:expr, $op:ident) => {
        match verbs_ctx($ctx) {
            Some(v) if (*v).sz >= size_of::<verbs_context>() - offset_of!(verbs_context, $op) => (*v).$op,
            _ => None,
        }
    };
}

/// Sets `errno` to EOPNOTSUPP (what the header's wrappers answer for a missing entry).
fn not_supported() {
    // SAFETY: `__errno_location` is this thread's errno.
    unsafe { *libc::__errno_location() = libc::EOPNOTSUPP };
}

/// `ibv_alloc_td`: a thread domain, or NULL with `errno` set (EOPNOTSUPP without the verb).
///
/// # Safety
/// `ctx` must be an open context and `attr` a live parameter.
pub(super) unsafe fn alloc_td(ctx: *mut ibv_context, attr: *mut ibv_td_init_attr) -> *mut ibv_td {
    // SAFETY: a live context (caller); the entry is read from its live `verbs_context`.
    match unsafe { ctx_op!(ctx, alloc_td) } {
        // SAFETY: the provider's own entry for this context, called with the header's arguments.
        Some(f) => unsafe { f(ctx, attr) },
        None => {
            not_supported();
            std::ptr::null_mut()
        }
    }
}

/// `ibv_dealloc_td`: 0 or an errno.
///
/// # Safety
/// `td` must be a thread domain allocated by [`alloc_td`], with nothing left on it, freed once.
pub(super) unsafe fn dealloc_td(td: *mut ibv_td) -> i32 {
    // SAFETY: a live TD (caller) names its live context.
    let ctx = unsafe { (*td).context };
    // SAFETY: as in `alloc_td`.
    match unsafe { ctx_op!(ctx, dealloc_td) } {
        // SAFETY: the provider's entry, for a TD it allocated (caller).
        Some(f) => unsafe { f(td) },
        None => libc::EOPNOTSUPP,
    }
}

/// `ibv_alloc_parent_domain`: a parent domain (an `ibv_pd`), or NULL with `errno` set.
///
/// # Safety
/// `ctx` must be an open context and `attr` a live parameter naming a live PD (and TD) of it.
pub(super) unsafe fn alloc_parent_domain(
    ctx: *mut ibv_context,
    attr: *mut ibv_parent_domain_init_attr,
) -> *mut ibv_pd {
    // SAFETY: as in `alloc_td`.
    match unsafe { ctx_op!(ctx, alloc_parent_domain) } {
        // SAFETY: the provider's entry, with the header's arguments (caller).
        Some(f) => unsafe { f(ctx, attr) },
        None => {
            not_supported();
            std::ptr::null_mut()
        }
    }
}

/// `ibv_create_cq_ex`: an extended CQ, or NULL with `errno` set.
///
/// # Safety
/// `ctx` must be an open context and `attr` a live parameter (its channel NULL or a live channel
/// of `ctx`).
pub(super) unsafe fn create_cq_ex(ctx: *mut ibv_context, attr: *mut ibv_cq_init_attr_ex) -> *mut ibv_cq_ex {
    // SAFETY: as in `alloc_td`.
    match unsafe { ctx_op!(ctx, create_cq_ex) } {
        // SAFETY: the provider's entry, with the header's arguments (caller).
        Some(f) => unsafe { f(ctx, attr) },
        None => {
            not_supported();
            std::ptr::null_mut()
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    /// A `verbs_context` as libibverbs lays one out, with fake entries.
    fn fake(abi: usize, sz: usize) -> Box<verbs_context> {
        // SAFETY: plain C data (pointers, optional function pointers, opaque pthread arrays);
        // all-zero is a valid value of each.
        let mut v: Box<verbs_context> = Box::new(unsafe { std::mem::zeroed() });
        v.sz = sz;
        v.context.abi_compat = abi as *mut std::os::raw::c_void;
        v
    }

    thread_local! {
        /// Calls of the fake entries on this test's thread.
        static CALLS: Cell<usize> = const { Cell::new(0) };
    }
    fn calls() -> usize {
        CALLS.with(Cell::get)
    }
    fn called() {
        CALLS.with(|c| c.set(c.get() + 1));
    }
    static mut TD: ibv_td = ibv_td { context: std::ptr::null_mut() };

    unsafe extern "C" fn fake_alloc_td(_: *mut ibv_context, _: *mut ibv_td_init_attr) -> *mut ibv_td {
        called();
        std::ptr::addr_of_mut!(TD)
    }

    unsafe extern "C" fn fake_create_cq_ex(
        _: *mut ibv_context,
        _: *mut ibv_cq_init_attr_ex,
    ) -> *mut ibv_cq_ex {
        called();
        std::ptr::NonNull::dangling().as_ptr()
    }

    const FULL: usize = size_of::<verbs_context>();

    /// An extended context (`abi_compat` = UINTPTR_MAX, what libibverbs sets) reaches the
    /// provider's entries. rdma-sys 0.3.0's wrappers fail exactly this.
    #[test]
    fn extended_context_reaches_the_provider() {
        let before = calls();
        let mut v = fake(usize::MAX, FULL);
        v.alloc_td = Some(fake_alloc_td);
        v.create_cq_ex = Some(fake_create_cq_ex);
        let ctx: *mut ibv_context = &mut v.context;
        // SAFETY: `ctx` is the context field of a live (fake) `verbs_context`; the fakes ignore
        // their arguments.
        let td = unsafe { alloc_td(ctx, std::ptr::null_mut()) };
        assert_eq!(td, std::ptr::addr_of_mut!(TD));
        // SAFETY: as above.
        let cq = unsafe { create_cq_ex(ctx, std::ptr::null_mut()) };
        assert!(!cq.is_null());
        assert_eq!(calls(), before + 2);
        // SAFETY: as above.
        assert_eq!(unsafe { verbs_ctx(ctx) }, Some(&mut *v as *mut verbs_context));
    }

    /// What the header refuses: not an extended context (the rdma-sys marker included), an
    /// entry beyond what the library's `sz` covers, an entry the provider left unset.
    #[test]
    fn the_header_checks_refuse_with_eopnotsupp() {
        let cases = [
            (u32::MAX as usize, FULL, true, "abi_compat = u32::MAX is not the extended marker"),
            (0, FULL, true, "a plain context"),
            (usize::MAX, FULL - offset_of!(verbs_context, alloc_td) - 1, true, "sz short of the entry"),
            (usize::MAX, FULL, false, "entry not set"),
        ];
        for (abi, sz, set, what) in cases {
            let before = calls();
            let mut v = fake(abi, sz);
            if set {
                v.alloc_td = Some(fake_alloc_td);
            }
            let ctx: *mut ibv_context = &mut v.context;
            // SAFETY: as in the test above.
            let td = unsafe { alloc_td(ctx, std::ptr::null_mut()) };
            assert!(td.is_null(), "{what}");
            assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(libc::EOPNOTSUPP), "{what}");
            assert_eq!(calls(), before, "{what}: the provider was not called");
        }
        // The entry just covered by `sz` is found.
        let mut v = fake(usize::MAX, FULL - offset_of!(verbs_context, alloc_td));
        v.alloc_td = Some(fake_alloc_td);
        let ctx: *mut ibv_context = &mut v.context;
        // SAFETY: as above.
        assert!(!unsafe { alloc_td(ctx, std::ptr::null_mut()) }.is_null());
    }
}
