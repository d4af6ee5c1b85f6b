//! Why a component cannot be used, or a call failed: the plugin layer's one error type, at the
//! bottom of its modules (the host state, the worlds and the runtime all return it).

/// Why a component cannot be used, or a call failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PluginError {
    /// The file cannot be read.
    #[error("cannot read {path}: {reason}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// Not WebAssembly at all. Nothing of the file is quoted: `loadError` is shown over HTTP, and
    /// a path that is not a plugin must not show what it holds.
    #[error("not a WebAssembly component (bad magic)")]
    BadMagic,
    /// Not a component, or not a valid one.
    #[error("not a valid WebAssembly component: {0}")]
    Compile(String),
    /// A component, but not of the `mmmq:plugin/handler` world (or it needs imports we do not give).
    #[error("the component does not implement the mmmq:plugin handler world: {0}")]
    World(String),
    /// Instantiation failed (its start code trapped, or its initial memory exceeds the cap).
    #[error("cannot instantiate the plugin: {0}")]
    Instantiate(String),
    /// The call ran past `timeoutMs`.
    #[error("timed out after {0} ms")]
    Timeout(u64),
    /// The guest tried to grow its memory past `maxMemoryBytes`.
    #[error("memory limit of {0} bytes exceeded")]
    Memory(u64),
    /// The guest trapped (a panic, an out-of-bounds access, a stack overflow, …).
    #[error("trapped: {0}")]
    Trap(String),
}
