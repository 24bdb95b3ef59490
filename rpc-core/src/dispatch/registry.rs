//! The server's method table: method id → service and full name.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use super::reply::{ReplyWriter, RequestContext};
use super::service::{Body, MethodId, Service};

/// Hasher for keys that are already hashes (method ids, QPNs): the value itself.
#[derive(Default)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8) | u64::from(*b);
        }
    }
    fn write_u32(&mut self, v: u32) {
        self.0 = u64::from(v).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// A `HashMap` keyed by ids.
pub(crate) type IdMap<V> = HashMap<u32, V, BuildHasherDefault<IdHasher>>;

/// A service with its associated constants erased, callable through `dyn`.
pub(crate) trait ErasedService: Send + Sync + 'static {
    fn call(&self, method: MethodId, ctx: &RequestContext, body: Body<'_>, out: &mut ReplyWriter<'_>);
}

impl<S: Service> ErasedService for S {
    fn call(&self, method: MethodId, ctx: &RequestContext, body: Body<'_>, out: &mut ReplyWriter<'_>) {
        Service::call(self, method, ctx, body, out)
    }
}

/// Every registered method.
#[derive(Default)]
pub(crate) struct Registry {
    services: Vec<Box<dyn ErasedService>>,
    methods: IdMap<(usize, &'static str)>,
    /// Duplicate ids found while registering: (id, first name, second name).
    pub(crate) duplicates: Vec<(MethodId, &'static str, &'static str)>,
}

impl Registry {
    pub(crate) fn add<S: Service>(&mut self, svc: S) {
        let idx = self.services.len();
        self.services.push(Box::new(svc));
        for m in S::METHODS {
            if let Some(&(_, first)) = self.methods.get(&m.id) {
                self.duplicates.push((m.id, first, m.name));
            } else {
                self.methods.insert(m.id, (idx, m.name));
            }
        }
    }

    /// The service and full name of `method`.
    #[inline]
    pub(crate) fn lookup(&self, method: MethodId) -> Option<(&dyn ErasedService, &'static str)> {
        self.methods.get(&method).map(|&(i, name)| (&*self.services[i], name))
    }
}
