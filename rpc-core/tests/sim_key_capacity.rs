//! The software NIC's key table at scale: one host holds 65,536 keys (MRs and memory windows
//! together, `max_mr` = `max_mw`), refuses the next with a clear error, and a key of a slot that
//! was reused (up to the documented reuse distance) is never accepted for the new registration:
//! an RDMA WRITE with it is a remote access error.
//!
//! Run: `cargo test -p rpc-core --test sim_key_capacity` (release: `--release`, to time it).
#![allow(unsafe_code)] // `reg_user_mr` and posting WRs are `unsafe` by contract.

#[allow(unused_macros)]
mod conformance;

use rpc_core::verbs::sim::{Sim, SimContext};
use rpc_core::verbs::{
    inc_rkey, AccessFlags, Context, DeviceSelector, MemoryRegion, MemoryWindow, MwBind, MwType,
    ProtectionDomain, Provider, SendFlags, SendOp, SendWr, VerbsError, WcStatus,
};

use conformance::{connect_qps, pair, poll_one, post_send, DeviceHarness, Node, Opts};

type H = DeviceHarness<Sim>;

/// Keys per host (MRs and windows together).
const KEYS: usize = 65_536;
/// How many times a slot can be taken again before an MR key comes back (see `sim::mr`).
const MR_REUSE: usize = 0x7fff;
/// The same for a window's rkey (7 generation bits).
const MW_REUSE: usize = 128;

fn open() -> SimContext {
    Sim::open(&DeviceSelector::First).unwrap()
}

/// A 64-byte MR of caller memory at `buf[i * 64..]` (no segment memory: 65,536 of them are cheap).
fn user_mr(
    pd: &<Sim as Provider>::ProtectionDomain,
    buf: &mut [u8],
    i: usize,
    access: AccessFlags,
) -> Result<<Sim as Provider>::MemoryRegion, VerbsError> {
    let at = (i % (buf.len() / 64)) * 64;
    // SAFETY: `buf` outlives every MR of these tests (each test drops its MRs before it).
    unsafe { pd.reg_user_mr(buf[at..].as_mut_ptr(), 64, access) }
}

fn assert_cap(e: VerbsError, cap_prefix: &str) {
    match e {
        VerbsError::CapExceeded { cap, requested, limit, .. } => {
            assert!(cap.starts_with(cap_prefix), "{cap}");
            assert_eq!((requested, limit), (KEYS as u64 + 1, KEYS as u64));
        }
        other => panic!("expected CapExceeded({cap_prefix}), got {other:?}"),
    }
}

#[test]
fn a_host_holds_65536_keys_of_mrs_and_windows_and_refuses_the_next() {
    let ctx = open();
    assert_eq!(ctx.attr().max_mw as usize, KEYS, "max_mw (shared with max_mr)");
    let pd = ctx.alloc_pd().unwrap();
    let mut buf = vec![0u8; 1 << 16];
    let mut mrs = Vec::new();
    let mut mws = Vec::new();
    let mut keys = std::collections::HashSet::new();
    let start = std::time::Instant::now();
    for i in 0..KEYS {
        // Mixed: two MRs, then a window.
        if i % 3 == 2 {
            let mw = pd.alloc_mw(MwType::Type2).unwrap_or_else(|e| panic!("window #{i}: {e}"));
            assert!(keys.insert(mw.rkey()), "a window's rkey is unique");
            mws.push(mw);
        } else {
            let mr = user_mr(&pd, &mut buf, i, AccessFlags::LOCAL_WRITE)
                .unwrap_or_else(|e| panic!("MR #{i}: {e}"));
            assert!(keys.insert(mr.rkey()), "an MR's key is unique");
            mrs.push(mr);
        }
    }
    assert_eq!(mrs.len() + mws.len(), KEYS);
    // A figure, not a check: what registering a full table costs.
    eprintln!("{KEYS} keys ({} MRs, {} windows) registered in {:?}", mrs.len(), mws.len(), start.elapsed());
    assert_cap(user_mr(&pd, &mut buf, 0, AccessFlags::LOCAL_WRITE).unwrap_err(), "max_mr");
    assert_cap(pd.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap_err(), "max_mr");
    assert_cap(pd.alloc_mw(MwType::Type2).unwrap_err(), "max_mw");
    // A freed slot (a window's) takes a registration again.
    drop(mws.pop());
    let again = user_mr(&pd, &mut buf, 1, AccessFlags::LOCAL_WRITE).expect("a freed slot is reusable");
    assert!(!keys.contains(&again.rkey()), "with a key never handed out before");
    drop(again);
    drop(mws);
    drop(mrs);
}

/// Posts an RDMA WRITE of 8 bytes from `a`'s QP `qp` to `addr` under `rkey`; returns its status.
fn write(a: &Node<H>, qp: &<Sim as Provider>::QueuePair, addr: u64, rkey: u32) -> WcStatus {
    let op = SendOp::RdmaWrite { remote_addr: addr, rkey };
    let wr = SendWr { wr_id: 7, sg_list: &[a.sge(0, 8)], op, flags: SendFlags::SIGNALED };
    post_send(qp, &[wr]).unwrap();
    poll_one::<H, _>(&a.scq, "the write's completion").status
}

/// Fills the table of `pd`'s host until exactly one slot is free (every registration after this
/// reuses that slot); returns what holds the others.
fn fill_but_one(
    pd: &<Sim as Provider>::ProtectionDomain,
    buf: &mut [u8],
) -> Vec<<Sim as Provider>::MemoryRegion> {
    let mut held = Vec::new();
    while let Ok(mr) = user_mr(pd, buf, held.len(), AccessFlags::LOCAL_WRITE) {
        held.push(mr);
    }
    assert!(held.len() > KEYS - 16, "{}", held.len());
    held.pop();
    held
}

#[test]
fn a_key_of_a_reused_slot_is_never_accepted_for_the_new_registration() {
    let (ca, cb) = (open(), open());
    let opts = Opts { mr_access: Opts::default().mr_access | AccessFlags::MW_BIND, ..Opts::default() };
    let (a, b) = pair::<H>(&ca, &cb, opts);
    // One more connection (same PDs) per remote access error, which takes both QPs to ERR.
    let more: Vec<_> = (0..2)
        .map(|_| {
            let (qa, qb) = (a.extra_qp(), b.extra_qp());
            connect_qps(&a, &qa, &b, &qb);
            (qa, qb)
        })
        .collect();
    let mut small = vec![0u8; 1 << 16];
    let held = fill_but_one(&b.pd, &mut small);
    // Registered memory of the host's segment: the shared key slot alone says whose it is.
    let reg = || b.pd.reg_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE).unwrap();

    // MRs: the one free slot is reused MR_REUSE - 1 times, then registered for good.
    let mut old = Vec::with_capacity(MR_REUSE);
    for _ in 0..MR_REUSE - 1 {
        old.push(reg().rkey());
    }
    let live = reg();
    let slot = live.rkey() & 0xffff;
    assert!(old.iter().all(|k| k & 0xffff == slot), "every registration took the one free slot");
    let mut distinct = old.clone();
    distinct.push(live.rkey());
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), MR_REUSE, "{MR_REUSE} registrations of one slot, {MR_REUSE} keys");
    let addr = live.addr();
    assert_eq!(write(&a, &a.qp, addr, live.rkey()), WcStatus::IBV_WC_SUCCESS, "the live key");
    assert_eq!(write(&a, &a.qp, addr, old[0]), WcStatus::IBV_WC_REM_ACCESS_ERR, "the oldest key");
    let previous = *old.last().unwrap();
    assert_eq!(write(&a, &more[0].0, addr, previous), WcStatus::IBV_WC_REM_ACCESS_ERR, "the previous key");
    // The reuse distance: one more take of the slot hands out the oldest key again.
    drop(live);
    assert_eq!(reg().rkey(), old[0], "MR keys come back after {MR_REUSE} takes of a slot");

    // Windows: the same slot, MW_REUSE - 1 windows, then one bound to the server's last QP.
    let (qa, qb) = &more[1];
    let mut first = Vec::with_capacity(MW_REUSE);
    for _ in 0..MW_REUSE - 1 {
        first.push(b.pd.alloc_mw(MwType::Type2).unwrap().rkey());
    }
    let mw = b.pd.alloc_mw(MwType::Type2).unwrap();
    assert!(first.iter().all(|k| (k >> 8) & 0xffff == slot), "the same slot");
    assert!(!first.contains(&mw.rkey()), "a window rkey not handed out in {MW_REUSE} takes of its slot");
    let rkey = inc_rkey(mw.rkey());
    let win = b.mr.addr();
    let bind = MwBind { mr: b.mr.handle(), addr: win, length: 4096, access: AccessFlags::REMOTE_WRITE };
    let op = SendOp::BindMw { mw: mw.handle(), rkey, bind };
    post_send(qb, &[SendWr { wr_id: 9, sg_list: &[], op, flags: SendFlags::SIGNALED }]).unwrap();
    assert_eq!(poll_one::<H, _>(&b.scq, "bind").status, WcStatus::IBV_WC_SUCCESS);
    assert_eq!(write(&a, qa, win, rkey), WcStatus::IBV_WC_SUCCESS, "the bound window");
    // The same consumer key under the slot's previous generation: stale.
    let previous = inc_rkey(*first.last().unwrap());
    assert_eq!(write(&a, qa, win, previous), WcStatus::IBV_WC_REM_ACCESS_ERR, "the previous window");
    drop(mw);
    let again = b.pd.alloc_mw(MwType::Type2).unwrap();
    assert_eq!(again.rkey(), first[0], "window rkeys come back after {MW_REUSE} takes of a slot");
    drop(again);
    drop(held);
    drop(more);
}
