//! Implementations of the module-collision services, once for the hand-nested modules
//! (`crate::codegen::collide`) and once for the include-file tree (`crate::with_include_file`):
//! the same code, since the generated paths are the same. Each answer is computed from the
//! request, through the renamed message modules.

use rpc_core::codegen::{Reply, RequestContext};

/// Implements every service of the module-collision protos.
#[derive(Debug, Default, Clone, Copy)]
pub struct CollideImpl;

/// The impls for one generated tree, `$collide` being its `codegen::collide` module.
macro_rules! collide_impls {
    ($($collide:ident)::+) => {
        const _: () = {
            use $($collide)::+ as collide;

            impl collide::store_server::Store for CollideImpl {
                fn stock(&self, _ctx: &RequestContext, request: collide::shop_::Item) -> Reply<collide::Shop> {
                    collide::Shop {
                        items: vec![request.clone(), request],
                        kind: collide::shop_::Kind::Books as i32,
                        owner: Some(collide::shop_::Owner::Company(7)),
                        listed: Some(collide::shop::Item { sku: "listed".into() }),
                        logo: prost::bytes::Bytes::from_static(b"\x89PNG"),
                    }
                    .into()
                }
                fn label(&self, _ctx: &RequestContext, request: collide::type_::Tag) -> Reply<collide::Type> {
                    collide::Type { tag: Some(collide::type_::Tag { v: format!("label:{}", request.v) }) }.into()
                }
                fn list(&self, _ctx: &RequestContext, request: collide::shop::Item) -> Reply<collide::shop_::Item> {
                    collide::shop_::Item { name: request.sku, price: 1 }.into()
                }
            }

            impl collide::shop::v1::orders_server::Orders for CollideImpl {
                fn place(
                    &self,
                    _ctx: &RequestContext,
                    request: collide::shop_::Item,
                ) -> Reply<collide::shop::v1::Order> {
                    collide::shop::v1::Order {
                        listed: Some(collide::shop::Item { sku: format!("sku-{}", request.name) }),
                        nested: Some(request),
                        kind: collide::shop_::Kind::Tools as i32,
                        food: collide::shop::Kind::Food as i32,
                    }
                    .into()
                }
            }

            impl collide::deep::er::tree_server::Tree for CollideImpl {
                fn grow(
                    &self,
                    _ctx: &RequestContext,
                    request: collide::deep::er::node_::Leaf,
                ) -> Reply<collide::deep::er::Node> {
                    collide::deep::er::Node { leaf: Some(collide::deep::er::node_::Leaf { n: request.n + 1 }) }.into()
                }
            }

            impl collide::deep::er::node::branch_server::Branch for CollideImpl {
                fn fork(
                    &self,
                    _ctx: &RequestContext,
                    request: collide::deep::er::node_::Leaf,
                ) -> Reply<collide::deep::er::node::Leaf> {
                    collide::deep::er::node::Leaf { s: format!("fork:{}", request.n), nested: Some(request) }.into()
                }
            }
        };
    };
}

collide_impls!(crate::codegen::collide);
collide_impls!(crate::with_include_file::codegen::collide);
