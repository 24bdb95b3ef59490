//! Which NIC provider to run on, chosen at run time; below this point everything is generic over
//! `P: Provider`.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::verbs::rc::{Endpoint, RcConfig};
use crate::verbs::{DeviceSelector, Provider, QueuePair, Result};

/// Whether `ip` is this host's: loopback, or an address a socket can bind here (the kernel
/// binds only local addresses). A system call: control path only (the same-host path's
/// checks, [`crate::ClientConfig::same_host_shm`] and `ServerConfig::same_host_shm`).
/// An IPv4 address seen through a dual-stack socket (`::ffff:a.b.c.d`) is judged as IPv4.
pub(crate) fn is_local_ip(ip: std::net::IpAddr) -> bool {
    let ip = ip.to_canonical();
    ip.is_loopback() || std::net::UdpSocket::bind(std::net::SocketAddr::new(ip, 0)).is_ok()
}

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
    /// Opens `selector`, queries `port` and picks the GID with
    /// [`select_gid`](crate::verbs::gid::select_gid) (`gid_index` -1 = automatic; the choice is
    /// logged at info).
    pub(crate) fn open(selector: &DeviceSelector, port: u8, gid_index: i32) -> Result<Device<P>> {
        let ctx = P::open(selector)?;
        let local = crate::verbs::gid::select_gid::<P>(&ctx, port, gid_index)?;
        Ok(Device { ctx, rc: local.rc_config(), lid: local.lid, gid: local.gid, mtu: local.active_mtu })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::sim::{Sim, SIM_GID_INDEX};

    /// The runtime's device opens through `select_gid`: on sim's table (several entries and
    /// types) it takes the host's RoCE v2 entry, the GID the fabric delivers to.
    #[test]
    fn device_open_takes_select_gids_choice() {
        let dev = Device::<Sim>::open(&DeviceSelector::First, 1, -1).unwrap();
        assert_eq!(u32::from(dev.rc.gid_index), SIM_GID_INDEX);
        assert_eq!(dev.gid, dev.ctx.gid());
        let explicit = Device::<Sim>::open(&DeviceSelector::First, 1, 3).unwrap();
        assert_eq!(explicit.rc.gid_index, 3);
        assert!(explicit.gid.is_ipv4_mapped());
        assert!(Device::<Sim>::open(&DeviceSelector::First, 1, 5).is_err());
    }
}
