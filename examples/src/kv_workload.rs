//! What `kv-client` and `kv` run: puts values from 0 bytes to several MiB (small ones travel in
//! the SEND, large ones by RDMA WRITE into the receiver's ring), reads each back and compares
//! every byte, overwrites, deletes, scans, and checks every answer.

use std::io::Write;
use std::time::Instant;

use bytes::Bytes;
use rpc_core::Code;

use crate::kv::kv_client::KvClient;
use crate::kv::{DeleteRequest, GetRequest, PutRequest, ScanRequest};

/// Value sizes of the workload, in bytes: around the default 4 KiB eager threshold, and bulk
/// values up to 6 MiB.
pub const SIZES: [usize; 11] = [0, 1, 100, 4095, 4096, 4097, 65536, 1 << 20, 3 << 20, 4 << 20, 6 << 20];

/// A check that failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkloadError {
    /// A call failed.
    #[error("{op} {key:?}: {status}")]
    Call {
        /// The operation.
        op: &'static str,
        /// Its key.
        key: String,
        /// The status.
        status: rpc_core::Status,
    },
    /// An answer was not what was stored.
    #[error("{op} {key:?}: {what}")]
    Mismatch {
        /// The operation.
        op: &'static str,
        /// Its key.
        key: String,
        /// What differed.
        what: String,
    },
    /// Writing the log failed.
    #[error("writing the log: {0}")]
    Io(#[from] std::io::Error),
}

/// The value stored under key number `i`: `len` bytes of a pattern that differs per key and per
/// position, so a misplaced or stale chunk is caught.
pub fn value(i: usize, len: usize) -> Bytes {
    (0..len).map(|j| (j.wrapping_mul(31) ^ i.wrapping_mul(131) ^ (j >> 8)) as u8).collect::<Vec<u8>>().into()
}

fn call_err(op: &'static str, key: &str) -> impl FnOnce(rpc_core::Status) -> WorkloadError {
    let key = key.to_string();
    move |status| WorkloadError::Call { op, key, status }
}

fn key(i: usize) -> String {
    format!("key-{i:03}")
}

fn first_difference(a: &[u8], b: &[u8]) -> String {
    if a.len() != b.len() {
        return format!("{} bytes, expected {}", a.len(), b.len());
    }
    match a.iter().zip(b).position(|(x, y)| x != y) {
        Some(p) => format!("byte {p} is {:#04x}, expected {:#04x}", a[p], b[p]),
        None => "equal".into(),
    }
}

/// Runs the workload against `client`, logging each step to `log`. Returns the number of calls.
///
/// # Errors
/// The first failed call or mismatch.
pub fn run(client: &KvClient, log: &mut impl Write) -> Result<u64, WorkloadError> {
    let mut calls = 0u64;
    writeln!(log, "{:<8} {:<8} {:>10} {:>12}", "op", "key", "bytes", "usec")?;
    for (i, &len) in SIZES.iter().enumerate() {
        let k = key(i);
        let v = value(i, len);
        let t = Instant::now();
        let r = client.put(&PutRequest { key: k.clone(), value: v.clone() }).map_err(call_err("Put", &k))?;
        writeln!(log, "{:<8} {:<8} {:>10} {:>12.1}", "put", k, len, t.elapsed().as_secs_f64() * 1e6)?;
        if r.replaced {
            return Err(WorkloadError::Mismatch {
                op: "Put",
                key: k,
                what: "replaced a key never written".into(),
            });
        }
        let t = Instant::now();
        let got = client.get(&GetRequest { key: k.clone() }).map_err(call_err("Get", &k))?;
        writeln!(
            log,
            "{:<8} {:<8} {:>10} {:>12.1}",
            "get",
            k,
            got.value.len(),
            t.elapsed().as_secs_f64() * 1e6
        )?;
        if got.value != v {
            return Err(WorkloadError::Mismatch {
                op: "Get",
                key: k,
                what: first_difference(&got.value, &v),
            });
        }
        calls += 2;
    }

    // Overwrite a bulk value with a small one and read it back.
    let (i, k) = (SIZES.len() - 1, key(SIZES.len() - 1));
    let v = value(i + 1000, 10);
    let r = client.put(&PutRequest { key: k.clone(), value: v.clone() }).map_err(call_err("Put", &k))?;
    if !r.replaced {
        return Err(WorkloadError::Mismatch { op: "Put", key: k, what: "overwrite did not replace".into() });
    }
    let got = client.get(&GetRequest { key: k.clone() }).map_err(call_err("Get", &k))?;
    if got.value != v {
        return Err(WorkloadError::Mismatch { op: "Get", key: k, what: first_difference(&got.value, &v) });
    }
    writeln!(log, "{:<8} {:<8} {:>10} {:>12}", "replace", k, 10, "-")?;
    calls += 2;

    // Delete one key: it existed, is gone, and a second delete says so.
    let k = key(2);
    let d = client.delete(&DeleteRequest { key: k.clone() }).map_err(call_err("Delete", &k))?;
    let d2 = client.delete(&DeleteRequest { key: k.clone() }).map_err(call_err("Delete", &k))?;
    if !d.existed || d2.existed {
        return Err(WorkloadError::Mismatch {
            op: "Delete",
            key: k,
            what: format!("existed {} then {}", d.existed, d2.existed),
        });
    }
    match client.get(&GetRequest { key: k.clone() }) {
        Err(s) if s.code() == Code::NotFound => {}
        Err(s) => return Err(WorkloadError::Call { op: "Get", key: k, status: s }),
        Ok(_) => {
            return Err(WorkloadError::Mismatch { op: "Get", key: k, what: "deleted key still there".into() })
        }
    }
    writeln!(log, "{:<8} {:<8} {:>10} {:>12}", "delete", k, "-", "-")?;
    calls += 3;

    // Scan: every remaining key in order with its length; then the small values themselves.
    let s = client
        .scan(&ScanRequest { start: String::new(), limit: 0, with_values: false })
        .map_err(call_err("Scan", ""))?;
    let want: Vec<(String, u64)> = SIZES
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 2)
        .map(|(i, &len)| (key(i), if i == SIZES.len() - 1 { 10 } else { len as u64 }))
        .collect();
    let got: Vec<(String, u64)> = s.entries.iter().map(|e| (e.key.clone(), e.len)).collect();
    if got != want {
        return Err(WorkloadError::Mismatch {
            op: "Scan",
            key: String::new(),
            what: format!("{got:?}, expected {want:?}"),
        });
    }
    let s = client
        .scan(&ScanRequest { start: key(3), limit: 3, with_values: true })
        .map_err(call_err("Scan", &key(3)))?;
    for (n, e) in s.entries.iter().enumerate() {
        let i = 3 + n;
        if e.key != key(i) || e.value != value(i, SIZES[i]) {
            return Err(WorkloadError::Mismatch {
                op: "Scan",
                key: e.key.clone(),
                what: first_difference(&e.value, &value(i, SIZES[i])),
            });
        }
    }
    if s.entries.len() != 3 {
        return Err(WorkloadError::Mismatch {
            op: "Scan",
            key: key(3),
            what: format!("{} entries, expected 3", s.entries.len()),
        });
    }
    writeln!(log, "{:<8} {:<8} {:>10} {:>12}", "scan", "*", got.len(), "-")?;
    calls += 2;
    Ok(calls)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_differ_per_key_and_position() {
        assert_eq!(value(1, 0).len(), 0);
        assert_ne!(value(1, 64), value(2, 64));
        let v = value(3, 600);
        assert_ne!(v[..256], v[256..512]);
        assert_eq!(first_difference(b"abc", b"abd"), "byte 2 is 0x63, expected 0x64");
        assert_eq!(first_difference(b"ab", b"abc"), "2 bytes, expected 3");
    }
}
