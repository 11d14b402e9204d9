//! The eBPF object built by `proxy/build.rs` from the `proxy-ebpf` crate, embedded in the agent.

use crate::error::DataplaneError;

/// The object as built; empty when the agent was built with `KPR_SKIP_EBPF=1`.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/proxy-ebpf"));

/// The embedded eBPF object, or an error when this agent was built without it.
pub fn embedded() -> Result<&'static [u8], DataplaneError> {
    if OBJECT.is_empty() {
        return Err(DataplaneError::Unsupported {
            backend: "ebpf",
            feature: "eBPF programs: this agent was built with KPR_SKIP_EBPF=1; rebuild with \
                      bpf-linker installed"
                .to_string(),
        });
    }
    Ok(OBJECT)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The build embeds a real ELF object unless KPR_SKIP_EBPF was set.
    #[test]
    fn embedded_object_is_elf_or_skip_error() {
        match option_env!("KPR_SKIP_EBPF") {
            Some("1") => assert!(embedded().is_err()),
            _ => assert_eq!(&embedded().expect("object")[..4], b"\x7fELF"),
        }
    }
}
