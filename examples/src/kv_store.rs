//! The key-value service of proto/kv.proto: an ordered map of byte values behind one lock
//! (an example, not a database: handlers run on the server's worker threads).

use std::collections::BTreeMap;
use std::sync::Mutex;

use bytes::Bytes;
use rpc_core::codegen::{Reply, RequestContext, Status};

use crate::kv::kv_server::Kv;
use crate::kv::{
    DeleteReply, DeleteRequest, Entry, GetReply, GetRequest, PutReply, PutRequest, ScanReply, ScanRequest,
};

/// Longest key, in bytes.
pub const MAX_KEY: usize = 256;
/// Largest value, in bytes (8 MiB).
pub const MAX_VALUE: usize = 8 << 20;
/// Most entries a Scan returns (also when `limit` is 0).
pub const MAX_SCAN: u32 = 1000;
/// Most value bytes one Scan returns; it stops early rather than exceed it.
pub const MAX_SCAN_BYTES: usize = 8 << 20;

/// The store.
#[derive(Debug, Default)]
pub struct KvStore {
    map: Mutex<BTreeMap<String, Bytes>>,
}

fn check_key(key: &str) -> Result<(), Status> {
    if key.is_empty() || key.len() > MAX_KEY {
        return Err(Status::invalid_argument(format!("key of {} bytes: must be 1..={MAX_KEY}", key.len())));
    }
    Ok(())
}

impl KvStore {
    fn map(&self) -> Result<std::sync::MutexGuard<'_, BTreeMap<String, Bytes>>, Status> {
        self.map.lock().map_err(|_| Status::internal("kv store lock poisoned"))
    }
}

impl Kv for KvStore {
    fn put(&self, _ctx: &RequestContext, r: PutRequest) -> Reply<PutReply> {
        let res = (|| {
            check_key(&r.key)?;
            if r.value.len() > MAX_VALUE {
                return Err(Status::invalid_argument(format!(
                    "value of {} bytes is over {MAX_VALUE}",
                    r.value.len()
                )));
            }
            let replaced = self.map()?.insert(r.key, r.value).is_some();
            Ok(PutReply { replaced })
        })();
        res.into()
    }

    fn get(&self, _ctx: &RequestContext, r: GetRequest) -> Reply<GetReply> {
        let res = (|| {
            check_key(&r.key)?;
            match self.map()?.get(&r.key) {
                Some(v) => Ok(GetReply { value: v.clone() }),
                None => Err(Status::new(rpc_core::Code::NotFound, format!("no key {:?}", r.key))),
            }
        })();
        res.into()
    }

    fn delete(&self, _ctx: &RequestContext, r: DeleteRequest) -> Reply<DeleteReply> {
        let res = (|| {
            check_key(&r.key)?;
            Ok(DeleteReply { existed: self.map()?.remove(&r.key).is_some() })
        })();
        res.into()
    }

    fn scan(&self, _ctx: &RequestContext, r: ScanRequest) -> Reply<ScanReply> {
        let res = (|| {
            let limit = if r.limit == 0 { MAX_SCAN } else { r.limit.min(MAX_SCAN) } as usize;
            let map = self.map()?;
            let mut entries = Vec::new();
            let mut bytes = 0usize;
            for (k, v) in map.range(r.start.clone()..).take(limit) {
                if r.with_values {
                    if bytes + v.len() > MAX_SCAN_BYTES {
                        break;
                    }
                    bytes += v.len();
                }
                let value = if r.with_values { v.clone() } else { Bytes::new() };
                entries.push(Entry { key: k.clone(), len: v.len() as u64, value });
            }
            Ok(ScanReply { entries })
        })();
        res.into()
    }
}
