//! A valid component that is not an mmmq handler: it exports `wasi:cli/run`, not `handle`.

fn main() {
    println!("I am a command, not a handler");
}
