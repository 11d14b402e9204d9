//! The subcommands of the `proxy` binary (anyhow-based glue around the library).

pub mod cleanup;
pub mod inspect;
pub mod run;
pub mod trace;
