//! etcd discovery (placeholder while being written).
