//! The device list (`ibv_get_device_list`) and the diagnostics of finding none.

use std::ffi::CStr;
use std::io;
use std::ptr::NonNull;

use rdma_sys::{
    ibv_device, ibv_free_device_list, ibv_get_device_guid, ibv_get_device_list, ibv_get_device_name,
};

use crate::verbs::{DeviceInfo, DeviceSelector, Result, VerbsError};

/// An owned `ibv_get_device_list` result, freed on drop. Devices may be opened while it lives;
/// an opened context stays valid after the list is freed (`man ibv_get_device_list`).
pub(super) struct DeviceList {
    list: NonNull<*mut ibv_device>,
    len: usize,
}

impl DeviceList {
    /// Lists the devices.
    ///
    /// # Errors
    /// [`VerbsError::NoKernelSupport`] on ENOSYS (the kernel has no RDMA subsystem); `Os` otherwise.
    pub(super) fn get() -> Result<DeviceList> {
        let mut n: i32 = 0;
        // SAFETY: `n` is a valid out-pointer; the returned array (or NULL) is owned by us until
        // `ibv_free_device_list`.
        let list = unsafe { ibv_get_device_list(&mut n) };
        match NonNull::new(list) {
            Some(list) => Ok(DeviceList { list, len: usize::try_from(n).unwrap_or(0) }),
            None => Err(list_error(io::Error::last_os_error())),
        }
    }

    /// The raw device pointers.
    pub(super) fn devices(&self) -> &[*mut ibv_device] {
        // SAFETY: libibverbs returned an array of `len` valid device pointers (NULL-terminated
        // after them), alive until `ibv_free_device_list` in `drop`; `&self` borrows the list.
        unsafe { std::slice::from_raw_parts(self.list.as_ptr(), self.len) }
    }

    /// Name, index and GUID of each device.
    pub(super) fn infos(&self) -> Vec<DeviceInfo> {
        self.devices()
            .iter()
            .enumerate()
            .map(|(index, &dev)| DeviceInfo { index, name: device_name(dev), guid: device_guid(dev) })
            .collect()
    }

    /// The device `selector` asks for, with its index.
    ///
    /// # Errors
    /// [`VerbsError::NoDevice`] naming what was asked for and listing what exists.
    pub(super) fn select(&self, selector: &DeviceSelector) -> Result<(usize, *mut ibv_device)> {
        let devices = self.devices();
        let found = match selector {
            DeviceSelector::First => devices.first().map(|&d| (0, d)),
            DeviceSelector::Index(i) => devices.get(*i).map(|&d| (*i, d)),
            DeviceSelector::Name(name) => {
                devices.iter().enumerate().find(|(_, &d)| device_name(d) == *name).map(|(i, &d)| (i, d))
            }
        };
        found.ok_or_else(|| no_device(selector, self.infos().into_iter().map(|d| d.name).collect()))
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: the list came from `ibv_get_device_list` and is freed exactly once, here.
        unsafe { ibv_free_device_list(self.list.as_ptr()) };
    }
}

/// The kernel name of a device (`rxe0`, `mlx5_0`).
pub(super) fn device_name(dev: *mut ibv_device) -> String {
    // SAFETY: `dev` is a live entry of a device list; the name is a NUL-terminated string owned
    // by the device, copied out before the list can be freed.
    let name = unsafe { ibv_get_device_name(dev) };
    if name.is_null() {
        return String::new();
    }
    // SAFETY: non-NULL, NUL-terminated, alive for this call (see above).
    unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned()
}

/// The node GUID of a device, host byte order.
fn device_guid(dev: *mut ibv_device) -> u64 {
    // SAFETY: `dev` is a live entry of a device list; the call only reads it.
    u64::from_be(unsafe { ibv_get_device_guid(dev) })
}

/// The error for a failed `ibv_get_device_list`.
pub(super) fn list_error(err: io::Error) -> VerbsError {
    if err.raw_os_error() == Some(libc::ENOSYS) {
        VerbsError::NoKernelSupport
    } else {
        VerbsError::Os { call: "ibv_get_device_list", source: err }
    }
}

/// The error when nothing matches `selector`; `found` are the names that exist.
pub(super) fn no_device(selector: &DeviceSelector, found: Vec<String>) -> VerbsError {
    let wanted = match selector {
        DeviceSelector::First => "at all".to_string(),
        DeviceSelector::Index(i) => format!("at index {i} (there are {})", found.len()),
        DeviceSelector::Name(n) => format!("named {n:?}"),
    };
    VerbsError::NoDevice { wanted, found }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enosys_means_no_kernel_support() {
        let e = list_error(io::Error::from_raw_os_error(libc::ENOSYS));
        assert!(matches!(e, VerbsError::NoKernelSupport));
        assert!(e.to_string().contains("no RDMA support in this kernel"), "{e}");
        assert!(e.to_string().contains("`sim`"), "{e}");
        let e = list_error(io::Error::from_raw_os_error(libc::EACCES));
        assert!(matches!(e, VerbsError::Os { call: "ibv_get_device_list", .. }), "{e}");
    }

    #[test]
    fn no_device_names_the_request_the_devices_and_sim() {
        let e = no_device(&DeviceSelector::Name("mlx5_9".into()), vec!["rxe0".into(), "mlx5_0".into()]);
        let msg = e.to_string();
        assert!(msg.contains("\"mlx5_9\""), "{msg}");
        assert!(msg.contains("found: [rxe0, mlx5_0]"), "{msg}");
        assert!(msg.contains("transport `sim`"), "{msg}");
        let msg = no_device(&DeviceSelector::Index(3), vec!["rxe0".into()]).to_string();
        assert!(msg.contains("at index 3 (there are 1)"), "{msg}");
        let msg = no_device(&DeviceSelector::First, vec![]).to_string();
        assert!(msg.contains("no RDMA device at all; found: []"), "{msg}");
    }
}
