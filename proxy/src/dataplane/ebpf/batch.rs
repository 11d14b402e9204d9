//! Batch map operations (`BPF_MAP_LOOKUP_BATCH`, `BPF_MAP_UPDATE_BATCH`, `BPF_MAP_DELETE_BATCH`,
//! Linux 5.6), which aya 0.14 does not wrap: a small safe wrapper around the raw `bpf()` syscall
//! on a map's fd.
//!
//! Safety rests on two facts the callers guarantee through the types: keys and values are
//! `aya::Pod` (`#[repr(C)]`, plain integers, no padding holes read as uninitialised memory), and
//! the map was created with `key_size == size_of::<K>()` and `value_size == size_of::<V>()` (aya
//! checks both when it wraps the map as a typed `HashMap<K, V>`), so the kernel reads exactly
//! `count` elements from each slice.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use aya::Pod;

const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;
/// Elements asked for per lookup syscall (a hash bucket larger than this would fail with
/// `ENOSPC`; buckets hold a handful).
const LOOKUP_CHUNK: usize = 4096;
const BPF_MAP_DELETE_BATCH: libc::c_long = 27;
/// The kernel's internal "not supported" (a map type without batch operations).
const ENOTSUPP: i32 = 524;

/// The `batch` member of `union bpf_attr` (include/uapi/linux/bpf.h).
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Why a batch stopped: the elements before `done` were applied, the one at `done` failed.
#[derive(Debug)]
pub struct BatchError {
    pub done: usize,
    pub error: io::Error,
}

impl BatchError {
    /// The kernel has no batch operations (before 5.6: `EINVAL`, a map type without them:
    /// `ENOTSUPP`): the caller falls back to single updates of every element. `done` is 0 then,
    /// as the kernel leaves `count` untouched; replaying is harmless (updates replace, and
    /// callers tolerate deleting a missing key).
    pub fn unsupported(&self) -> bool {
        matches!(
            self.error.raw_os_error(),
            Some(libc::EINVAL) | Some(libc::EOPNOTSUPP) | Some(ENOTSUPP)
        )
    }
}

/// Inserts or replaces every `keys[i]` with `values[i]` (`BPF_ANY`), in order, in one syscall.
pub fn update<K: Pod, V: Pod>(
    fd: BorrowedFd<'_>,
    keys: &[K],
    values: &[V],
) -> Result<(), BatchError> {
    assert_eq!(keys.len(), values.len(), "one value per key");
    run(BPF_MAP_UPDATE_BATCH, fd, keys, values.as_ptr() as u64)
}

/// Every element of a hash map, a chunk per syscall; `Ok(None)` when the kernel has no batch
/// lookup (the caller iterates instead).
pub fn lookup_all<K: Pod + Default, V: Pod + Default>(
    fd: BorrowedFd<'_>,
) -> io::Result<Option<Vec<(K, V)>>> {
    let mut out = Vec::new();
    let mut keys = vec![K::default(); LOOKUP_CHUNK];
    let mut values = vec![V::default(); LOOKUP_CHUNK];
    // The resume token: a u32 bucket index for hash maps; room for a key-sized one anyway.
    let (mut token_in, mut token_out) = ([0u64; 8], [0u64; 8]);
    let mut first = true;
    loop {
        let mut attr = BatchAttr {
            in_batch: if first {
                0
            } else {
                token_in.as_mut_ptr() as u64
            },
            out_batch: token_out.as_mut_ptr() as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: LOOKUP_CHUNK as u32,
            map_fd: fd.as_raw_fd() as u32,
            ..BatchAttr::default()
        };
        // SAFETY: `attr` is the fully initialised `batch` member of `bpf_attr`; `keys` and
        // `values` hold LOOKUP_CHUNK Pod elements of the map's key and value sizes (module docs)
        // and the tokens 64 bytes, all alive for the call; the kernel writes at most `count`
        // elements, one token and `attr.count`.
        let ret = unsafe { sys_bpf(BPF_MAP_LOOKUP_BATCH, &mut attr) };
        let got = (attr.count as usize).min(LOOKUP_CHUNK);
        match ret {
            Ok(_) => {}
            // The end of the map: the elements of this last call are valid.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                out.extend(
                    keys[..got]
                        .iter()
                        .copied()
                        .zip(values[..got].iter().copied()),
                );
                return Ok(Some(out));
            }
            Err(e)
                if first
                    && matches!(
                        e.raw_os_error(),
                        Some(libc::EINVAL) | Some(libc::EOPNOTSUPP) | Some(ENOTSUPP)
                    ) =>
            {
                return Ok(None);
            }
            Err(e) => return Err(e),
        }
        out.extend(
            keys[..got]
                .iter()
                .copied()
                .zip(values[..got].iter().copied()),
        );
        token_in = token_out;
        first = false;
    }
}

/// Deletes every key, in order, in one syscall; a missing key stops the batch with `ENOENT`.
pub fn delete<K: Pod>(fd: BorrowedFd<'_>, keys: &[K]) -> Result<(), BatchError> {
    run(BPF_MAP_DELETE_BATCH, fd, keys, 0)
}

fn run<K: Pod>(
    cmd: libc::c_long,
    fd: BorrowedFd<'_>,
    keys: &[K],
    values: u64,
) -> Result<(), BatchError> {
    if keys.is_empty() {
        return Ok(());
    }
    let count = u32::try_from(keys.len()).map_err(|_| BatchError {
        done: 0,
        error: io::Error::new(io::ErrorKind::InvalidInput, "batch larger than u32::MAX"),
    })?;
    let mut attr = BatchAttr {
        keys: keys.as_ptr() as u64,
        values,
        count,
        map_fd: fd.as_raw_fd() as u32,
        ..BatchAttr::default()
    };
    // SAFETY: `attr` is the fully initialised `batch` member of `bpf_attr`; `keys` (and
    // `values` for updates) point at `count` Pod elements of the map's key and value sizes
    // (module docs) that outlive the call; the kernel only reads them and writes `attr.count`.
    let ret = unsafe { sys_bpf(cmd, &mut attr) };
    if let Err(error) = ret {
        let mut err = BatchError {
            done: (attr.count as usize).min(keys.len()),
            error,
        };
        if err.unsupported() {
            err.done = 0;
        }
        return Err(err);
    }
    Ok(())
}

/// `bpf(cmd, attr, sizeof attr)`, the raw syscall: the return value, or the errno as an error.
///
/// # Safety
/// `A` must be the `#[repr(C)]` member of `union bpf_attr` that `cmd` reads, fully initialised,
/// and every pointer in it valid for what the kernel reads or writes through it for `cmd`.
pub(crate) unsafe fn sys_bpf<A>(cmd: libc::c_long, attr: &mut A) -> io::Result<libc::c_long> {
    // SAFETY: the caller's contract; the size passed is that of `*attr`.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut A,
            std::mem::size_of::<A>() as libc::c_uint,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(ret)
}
