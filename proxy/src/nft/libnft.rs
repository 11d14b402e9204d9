//! A long-lived libnftables context for small transactions.
//!
//! Owns the only FFI into `libnftables.so.1` (loaded with `dlopen`, so the agent still runs
//! where only the `nft` binary exists). At 20,000 Services one `nft -f -` of a four-element change
//! spent most of its time outside the change itself: starting the process (~5 ms) and closing its
//! netlink socket (~6-11 ms, the kernel waits for an RCU grace period). A context kept per thread
//! keeps its socket open between transactions. The context is bound to the network namespace it
//! was created in; it is recreated when the calling thread is in another one, and after any error.
//!
//! Contexts are per thread, but libnftables is not thread-safe across contexts: `nft_ctx_new`
//! initialises process globals on first use (an unguarded `init_once`), and both
//! `nft_run_cmd_from_buffer` and `nft_ctx_free` release the library's one global interface cache
//! (`iface_cache_release`). A thread's context is freed by its thread-local destructor when the
//! thread ends (tokio ends idle blocking threads), which can be while another thread runs a
//! transaction. Every call into the library therefore holds [`LIBRARY`].

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::os::unix::fs::MetadataExt as _;

type CtxNew = unsafe extern "C" fn(u32) -> *mut c_void;
type CtxFree = unsafe extern "C" fn(*mut c_void);
type CtxInt = unsafe extern "C" fn(*mut c_void) -> c_int;
type RunBuffer = unsafe extern "C" fn(*mut c_void, *const c_char) -> c_int;
type GetBuffer = unsafe extern "C" fn(*mut c_void) -> *const c_char;

/// The libnftables entry points used here.
struct Api {
    ctx_new: CtxNew,
    ctx_free: CtxFree,
    buffer_output: CtxInt,
    buffer_error: CtxInt,
    run: RunBuffer,
    error_buffer: GetBuffer,
}

/// One `nft_ctx` and the network namespace (inode) it talks to.
struct Ctx {
    api: &'static Api,
    ctx: *mut c_void,
    netns: u64,
}

/// Held across every call into libnftables (see the module's documentation).
static LIBRARY: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn library() -> std::sync::MutexGuard<'static, ()> {
    // A panic while holding it cannot leave libnftables half-updated from Rust's side: the lock
    // only orders the calls.
    LIBRARY.lock().unwrap_or_else(|e| e.into_inner())
}

impl Drop for Ctx {
    fn drop(&mut self) {
        let _library = library();
        // SAFETY: `ctx` came from `nft_ctx_new` and is freed exactly once, here.
        unsafe { (self.api.ctx_free)(self.ctx) }
    }
}

thread_local! {
    static CTX: RefCell<Option<Ctx>> = const { RefCell::new(None) };
}

fn sym<T: Copy>(handle: *mut c_void, name: &CStr) -> Option<T> {
    // SAFETY: dlsym on a handle dlopen returned; the caller names the C signature `T` of `name`
    // as declared in <nftables/libnftables.h>.
    let p = unsafe { libc::dlsym(handle, name.as_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: `T` is a function pointer type of the same size as a data pointer.
    Some(unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) })
}

fn load() -> Option<Api> {
    // SAFETY: dlopen of a system library by its soname; it stays loaded for the process.
    let h = unsafe { libc::dlopen(c"libnftables.so.1".as_ptr(), libc::RTLD_NOW) };
    if h.is_null() {
        return None;
    }
    Some(Api {
        ctx_new: sym(h, c"nft_ctx_new")?,
        ctx_free: sym(h, c"nft_ctx_free")?,
        buffer_output: sym(h, c"nft_ctx_buffer_output")?,
        buffer_error: sym(h, c"nft_ctx_buffer_error")?,
        run: sym(h, c"nft_run_cmd_from_buffer")?,
        error_buffer: sym(h, c"nft_ctx_get_error_buffer")?,
    })
}

fn api() -> Option<&'static Api> {
    static API: std::sync::OnceLock<Option<Api>> = std::sync::OnceLock::new();
    API.get_or_init(load).as_ref()
}

fn current_netns() -> Option<u64> {
    std::fs::metadata("/proc/thread-self/ns/net")
        .ok()
        .map(|m| m.ino())
}

impl Ctx {
    fn new(api: &'static Api, netns: u64) -> Option<Ctx> {
        let _library = library();
        // SAFETY: plain constructor (NFT_CTX_DEFAULT); null on failure.
        let ctx = unsafe { (api.ctx_new)(0) };
        if ctx.is_null() {
            return None;
        }
        let c = Ctx { api, ctx, netns };
        // SAFETY: `ctx` is valid; output and errors go to in-memory buffers, not the agent's
        // stdout/stderr.
        unsafe {
            (api.buffer_output)(ctx);
            (api.buffer_error)(ctx);
        }
        Some(c)
    }

    fn run(&self, script: &CString) -> Result<(), String> {
        let _library = library();
        // SAFETY: `ctx` is valid and `script` is NUL-terminated and outlives the call.
        let rc = unsafe { (self.api.run)(self.ctx, script.as_ptr()) };
        if rc == 0 {
            return Ok(());
        }
        // SAFETY: the error buffer is a NUL-terminated string owned by `ctx`, copied at once.
        let p = unsafe { (self.api.error_buffer)(self.ctx) };
        let text = if p.is_null() {
            String::new()
        } else {
            // SAFETY: non-null, NUL-terminated, valid until the next call on `ctx`.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        };
        Err(text)
    }
}

/// Runs `script` as one transaction through the calling thread's context. `None` when
/// libnftables is not available here (the caller runs `nft -f -` instead); `Some(Err(stderr))`
/// when nft rejected the transaction.
pub fn run(script: &str) -> Option<Result<(), String>> {
    let api = api()?;
    let netns = current_netns()?;
    let script = CString::new(script).ok()?;
    CTX.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.as_ref().is_none_or(|c| c.netns != netns) {
            *slot = None;
            *slot = Some(Ctx::new(api, netns)?);
        }
        let result = slot.as_ref()?.run(&script);
        if result.is_err() {
            // A fresh context after an error: no stale error text, no stale cache.
            *slot = None;
        }
        Some(result)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rejected_script_returns_nfts_message() {
        // A syntax error is rejected by the parser before anything reaches the kernel.
        let Some(result) = run("this is not nft syntax\n") else {
            panic!("libnftables.so.1 is installed on this machine but could not be loaded");
        };
        let err = result.expect_err("nft accepted a syntax error");
        assert!(err.contains("syntax error"), "{err}");
    }
}
