//! Implementations of the hostile protos' services (`crate::hostile`), with answers a test can
//! predict: each reply says which handler answered.

use rpc_core::codegen::{Reply, RequestContext};

use crate::hostile::{a, b, control, many};

/// Implements every service of the hostile protos.
#[derive(Debug, Default, Clone, Copy)]
pub struct HostileImpl;

impl a::mirror_server::Mirror for HostileImpl {
    fn deep(&self, _ctx: &RequestContext, request: a::l1::l2::l3::L4) -> Reply<a::l1::l2::l3::L4> {
        a::l1::l2::l3::L4 { v: format!("a:{}", request.v) }.into()
    }
    fn reflect(&self, _ctx: &RequestContext, request: a::MirrorServer) -> Reply<a::MirrorServer> {
        a::MirrorServer { s: request.s.chars().rev().collect() }.into()
    }
}

impl b::mirror_server::Mirror for HostileImpl {
    fn deep(&self, _ctx: &RequestContext, request: a::l1::l2::l3::L4) -> Reply<b::L1> {
        b::L1 { n: request.v.len() as i32 }.into()
    }
    fn back(&self, _ctx: &RequestContext, request: b::L1) -> Reply<a::MirrorServer> {
        a::MirrorServer { s: format!("b:{}", request.n) }.into()
    }
}

impl a::nothing_server::Nothing for HostileImpl {}

impl control::control_server::Control for HostileImpl {
    fn say(&self, _ctx: &RequestContext, request: control::Text) -> Reply<control::Text> {
        control::Text { s: format!("said {}", request.s) }.into()
    }
}

include!(concat!(env!("OUT_DIR"), "/hostile-protos/many_impl.rs"));
