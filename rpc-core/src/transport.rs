//! Which NIC provider to run on, chosen at run time; below this point everything is generic over
//! `P: Provider`.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::verbs::rc::{Endpoint, RcConfig};
use crate::verbs::{Context, DeviceSelector, GidType, LinkLayer, Provider, QueuePair, Result, VerbsError};

/// The transport of a server or client.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Transport {
    /// The built-in software NIC (in-process hosts). The default.
    #[default]
    Sim,
    /// An RDMA NIC through libibverbs (cargo feature `ibverbs`).
    Rdma {
        /// Device name (`mlx5_0`, `rxe0`) or index; empty = the first device.
        device: String,
        /// Port number, 1-based (perftest `-i`). Usually 1.
        port: u8,
        /// GID index (perftest `-x`); -1 = automatic (RoCEv2 IPv4-mapped first, then link-local).
        gid_index: i32,
    },
}

impl Transport {
    /// `sim`, or `rdma` with the first device, port 1 and automatic GID choice.
    ///
    /// # Errors
    /// A message naming the accepted values.
    pub fn parse(s: &str) -> std::result::Result<Transport, String> {
        match s {
            "sim" => Ok(Transport::Sim),
            "rdma" => Ok(Transport::Rdma { device: String::new(), port: 1, gid_index: -1 }),
            _ => Err(format!("transport {s:?}: expected sim or rdma")),
        }
    }

    /// The RDMA transport on this machine, or a clear error when the library was built without it.
    #[cfg_attr(feature = "ibverbs", allow(dead_code))]
    pub(crate) fn rdma_unavailable() -> crate::Status {
        crate::Status::unavailable(
            "transport rdma: this build of rpc-core has no libibverbs provider (cargo feature `ibverbs` \
             with the ibverbs provider merged); use transport sim",
        )
    }
}

/// A device opened for the runtime: context, port and the chosen GID index.
pub(crate) struct Device<P: Provider> {
    pub(crate) ctx: P::Context,
    pub(crate) rc: RcConfig,
    pub(crate) lid: u16,
    pub(crate) gid: crate::verbs::Gid,
    pub(crate) mtu: crate::verbs::Mtu,
}

impl<P: Provider> Device<P> {
    /// Opens `selector`, queries `port` and picks the GID (`gid_index` -1 = automatic).
    pub(crate) fn open(selector: &DeviceSelector, port: u8, gid_index: i32) -> Result<Device<P>> {
        let ctx = P::open(selector)?;
        let pattr = ctx.query_port(port)?;
        let table = ctx.gid_table(port)?;
        let entry = if gid_index >= 0 {
            table.iter().find(|e| e.index == gid_index as u32).copied().ok_or_else(|| {
                VerbsError::InvalidArgument {
                    call: "ibv_query_gid",
                    reason: format!("GID index {gid_index} is empty or absent on port {port}"),
                }
            })?
        } else {
            let rank = |e: &crate::verbs::GidEntry| match (
                e.gid_type,
                e.gid.is_ipv4_mapped(),
                e.gid.is_link_local(),
            ) {
                (GidType::RoceV2, true, false) => 0,
                (GidType::RoceV2, _, false) => 1,
                (GidType::RoceV2, _, true) => 2,
                _ => 3,
            };
            match table.iter().filter(|e| !e.gid.is_zero()).min_by_key(|e| rank(e)) {
                Some(e) => *e,
                None if pattr.link_layer == LinkLayer::InfiniBand => crate::verbs::GidEntry {
                    index: 0,
                    gid: crate::verbs::Gid::default(),
                    gid_type: GidType::Ib,
                },
                None => {
                    return Err(VerbsError::InvalidArgument {
                        call: "ibv_query_gid",
                        reason: format!("port {port} has no usable GID"),
                    })
                }
            }
        };
        tracing::debug!(device = ctx.device_name(), port, gid_index = entry.index, gid = %entry.gid, "GID chosen");
        let rc = RcConfig {
            port_num: port,
            gid_index: entry.index as u8,
            link_layer: pattr.link_layer,
            ..RcConfig::default()
        };
        Ok(Device { ctx, rc, lid: pattr.lid, gid: entry.gid, mtu: pattr.active_mtu })
    }

    /// This side's endpoint for `qp`, with a fresh PSN.
    pub(crate) fn endpoint(&self, qp: &P::QueuePair) -> Endpoint {
        Endpoint { qp_num: qp.qp_num(), psn: fresh_psn(), lid: self.lid, gid: self.gid, mtu: self.mtu }
    }
}

/// A 24-bit starting PSN that differs between connections.
fn fresh_psn() -> u32 {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    (nanos.wrapping_mul(2_654_435_761)) & 0x00ff_ffff
}
