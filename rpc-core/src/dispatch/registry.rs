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

    /// The service and full name of `method` (the worker looks up through
    /// [`Registry::lookup_cached`]).
    #[cfg(test)]
    pub(crate) fn lookup(&self, method: MethodId) -> Option<(&dyn ErasedService, &'static str)> {
        self.methods.get(&method).map(|&(i, name)| (&*self.services[i], name))
    }

    /// The service and full name of `method`, through `last`, the last method its caller looked
    /// up (the table's answer, remembered): a call to that
    /// method again (a run of calls to one method, the common case) takes the service by index,
    /// with no hash lookup (about 20 instructions a call); another method is looked up and
    /// becomes the last. The table never changes once the server runs, so the cached answer
    /// (an unknown method's too) stays right.
    #[inline]
    pub(crate) fn lookup_cached(
        &self,
        last: &mut LastMethod,
        method: MethodId,
    ) -> Option<(&dyn ErasedService, &'static str)> {
        if last.method != Some(method) {
            *last = LastMethod { method: Some(method), found: self.methods.get(&method).copied() };
        }
        last.found.and_then(|(i, name)| self.services.get(i).map(|s| (&**s, name)))
    }
}

/// The last method a worker looked up and what its [`Registry`] gave for it (the service's index
/// and the method's full name): [`Registry::lookup_cached`]. Empty at first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct LastMethod {
    method: Option<MethodId>,
    found: Option<(usize, &'static str)>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dispatch::service::MethodDesc;

    /// Not zero-sized: each registered box has an address of its own (compared below).
    struct First(#[allow(dead_code)] u64);
    impl Service for First {
        const NAME: &'static str = "t.First";
        const METHODS: &'static [MethodDesc] =
            &[MethodDesc { id: 11, name: "/t.First/A" }, MethodDesc { id: 12, name: "/t.First/B" }];
        fn call(&self, _: MethodId, _: &RequestContext, _: Body<'_>, _: &mut ReplyWriter<'_>) {}
    }

    struct Second(#[allow(dead_code)] u64);
    impl Service for Second {
        const NAME: &'static str = "t.Second";
        const METHODS: &'static [MethodDesc] = &[MethodDesc { id: 21, name: "/t.Second/C" }];
        fn call(&self, _: MethodId, _: &RequestContext, _: Body<'_>, _: &mut ReplyWriter<'_>) {}
    }

    fn registry() -> Registry {
        let mut r = Registry::default();
        r.add(First(1));
        r.add(Second(2));
        r
    }

    /// The service a lookup found, by address (the registry's own boxes), and the name.
    fn seen(found: Option<(&dyn ErasedService, &'static str)>) -> Option<(*const (), &'static str)> {
        found.map(|(s, name)| (s as *const dyn ErasedService as *const (), name))
    }

    /// Through the last-method cache, every sequence of lookups (repeats, switches, unknown ids,
    /// an unknown id repeated) finds what the hash lookup finds.
    #[test]
    fn cached_lookups_find_what_the_table_finds() {
        let r = registry();
        let mut last = LastMethod::default();
        for m in [11, 11, 12, 21, 21, 11, 99, 99, 12, 0, 21, 99, 11] {
            assert_eq!(seen(r.lookup_cached(&mut last, m)), seen(r.lookup(m)), "method {m}");
        }
    }

    /// A call to the last method is answered from the cache, not the table: a cache naming
    /// another entry for it (which a real one never does) is what comes back.
    #[test]
    fn a_repeated_method_skips_the_table() {
        let r = registry();
        let mut last = LastMethod::default();
        assert_eq!(seen(r.lookup_cached(&mut last, 11)).map(|f| f.1), Some("/t.First/A"));
        assert_eq!(last, LastMethod { method: Some(11), found: Some((0, "/t.First/A")) });
        last.found = Some((1, "planted"));
        let (svc, name) = seen(r.lookup_cached(&mut last, 11)).expect("found");
        assert_eq!(name, "planted", "a repeat of the last method looked in the table");
        assert_eq!(Some(svc), seen(r.lookup(21)).map(|f| f.0), "the planted index's service");
    }
}
