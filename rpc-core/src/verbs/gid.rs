//! Choosing the local GID index automatically, the same way on every provider.
//!
//! A port's GID table holds several entries per network address (RoCE v1 and v2 for each IPv6
//! and IPv4-mapped address of the netdev). Which one an RC QP should use as its source GID
//! (`sgid_index`) follows from the link layer and the entry types:
//!
//! | rank | entry | why |
//! |---|---|---|
//! | 1 | RoCE v2, IPv4-mapped (`::ffff:a.b.c.d`), not IPv4 link-local (`169.254/16`) | routable, what perftest and most deployments use |
//! | 2 | RoCE v2, global IPv6 | routable |
//! | 3 | RoCE v2, link-local IPv6 (`fe80::/10`) or IPv4 link-local | one L2 segment; what Soft-RoCE on a dummy netdev has |
//! | 4 | RoCE v1 (same order of addresses) | layer-2 only, older fabrics |
//! | 5 | anything else (an IB-typed entry on Ethernet, sim entries) | last resort |
//!
//! On InfiniBand the LID routes the traffic and no GRH is needed: [`choose_gid`] answers
//! [`GidChoice::Lid`]. Ties break on the lowest index. An explicit index (perftest's `-x`) is
//! taken as is once it is known to exist ([`select_gid`]).

use super::rc::{Endpoint, RcConfig};
use super::{Context, Gid, GidEntry, GidType, LinkLayer, Mtu, Provider, Result, VerbsError};

/// What [`choose_gid`] picked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GidChoice {
    /// Address the port through this GID table entry (RoCE, the software NIC): GRH with it as source.
    Gid(GidEntry),
    /// InfiniBand: route by LID, no GRH (the endpoint advertises a zero GID).
    Lid,
}

/// The preference rank of one GID table entry on a GID-addressed link (lower is better); `None`
/// for an empty entry.
fn rank(e: &GidEntry) -> Option<u8> {
    if e.gid.is_zero() {
        return None;
    }
    let ipv4_link_local = e.gid.is_ipv4_mapped() && e.gid.0[12] == 169 && e.gid.0[13] == 254;
    let address = if e.gid.is_ipv4_mapped() && !ipv4_link_local {
        0
    } else if !e.gid.is_link_local() && !ipv4_link_local {
        1
    } else {
        2
    };
    Some(match e.gid_type {
        GidType::RoceV2 => address,
        GidType::RoceV1 => 3 + address,
        _ => 6 + address,
    })
}

/// Chooses the local address of a port from its GID table (see the module docs for the order).
///
/// Returns `None` when the link is GID-addressed and the table has no usable (non-zero) entry.
pub fn choose_gid(table: &[GidEntry], link_layer: LinkLayer) -> Option<GidChoice> {
    if link_layer == LinkLayer::InfiniBand {
        return Some(GidChoice::Lid);
    }
    table
        .iter()
        .filter_map(|e| rank(e).map(|r| (r, e.index, e)))
        .min_by_key(|&(r, index, _)| (r, index))
        .map(|(_, _, e)| GidChoice::Gid(*e))
}

/// The resolved local address of one port: what a QP of this side puts in its [`Endpoint`] and
/// [`RcConfig`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalAddress {
    /// Port number (1-based).
    pub port_num: u8,
    /// Link layer of the port.
    pub link_layer: LinkLayer,
    /// GID index used as `sgid_index` (0 when routing by LID).
    pub gid_index: u8,
    /// The GID advertised to the peer (zero when routing by LID on InfiniBand).
    pub gid: Gid,
    /// Type of the chosen entry (`None` when routing by LID).
    pub gid_type: Option<GidType>,
    /// The port's LID (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// Active MTU of the port.
    pub active_mtu: Mtu,
}

impl LocalAddress {
    /// This side's endpoint for a QP with number `qp_num` that starts sending at `psn` (24 bits).
    pub fn endpoint(&self, qp_num: u32, psn: u32) -> Endpoint {
        Endpoint { qp_num, psn: psn & 0x00ff_ffff, lid: self.lid, gid: self.gid, mtu: self.active_mtu }
    }

    /// [`RcConfig::default`] with this port, GID index and link layer filled in.
    pub fn rc_config(&self) -> RcConfig {
        RcConfig {
            port_num: self.port_num,
            gid_index: self.gid_index,
            link_layer: self.link_layer,
            ..RcConfig::default()
        }
    }
}

/// Resolves the local address of `port_num` on an open device: with `gid_index < 0` (perftest's
/// `-x -1`, the default) it chooses automatically with [`choose_gid`]; otherwise it checks that the
/// entry exists. The choice is logged at info level (device, port, index, GID, type).
///
/// # Errors
/// [`VerbsError::InvalidArgument`] for a port the device does not have, an index outside the
/// table or naming an empty entry (the message lists the entries that exist), or a GID-addressed
/// port without any GID.
pub fn select_gid<P: Provider>(ctx: &P::Context, port_num: u8, gid_index: i32) -> Result<LocalAddress> {
    let port = ctx.query_port(port_num)?;
    let table = ctx.gid_table(port_num)?;
    let listing = || {
        table
            .iter()
            .map(|e| format!("[{}] {} {:?}", e.index, e.gid, e.gid_type))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let choice = if gid_index < 0 {
        choose_gid(&table, port.link_layer).ok_or_else(|| VerbsError::InvalidArgument {
            call: "select_gid",
            reason: format!(
                "{} port {port_num} ({:?}) has no usable GID; is the netdev up and addressed?",
                ctx.device_name(),
                port.link_layer
            ),
        })?
    } else {
        let entry = table.iter().find(|e| e.index == gid_index as u32 && gid_index <= i32::from(u8::MAX));
        GidChoice::Gid(*entry.ok_or_else(|| VerbsError::InvalidArgument {
            call: "select_gid",
            reason: format!(
                "GID index {gid_index} is empty or out of range on {} port {port_num}; entries: [{}] (use -1 to choose automatically)",
                ctx.device_name(),
                listing()
            ),
        })?)
    };
    let local = match choice {
        GidChoice::Gid(e) => LocalAddress {
            port_num,
            link_layer: port.link_layer,
            // `rank`-chosen entries come from the table; an index above 255 cannot be a `sgid_index`.
            gid_index: u8::try_from(e.index).map_err(|_| VerbsError::InvalidArgument {
                call: "select_gid",
                reason: format!("GID index {} does not fit sgid_index (0..=255)", e.index),
            })?,
            gid: e.gid,
            gid_type: Some(e.gid_type),
            lid: port.lid,
            active_mtu: port.active_mtu,
        },
        GidChoice::Lid => LocalAddress {
            port_num,
            link_layer: port.link_layer,
            gid_index: 0,
            gid: Gid::default(),
            gid_type: None,
            lid: port.lid,
            active_mtu: port.active_mtu,
        },
    };
    tracing::info!(
        device = ctx.device_name(),
        port = port_num,
        gid_index = local.gid_index,
        gid = %local.gid,
        gid_type = ?local.gid_type,
        lid = local.lid,
        automatic = gid_index < 0,
        "local address chosen"
    );
    Ok(local)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u32, gid: [u8; 16], gid_type: GidType) -> GidEntry {
        GidEntry { index, gid: Gid(gid), gid_type }
    }

    fn v4(a: u8, b: u8, c: u8, d: u8) -> [u8; 16] {
        [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, a, b, c, d]
    }

    const LINK_LOCAL: [u8; 16] =
        [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x02, 0x11, 0x22, 0xff, 0xfe, 0x33, 0x44, 0x55];
    const GLOBAL6: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];

    fn chosen_index(table: &[GidEntry], ll: LinkLayer) -> Option<u32> {
        match choose_gid(table, ll)? {
            GidChoice::Gid(e) => Some(e.index),
            GidChoice::Lid => None,
        }
    }

    #[test]
    fn prefers_roce_v2_ipv4_mapped_over_everything() {
        // The layout mlx5 shows for a port with a link-local IPv6 and an IPv4 address.
        let table = [
            entry(0, LINK_LOCAL, GidType::RoceV1),
            entry(1, LINK_LOCAL, GidType::RoceV2),
            entry(2, v4(192, 168, 1, 7), GidType::RoceV1),
            entry(3, v4(192, 168, 1, 7), GidType::RoceV2),
        ];
        assert_eq!(chosen_index(&table, LinkLayer::Ethernet), Some(3));
    }

    #[test]
    fn link_local_roce_v2_when_no_ipv4() {
        // What rxe on a dummy netdev has: a link-local IPv6 GID, v1 and v2.
        let table = [entry(0, LINK_LOCAL, GidType::RoceV1), entry(1, LINK_LOCAL, GidType::RoceV2)];
        assert_eq!(chosen_index(&table, LinkLayer::Ethernet), Some(1));
        // Order of the table does not matter.
        let table = [entry(0, LINK_LOCAL, GidType::RoceV2), entry(1, LINK_LOCAL, GidType::RoceV1)];
        assert_eq!(chosen_index(&table, LinkLayer::Ethernet), Some(0));
    }

    #[test]
    fn ipv4_link_local_ranks_below_global_ipv6() {
        let table = [
            entry(0, v4(169, 254, 3, 4), GidType::RoceV2),
            entry(1, GLOBAL6, GidType::RoceV2),
            entry(2, LINK_LOCAL, GidType::RoceV2),
        ];
        assert_eq!(chosen_index(&table, LinkLayer::Ethernet), Some(1));
        let table = [entry(5, LINK_LOCAL, GidType::RoceV2), entry(4, v4(169, 254, 3, 4), GidType::RoceV2)];
        assert_eq!(chosen_index(&table, LinkLayer::Ethernet), Some(4), "tie on rank breaks on lowest index");
    }

    #[test]
    fn roce_v1_only_when_no_v2() {
        let table = [entry(0, LINK_LOCAL, GidType::RoceV1), entry(1, v4(10, 0, 0, 1), GidType::RoceV1)];
        assert_eq!(chosen_index(&table, LinkLayer::Ethernet), Some(1));
        // Even a link-local v2 beats a routable v1.
        let table = [entry(0, v4(10, 0, 0, 1), GidType::RoceV1), entry(7, LINK_LOCAL, GidType::RoceV2)];
        assert_eq!(chosen_index(&table, LinkLayer::Ethernet), Some(7));
    }

    #[test]
    fn zero_entries_are_never_chosen() {
        let table = [entry(0, [0; 16], GidType::RoceV2), entry(1, LINK_LOCAL, GidType::RoceV1)];
        assert_eq!(chosen_index(&table, LinkLayer::Ethernet), Some(1));
        assert_eq!(choose_gid(&[entry(0, [0; 16], GidType::RoceV2)], LinkLayer::Ethernet), None);
        assert_eq!(choose_gid(&[], LinkLayer::Ethernet), None);
    }

    #[test]
    fn infiniband_uses_the_lid() {
        let table = [entry(0, GLOBAL6, GidType::Ib)];
        assert_eq!(choose_gid(&table, LinkLayer::InfiniBand), Some(GidChoice::Lid));
        assert_eq!(choose_gid(&[], LinkLayer::InfiniBand), Some(GidChoice::Lid));
    }

    #[test]
    fn sim_link_takes_any_entry() {
        let table = [entry(0, GLOBAL6, GidType::Ib)];
        assert_eq!(chosen_index(&table, LinkLayer::Sim), Some(0));
        let table = [entry(0, GLOBAL6, GidType::Ib), entry(1, v4(10, 1, 1, 1), GidType::RoceV2)];
        assert_eq!(chosen_index(&table, LinkLayer::Sim), Some(1));
    }

    /// Collects the events of `f` (level and `name=value` fields) through a scoped subscriber.
    fn capture<T>(f: impl FnOnce() -> T) -> (T, Vec<(tracing::Level, String)>) {
        use std::sync::{Arc, Mutex};
        struct Capture(Arc<Mutex<Vec<(tracing::Level, String)>>>);
        struct Fields(String);
        impl tracing::field::Visit for Fields {
            fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                self.0 += &format!("{}={:?} ", f.name(), v);
            }
        }
        impl tracing::Subscriber for Capture {
            fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
                true
            }
            fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
                tracing::span::Id::from_u64(1)
            }
            fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
            fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
            fn event(&self, e: &tracing::Event<'_>) {
                let mut v = Fields(String::new());
                e.record(&mut v);
                self.0.lock().unwrap().push((*e.metadata().level(), v.0));
            }
            fn enter(&self, _: &tracing::span::Id) {}
            fn exit(&self, _: &tracing::span::Id) {}
        }
        let events = Arc::new(Mutex::new(Vec::new()));
        let out = tracing::subscriber::with_default(Capture(events.clone()), f);
        let events = events.lock().unwrap().clone();
        (out, events)
    }

    /// On the software NIC's table (RoCE v1, RoCE v2 and IB entries, IPv4-mapped, IPv4
    /// link-local, link-local and global IPv6 addresses) the automatic choice is the host's RoCE
    /// v2 entry, and `select_gid` says so once at info with the index, GID and type.
    #[test]
    fn select_gid_on_sim_chooses_roce_v2_and_logs_it_at_info() {
        use crate::verbs::sim::{Sim, SIM_GID_INDEX};
        let ctx = Sim::open(&crate::verbs::DeviceSelector::First).unwrap();
        let table = ctx.gid_table(1).unwrap();
        assert_eq!(chosen_index(&table, LinkLayer::Sim), Some(SIM_GID_INDEX), "{table:?}");
        let (local, events) = capture(|| select_gid::<Sim>(&ctx, 1, -1).unwrap());
        assert_eq!(
            (u32::from(local.gid_index), local.gid, local.gid_type),
            (SIM_GID_INDEX, ctx.gid(), Some(GidType::RoceV2))
        );
        let info: Vec<_> = events.iter().filter(|(l, _)| *l == tracing::Level::INFO).collect();
        assert_eq!(info.len(), 1, "{events:?}");
        let line = &info[0].1;
        for want in [
            format!("gid_index={SIM_GID_INDEX} "),
            format!("gid={} ", ctx.gid()),
            "gid_type=Some(RoceV2) ".into(),
        ] {
            assert!(line.contains(&want), "{want:?} not in {line:?}");
        }
    }

    #[test]
    fn local_address_builds_endpoint_and_config() {
        let local = LocalAddress {
            port_num: 2,
            link_layer: LinkLayer::Ethernet,
            gid_index: 3,
            gid: Gid(LINK_LOCAL),
            gid_type: Some(GidType::RoceV2),
            lid: 0,
            active_mtu: Mtu::Mtu1024,
        };
        let ep = local.endpoint(0x11, 0x0123_4567);
        assert_eq!(
            ep,
            Endpoint { qp_num: 0x11, psn: 0x23_4567, lid: 0, gid: Gid(LINK_LOCAL), mtu: Mtu::Mtu1024 }
        );
        let cfg = local.rc_config();
        assert_eq!((cfg.port_num, cfg.gid_index, cfg.link_layer), (2, 3, LinkLayer::Ethernet));
        assert_eq!(cfg.rnr_retry, RcConfig::default().rnr_retry);
    }
}
