//! The SDK's own files, for `mmmq plugin new` (feature `embedded-sources`, which the `mmmq`
//! binary turns on): when this version of the SDK is not on crates.io, the binary writes them
//! beside a new plugin, so that the plugin builds with nothing but the binary and cargo.

/// This SDK's version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Every file of the crate, as (path in the crate, text), but its manifest: that one inherits
/// from the mmmq workspace, so the binary writes a standalone one in its place.
pub const SOURCES: &[(&str, &str)] = &[
    ("README.md", include_str!("../README.md")),
    ("src/http.rs", include_str!("http.rs")),
    ("src/lib.rs", include_str!("lib.rs")),
    ("src/pointer.rs", include_str!("pointer.rs")),
    ("src/sources.rs", include_str!("sources.rs")),
    ("wit/plugin.wit", include_str!("../wit/plugin.wit")),
];
