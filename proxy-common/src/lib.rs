//! Map keys and values shared by the agent (`proxy`) and the eBPF programs (`proxy-ebpf`).
//!
//! Everything here is `#[repr(C)]`, `Copy`, with explicit padding and no `Option` or `bool`, so the
//! kernel and userspace agree on the byte layout. With the `user` feature the types implement
//! `aya::Pod` so userspace can put them into maps.
#![no_std]
