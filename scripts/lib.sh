# Sourced by the scripts beside it: what they need before they build.

# Plugins (the examples, the tests' own) are WebAssembly components built from source.
need_wasm_target() {
    if ! rustup target list --installed | grep -qx wasm32-wasip2; then
        rustup target add wasm32-wasip2
    fi
}
