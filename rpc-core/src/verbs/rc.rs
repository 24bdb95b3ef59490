//! Bringing an RC QP from RESET to RTS against a remote endpoint, the same way on every provider.

use super::{AccessFlags, AhAttr, Gid, GlobalRoute, LinkLayer, Mtu, QpAttr, QpState, QueuePair, Result};

/// What one side tells the other to connect an RC QP (exchanged out of band, e.g. over TCP).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// QP number.
    pub qp_num: u32,
    /// First PSN this side will send (24 bits).
    pub psn: u32,
    /// LID (InfiniBand; 0 on RoCE and `sim`).
    pub lid: u16,
    /// GID of the chosen GID index.
    pub gid: Gid,
    /// Active MTU of this side's port.
    pub mtu: Mtu,
}

/// Local connection parameters, with the defaults perftest and most RC applications use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RcConfig {
    /// Port number (1-based). Default 1.
    pub port_num: u8,
    /// Local GID index (`sgid_index`). Default 0.
    pub gid_index: u8,
    /// Link layer of the port: with `InfiniBand` and no GID use the LID; otherwise a GRH is used.
    pub link_layer: LinkLayer,
    /// Remote access granted to the peer on this QP. Default `LOCAL_WRITE | REMOTE_WRITE`: the
    /// runtime's peers only RDMA WRITE (into rings); add `REMOTE_READ` (or `REMOTE_ATOMIC`) for a
    /// QP whose peer must read (the MR or window must grant it too).
    pub access: AccessFlags,
    /// ACK timeout code: 4.096 µs × 2^timeout. Default 14 (≈ 67 ms).
    pub timeout: u8,
    /// Transport retries (0..=7). Default 7.
    pub retry_cnt: u8,
    /// RNR retries (0..=7, 7 = forever). Default 7: a safety net, flow control is by credits.
    pub rnr_retry: u8,
    /// RNR NAK timer code (0..=31). Default 12 (0.64 ms).
    pub min_rnr_timer: u8,
    /// Outstanding RDMA READs in each direction. Default 1.
    pub max_rd_atomic: u8,
    /// GRH hop limit. Default 64.
    pub hop_limit: u8,
}

impl Default for RcConfig {
    fn default() -> Self {
        RcConfig {
            port_num: 1,
            gid_index: 0,
            link_layer: LinkLayer::Ethernet,
            access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 1,
            hop_limit: 64,
        }
    }
}

/// Moves `qp` RESET → INIT → RTR → RTS, connected to `remote`. `local` is this side's own endpoint
/// (its `psn` is used as the send PSN, its `mtu` with the remote's to pick the path MTU).
///
/// # Errors
/// The first failing transition's [`super::VerbsError::QpTransition`].
pub fn connect<Q: QueuePair>(qp: &Q, cfg: &RcConfig, local: &Endpoint, remote: &Endpoint) -> Result<()> {
    let mut init = QpAttr::new(QpState::Init);
    init.port_num = Some(cfg.port_num);
    init.pkey_index = Some(0);
    init.access = Some(cfg.access);
    qp.modify(&init)?;

    let mut rtr = QpAttr::new(QpState::Rtr);
    rtr.path_mtu = Some(local.mtu.min(remote.mtu));
    rtr.dest_qp_num = Some(remote.qp_num);
    rtr.rq_psn = Some(remote.psn);
    rtr.max_dest_rd_atomic = Some(cfg.max_rd_atomic);
    rtr.min_rnr_timer = Some(cfg.min_rnr_timer);
    let use_grh = !(cfg.link_layer == LinkLayer::InfiniBand && remote.gid.is_zero());
    rtr.ah = Some(AhAttr {
        dlid: remote.lid,
        sl: 0,
        port_num: cfg.port_num,
        grh: use_grh.then_some(GlobalRoute {
            dgid: remote.gid,
            sgid_index: cfg.gid_index,
            flow_label: 0,
            hop_limit: cfg.hop_limit,
            traffic_class: 0,
        }),
    });
    qp.modify(&rtr)?;

    let mut rts = QpAttr::new(QpState::Rts);
    rts.sq_psn = Some(local.psn);
    rts.timeout = Some(cfg.timeout);
    rts.retry_cnt = Some(cfg.retry_cnt);
    rts.rnr_retry = Some(cfg.rnr_retry);
    rts.max_rd_atomic = Some(cfg.max_rd_atomic);
    qp.modify(&rts)
}
