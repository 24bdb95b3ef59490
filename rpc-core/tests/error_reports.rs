//! What `fn main() -> Result<(), E>` prints for the errors a user's `main` returns with `?`: the
//! `Debug` form, which reads as the `Display` text (plus any source it does not already say), not
//! a struct dump; `{:#?}` still shows the fields.

use rpc_core::{Client, ClientConfig, PollingPolicy, Server, ServerError, Transport};

const POLLING: PollingPolicy = PollingPolicy::SpinThenYield { spins: 64 };

#[test]
fn a_server_error_debug_reads_as_its_display() {
    let first = Server::builder().transport(Transport::Sim).polling(POLLING).spawn("127.0.0.1:0").unwrap();
    let addr = first.local_addr();
    let Err(e) = Server::builder().transport(Transport::Sim).polling(POLLING).spawn(addr) else {
        panic!("a second server on {addr}")
    };
    assert!(matches!(e, ServerError::Listen { .. }), "{e:#?}");
    let text = e.to_string();
    assert!(text.starts_with("listen on ") && text.contains("Address already in use"), "{text}");
    // The OS error is in the text already: said once, no `Caused by`.
    assert_eq!(format!("{e:?}"), text);
    let boxed: Box<dyn std::error::Error> = Box::new(e);
    assert_eq!(format!("Error: {boxed:?}"), format!("Error: {text}"));
    let ServerError::Listen { .. } = boxed.downcast_ref::<ServerError>().unwrap() else { unreachable!() };
    assert!(format!("{boxed:#?}").starts_with("Listen {"), "{boxed:#?}");
    first.shutdown();
}

#[test]
fn a_connect_error_debug_reads_as_its_display() {
    // A port nothing listens on: bound, then closed.
    let addr = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let config = ClientConfig::default().transport(Transport::Sim).polling(POLLING);
    let e = Client::connect_with(addr, &config).expect_err("no server");
    let text = e.to_string();
    assert_eq!(text, format!("UNAVAILABLE: connect: {addr}: Connection refused (os error 111)"));
    assert_eq!(format!("{e:?}"), text);
    let boxed: Box<dyn std::error::Error> = Box::new(e);
    assert_eq!(format!("{boxed:?}"), text);
    assert!(format!("{boxed:#?}").starts_with("Status {"), "{boxed:#?}");
}
