//! A registration over `ulimit -l` gives the locked-memory diagnostic (needed bytes, current limit,
//! how to raise it), against a real device.
//!
//! Its own test binary because it lowers RLIMIT_MEMLOCK for the whole process. Root is exempt
//! from the limit through CAP_IPC_LOCK (as in the Soft-RoCE guest), so the test first drops that
//! capability from its thread's effective set. Needs an RDMA device: run with
//! `scripts/softroce-test`; skipped with a printed reason elsewhere (a failure with
//! `RPC_REQUIRE_RDMA=1`).
#![cfg(feature = "ibverbs")]
// Two raw syscalls (capget/capset) to drop CAP_IPC_LOCK; each block says why it is sound.
#![allow(unsafe_code)]

mod ibverbs_support;

use rpc_core::verbs::{AccessFlags, Context, MemoryRegion, ProtectionDomain, VerbsError};

const CAP_IPC_LOCK: u32 = 14;
const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Removes CAP_IPC_LOCK from this thread's effective set (a no-op for unprivileged users).
fn drop_ipc_lock() {
    let mut hdr = CapHeader { version: LINUX_CAPABILITY_VERSION_3, pid: 0 };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget with a valid v3 header and room for the two data structs v3 uses.
    let rc = unsafe { libc::syscall(libc::SYS_capget, &mut hdr as *mut CapHeader, data.as_mut_ptr()) };
    assert_eq!(rc, 0, "capget: {}", std::io::Error::last_os_error());
    data[0].effective &= !(1 << CAP_IPC_LOCK);
    // SAFETY: capset of this thread with the set just read minus one effective bit.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &mut hdr as *mut CapHeader, data.as_ptr()) };
    assert_eq!(rc, 0, "capset: {}", std::io::Error::last_os_error());
}

/// Sets the soft RLIMIT_MEMLOCK (`None` = up to the hard limit).
fn set_memlock(bytes: Option<u64>) {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit into a live struct.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) }, 0);
    r.rlim_cur = bytes.unwrap_or(r.rlim_max);
    // SAFETY: setrlimit with a live struct; the soft limit stays at or below the hard one.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &r) };
    assert_eq!(rc, 0, "setrlimit: {}", std::io::Error::last_os_error());
}

#[test]
fn ibverbs_memlock_limit_is_explained() {
    let Some(ctx) = ibverbs_support::open_or_skip("ibverbs_memlock_limit_is_explained") else { return };
    let pd = ctx.alloc_pd().expect("alloc_pd");
    drop_ipc_lock();
    set_memlock(Some(64 * 1024));
    let small = pd.reg_mr(16 * 1024, AccessFlags::LOCAL_WRITE).expect("16 KiB fits under 64 KiB");
    match pd.reg_mr(1 << 20, AccessFlags::LOCAL_WRITE) {
        Err(e @ VerbsError::MemlockLimit { .. }) => {
            let VerbsError::MemlockLimit { needed, ref limit } = e else { unreachable!() };
            assert_eq!(needed, (1 << 20) + 16 * 1024, "this registration plus what is already registered");
            assert_eq!(limit, "65536 bytes (64 KiB)");
            let msg = e.to_string();
            assert!(msg.contains("ulimit -l") && msg.contains("limits.conf"), "{msg}");
            eprintln!("as expected: {msg}");
        }
        Ok(mr) => panic!("registered {} bytes over a 64 KiB memlock limit without CAP_IPC_LOCK", mr.len()),
        Err(other) => panic!("expected MemlockLimit, got {other:?}"),
    }
    set_memlock(None);
    let big = pd.reg_mr(1 << 20, AccessFlags::LOCAL_WRITE).expect("fits once the limit is raised");
    assert_eq!((small.len(), big.len()), (16 * 1024, 1 << 20));
}
