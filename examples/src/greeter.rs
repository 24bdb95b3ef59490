//! The Greeter of proto/helloworld.proto: answers "Hello NAME".

use rpc_core::codegen::{Reply, RequestContext, Status};

use crate::helloworld::greeter_server::Greeter;
use crate::helloworld::{HelloReply, HelloRequest};

/// Longest name accepted, in bytes.
pub const MAX_NAME: usize = 1024;

/// The example Greeter.
#[derive(Debug, Default, Clone, Copy)]
pub struct MyGreeter;

impl Greeter for MyGreeter {
    fn say_hello(&self, _ctx: &RequestContext, request: HelloRequest) -> Reply<HelloReply> {
        if request.name.len() > MAX_NAME {
            return Status::invalid_argument(format!(
                "name of {} bytes is over {MAX_NAME}",
                request.name.len()
            ))
            .into();
        }
        HelloReply { message: format!("Hello {}", request.name) }.into()
    }
}
