//! A session's ring is granted to its peer for RDMA WRITE only: nothing in the protocol reads
//! a peer's memory, so neither the server's QPs nor the ring's window grant REMOTE_READ, and a
//! peer's RDMA READ of the ring fails with a remote error (and reads nothing).

#![allow(unsafe_code)] // Posting the READ is `unsafe` by contract; see the SAFETY note.

mod rpc_support;

use std::time::Instant;

use rpc_core::verbs::{
    AccessFlags, CompletionQueue, MemoryRegion, ProtectionDomain, QueuePair, SendFlags, SendOp, SendWr,
    WcStatus, WorkCompletion,
};
use rpc_support::*;

#[test]
fn a_peers_rdma_read_of_a_session_ring_fails_with_a_remote_error() {
    let server = server().add_service(TestService::default()).spawn("127.0.0.1:0").unwrap();
    let c = RawClient::connect(server.local_addr());
    let (ring_addr, ring_rkey) = c.ring;
    let mut dst = c.peer.pd.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    assert!(dst.write_at(0, &[0x5a; 64]).is_ok());
    let sge = [dst.sge(0, 64)];
    let wr = SendWr {
        wr_id: 0x7ead,
        sg_list: &sge,
        op: SendOp::RdmaRead { remote_addr: ring_addr, rkey: ring_rkey },
        flags: SendFlags::SIGNALED,
    };
    // SAFETY: the scatter list lies in `dst` (LOCAL_WRITE, this QP's PD), which is neither read
    // nor written until the READ's completion is polled below, and lives past it.
    unsafe { c.peer.qp.post_send(&[wr]) }.unwrap();
    let give_up = Instant::now() + WAIT;
    let status = loop {
        let mut wcs = [WorkCompletion::default(); 8];
        let n = c.peer.cq.poll(&mut wcs).unwrap();
        if let Some(wc) = wcs[..n].iter().find(|wc| wc.wr_id == 0x7ead) {
            break wc.status;
        }
        assert!(Instant::now() < give_up, "no completion for the READ in {WAIT:?}");
        std::thread::yield_now();
    };
    // The QP check comes first (REM_INV_REQ_ERR, as rxe answers a READ on a QP without
    // REMOTE_READ); a QP that allowed it would meet the window's REMOTE_WRITE-only rights
    // (REM_ACCESS_ERR).
    assert!(
        matches!(status, WcStatus::IBV_WC_REM_INV_REQ_ERR | WcStatus::IBV_WC_REM_ACCESS_ERR),
        "the READ of the ring completed {status}"
    );
    let mut got = [0u8; 64];
    dst.read_at(0, &mut got).unwrap();
    assert_eq!(got, [0x5a; 64], "nothing was read");
    server.shutdown();
}
