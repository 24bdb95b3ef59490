//! Conversions between the verbs API's plain types and libibverbs' C values.

use rdma_sys::{ibv_mtu, ibv_port_state, ibv_qp_state, ibv_wc, ibv_wc_flags, ibv_wc_opcode};

use crate::verbs::{LinkLayer, Mtu, PortState, QpState, WcOpcode, WcStatus, WorkCompletion};

/// `enum ibv_qp_state` of a [`QpState`].
pub(super) fn qp_state_to_ibv(s: QpState) -> ibv_qp_state::Type {
    match s {
        QpState::Reset => ibv_qp_state::IBV_QPS_RESET,
        QpState::Init => ibv_qp_state::IBV_QPS_INIT,
        QpState::Rtr => ibv_qp_state::IBV_QPS_RTR,
        QpState::Rts => ibv_qp_state::IBV_QPS_RTS,
        QpState::Sqd => ibv_qp_state::IBV_QPS_SQD,
        QpState::Sqe => ibv_qp_state::IBV_QPS_SQE,
        QpState::Err => ibv_qp_state::IBV_QPS_ERR,
    }
}

/// [`QpState`] of an `enum ibv_qp_state`; unknown values read as `Err`.
pub(super) fn qp_state_from_ibv(s: ibv_qp_state::Type) -> QpState {
    match s {
        ibv_qp_state::IBV_QPS_RESET => QpState::Reset,
        ibv_qp_state::IBV_QPS_INIT => QpState::Init,
        ibv_qp_state::IBV_QPS_RTR => QpState::Rtr,
        ibv_qp_state::IBV_QPS_RTS => QpState::Rts,
        ibv_qp_state::IBV_QPS_SQD => QpState::Sqd,
        ibv_qp_state::IBV_QPS_SQE => QpState::Sqe,
        _ => QpState::Err,
    }
}

/// Compact code of a [`QpState`] for an atomic cache.
pub(super) fn qp_state_code(s: QpState) -> u8 {
    qp_state_to_ibv(s) as u8
}

/// Inverse of [`qp_state_code`].
pub(super) fn qp_state_from_code(c: u8) -> QpState {
    qp_state_from_ibv(ibv_qp_state::Type::from(c))
}

/// `enum ibv_mtu` of an [`Mtu`] (same numbering).
pub(super) fn mtu_to_ibv(m: Mtu) -> ibv_mtu::Type {
    m as ibv_mtu::Type
}

/// [`Mtu`] of an `enum ibv_mtu`; out-of-range values read as 1024 bytes (the RoCE default).
pub(super) fn mtu_from_ibv(m: ibv_mtu::Type) -> Mtu {
    Mtu::from_ibv(m).unwrap_or(Mtu::Mtu1024)
}

/// [`PortState`] of an `enum ibv_port_state`.
pub(super) fn port_state_from_ibv(s: ibv_port_state::Type) -> PortState {
    match s {
        ibv_port_state::IBV_PORT_DOWN => PortState::Down,
        ibv_port_state::IBV_PORT_INIT => PortState::Init,
        ibv_port_state::IBV_PORT_ARMED => PortState::Armed,
        ibv_port_state::IBV_PORT_ACTIVE => PortState::Active,
        other => PortState::Other(other),
    }
}

/// [`LinkLayer`] of `ibv_port_attr::link_layer` (`IBV_LINK_LAYER_*`). Unspecified (0) is what old
/// InfiniBand drivers report.
pub(super) fn link_layer_from_ibv(l: u8) -> LinkLayer {
    const IBV_LINK_LAYER_ETHERNET: u8 = 2;
    if l == IBV_LINK_LAYER_ETHERNET {
        LinkLayer::Ethernet
    } else {
        LinkLayer::InfiniBand
    }
}

/// [`WcOpcode`] of an `enum ibv_wc_opcode`. Values outside the RC subset (undefined on flush
/// errors) read as `IBV_WC_SEND`.
fn wc_opcode_from_ibv(o: ibv_wc_opcode::Type) -> WcOpcode {
    match o {
        ibv_wc_opcode::IBV_WC_RDMA_WRITE => WcOpcode::IBV_WC_RDMA_WRITE,
        ibv_wc_opcode::IBV_WC_RDMA_READ => WcOpcode::IBV_WC_RDMA_READ,
        ibv_wc_opcode::IBV_WC_COMP_SWAP => WcOpcode::IBV_WC_COMP_SWAP,
        ibv_wc_opcode::IBV_WC_FETCH_ADD => WcOpcode::IBV_WC_FETCH_ADD,
        ibv_wc_opcode::IBV_WC_BIND_MW => WcOpcode::IBV_WC_BIND_MW,
        ibv_wc_opcode::IBV_WC_RECV => WcOpcode::IBV_WC_RECV,
        ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM => WcOpcode::IBV_WC_RECV_RDMA_WITH_IMM,
        ibv_wc_opcode::IBV_WC_LOCAL_INV => WcOpcode::IBV_WC_LOCAL_INV,
        _ => WcOpcode::IBV_WC_SEND,
    }
}

/// `IBV_WC_IP_CSUM_OK` (1 << 2) is the bit of the kernel's `IB_WC_WITH_INVALIDATE`.
const KERNEL_WITH_INVALIDATE: u32 = 1 << 2;

/// A [`WorkCompletion`] from a polled `ibv_wc`. `soft_roce`: the device is rxe, which (Linux
/// 6.1) marks the receive of a SEND_WITH_INV with the kernel's `IB_WC_WITH_INVALIDATE` bit
/// (1 << 2, which libibverbs names `IBV_WC_IP_CSUM_OK`) instead of `IBV_WC_WITH_INV` (1 << 3),
/// with the rkey in the union as usual; rxe never reports a checksum flag on an RC receive.
#[inline]
pub(super) fn wc_from_ibv(w: &ibv_wc, soft_roce: bool) -> WorkCompletion {
    let with_imm = w.wc_flags & ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0;
    let with_inv = w.wc_flags & ibv_wc_flags::IBV_WC_WITH_INV.0 != 0
        || (soft_roce && w.opcode == ibv_wc_opcode::IBV_WC_RECV && w.wc_flags & KERNEL_WITH_INVALIDATE != 0);
    WorkCompletion {
        wr_id: w.wr_id,
        status: WcStatus::from_u32(w.status),
        opcode: wc_opcode_from_ibv(w.opcode),
        byte_len: w.byte_len,
        // SAFETY: with IBV_WC_WITH_IMM set, the union holds the immediate data (network order).
        imm_data: with_imm.then(|| u32::from_be(unsafe { w.imm_data_invalidated_rkey_union.imm_data })),
        qp_num: w.qp_num,
        src_qp: w.src_qp,
        vendor_err: w.vendor_err,
        // SAFETY: a `u32` union field (any bits are valid); with IBV_WC_WITH_INV set it holds the
        // invalidated rkey (host order).
        invalidated_rkey: with_inv.then_some(unsafe { w.imm_data_invalidated_rkey_union.invalidated_rkey }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qp_states_round_trip() {
        for s in [
            QpState::Reset,
            QpState::Init,
            QpState::Rtr,
            QpState::Rts,
            QpState::Sqd,
            QpState::Sqe,
            QpState::Err,
        ] {
            assert_eq!(qp_state_from_ibv(qp_state_to_ibv(s)), s);
            assert_eq!(qp_state_from_code(qp_state_code(s)), s);
        }
        assert_eq!(qp_state_to_ibv(QpState::Rts), 3);
    }

    #[test]
    fn mtu_and_port_values() {
        assert_eq!(mtu_to_ibv(Mtu::Mtu4096), ibv_mtu::IBV_MTU_4096);
        assert_eq!(mtu_from_ibv(ibv_mtu::IBV_MTU_256), Mtu::Mtu256);
        assert_eq!(port_state_from_ibv(ibv_port_state::IBV_PORT_ACTIVE), PortState::Active);
        assert_eq!(port_state_from_ibv(5), PortState::Other(5));
        assert_eq!(link_layer_from_ibv(2), LinkLayer::Ethernet);
        assert_eq!(link_layer_from_ibv(1), LinkLayer::InfiniBand);
    }

    #[test]
    fn wc_conversion_reads_imm_only_when_flagged() {
        // SAFETY: `ibv_wc` is plain C data; all-zero is a valid value.
        let mut w: ibv_wc = unsafe { std::mem::zeroed() };
        w.wr_id = 9;
        w.opcode = ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM;
        w.byte_len = 64;
        w.imm_data_invalidated_rkey_union.imm_data = 0x1234_5678u32.to_be();
        w.status = 12;
        let wc = wc_from_ibv(&w, false);
        assert_eq!(wc.imm_data, None);
        assert_eq!(wc.status, WcStatus::IBV_WC_RETRY_EXC_ERR);
        w.wc_flags = ibv_wc_flags::IBV_WC_WITH_IMM.0;
        let wc = wc_from_ibv(&w, false);
        assert_eq!(wc.imm_data, Some(0x1234_5678));
        assert_eq!((wc.wr_id, wc.opcode, wc.byte_len), (9, WcOpcode::IBV_WC_RECV_RDMA_WITH_IMM, 64));
        assert_eq!(wc.invalidated_rkey, None);
    }

    #[test]
    fn wc_conversion_reads_the_invalidated_rkey_when_flagged() {
        // SAFETY: `ibv_wc` is plain C data; all-zero is a valid value.
        let mut w: ibv_wc = unsafe { std::mem::zeroed() };
        w.opcode = ibv_wc_opcode::IBV_WC_RECV;
        w.imm_data_invalidated_rkey_union.invalidated_rkey = 0x8000_0786;
        w.wc_flags = ibv_wc_flags::IBV_WC_GRH.0;
        assert_eq!(wc_from_ibv(&w, true).invalidated_rkey, None, "a plain receive");
        w.wc_flags = ibv_wc_flags::IBV_WC_WITH_INV.0;
        assert_eq!(wc_from_ibv(&w, false).invalidated_rkey, Some(0x8000_0786));
        assert_eq!(wc_from_ibv(&w, false).imm_data, None);
        // What rxe (Linux 6.1) reports: GRH | the kernel's IB_WC_WITH_INVALIDATE bit.
        w.wc_flags = 0x5;
        assert_eq!(wc_from_ibv(&w, true).invalidated_rkey, Some(0x8000_0786), "rxe");
        assert_eq!(wc_from_ibv(&w, false).invalidated_rkey, None, "IBV_WC_IP_CSUM_OK elsewhere");
    }
}
