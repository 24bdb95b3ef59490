//! The module-collision protos (`proto/codegen/collide/`) served on `sim` and called through their
//! stubs, in both generated trees: hand-nested modules and prost-build's include file. The
//! messages' modules are renamed (`shop_`, `type_`, `node_`), the packages' modules are not, and
//! every value travels through both.

use codegen_tests::collide_services::CollideImpl;
use rpc_core::codegen::{ClientConfig, Service};
use rpc_core::{PollingPolicy, Server, Transport};

/// Yield after a few empty polls: the tests share two cores.
const POLLING: PollingPolicy = PollingPolicy::SpinThenYield { spins: 64 };

/// One end-to-end run over the tree `$collide` (its `codegen::collide` module).
macro_rules! end_to_end {
    ($name:ident, $($collide:ident)::+) => {
        #[test]
        fn $name() {
            use $($collide)::+ as collide;
            let server = Server::builder()
                .transport(Transport::Sim)
                .polling(POLLING)
                .add_service(collide::store_server::StoreServer::new(CollideImpl))
                .add_service(collide::shop::v1::orders_server::OrdersServer::new(CollideImpl))
                .add_service(collide::deep::er::tree_server::TreeServer::new(CollideImpl))
                .add_service(collide::deep::er::node::branch_server::BranchServer::new(CollideImpl))
                .spawn("127.0.0.1:0")
                .expect("spawn the server on sim");
            let config = ClientConfig::default().transport(Transport::Sim).polling(POLLING);

            let store = collide::store_client::StoreClient::connect_with(server.local_addr(), &config)
                .expect("connect");
            let item = collide::shop_::Item { name: "pen".into(), price: 3 };
            let shop = store.stock(&item).expect("Stock");
            assert_eq!(shop.items, vec![item.clone(), item.clone()]);
            assert_eq!(shop.kind(), collide::shop_::Kind::Books);
            assert_eq!(shop.owner, Some(collide::shop_::Owner::Company(7)));
            assert_eq!(shop.listed, Some(collide::shop::Item { sku: "listed".into() }));
            assert_eq!(shop.logo, prost::bytes::Bytes::from_static(b"\x89PNG"));
            let labelled = store.label(&collide::type_::Tag { v: "x".into() }).expect("Label");
            assert_eq!(labelled.tag.expect("tag").v, "label:x");
            let listed = store.list(&collide::shop::Item { sku: "s1".into() }).expect("List");
            assert_eq!(listed, collide::shop_::Item { name: "s1".into(), price: 1 });

            let orders = collide::shop::v1::orders_client::OrdersClient::new(store.into_client());
            let order = orders.place(&item).expect("Place");
            assert_eq!(order.nested, Some(item));
            assert_eq!(order.listed.as_ref().expect("listed").sku, "sku-pen");
            assert_eq!(order.kind(), collide::shop_::Kind::Tools);
            assert_eq!(order.food(), collide::shop::Kind::Food);

            let tree = collide::deep::er::tree_client::TreeClient::new(orders.into_client());
            let leaf = collide::deep::er::node_::Leaf { n: 41 };
            assert_eq!(tree.grow(&leaf).expect("Grow").leaf, Some(collide::deep::er::node_::Leaf { n: 42 }));
            let branch = collide::deep::er::node::branch_client::BranchClient::new(tree.into_client());
            let forked = branch.fork(&leaf).expect("Fork");
            assert_eq!(forked.s, "fork:41");
            assert_eq!(forked.nested, Some(leaf));
            assert_eq!(
                <collide::store_server::StoreServer<CollideImpl> as Service>::NAME,
                "codegen.collide.Store"
            );
        }
    };
}

end_to_end!(collisions_with_hand_nested_modules_on_sim, codegen_tests::codegen::collide);
end_to_end!(collisions_through_the_include_file_on_sim, codegen_tests::with_include_file::codegen::collide);
