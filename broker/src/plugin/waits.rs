//! Every wait a guest can make in the host ends at its call's deadline (docs/plugins.md,
//! "WebAssembly handlers": each call interrupted after `timeoutMs`).
//!
//! WebAssembly's own time limit (epochs, `runtime`) interrupts guest code only: a guest blocked in
//! a host call — `std::thread::sleep` is a `wasi:clocks` pollable waited on with `wasi:io/poll`,
//! an HTTP answer is a pollable too — is never interrupted, and held its thread and its partition
//! for as long as it asked. So the synchronous `wasi:io/poll` and `wasi:io/streams` bindings that
//! `wasmtime_wasi::p2::add_to_linker_sync` links are shadowed here by the same interfaces whose
//! every wait ([`wait`]) is bounded by the deadline of the call in progress: a wait still going
//! at the deadline, or one that ends past it, traps with [`OutOfTime`], which the runtime reports
//! as the call's timeout. Whatever does not wait is the stock implementation, unchanged.
//!
//! A wait that ends past the deadline traps even when what it waited for came: the call's time is
//! up either way, and trapping there, rather than letting the guest run on until the epoch
//! interrupt, makes the outcome one thing (a timeout), not a race between the two.

use std::future::Future;
use std::time::Instant;

use wasmtime::component::{HasData, Linker, Resource};
use wasmtime_wasi::p2::bindings::io::poll::{Host as AsyncPoll, HostPollable as AsyncPollable};
use wasmtime_wasi::p2::bindings::io::streams::{
    HostInputStream as AsyncInput, HostOutputStream as AsyncOutput,
};
use wasmtime_wasi::p2::bindings::sync::io::{poll, streams};
use wasmtime_wasi::p2::{DynPollable, StreamError, StreamResult};
use wasmtime_wasi::runtime::in_tokio;

use super::host::{HostState, Waits};

type InputStream = wasmtime_wasi::p2::DynInputStream;
type OutputStream = wasmtime_wasi::p2::DynOutputStream;

/// The trap of a wait that reached the call's deadline.
#[derive(Debug, thiserror::Error)]
#[error("the call's timeoutMs ran out while it waited in the host")]
pub(super) struct OutOfTime;

/// Replaces the `wasi:io/poll` and `wasi:io/streams` that `add_to_linker_sync` linked with their
/// bounded versions (call it after that).
pub(super) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    poll::add_to_linker::<HostState, Bounded>(linker, HostState::waits)?;
    streams::add_to_linker::<HostState, Bounded>(linker, HostState::waits)?;
    linker.allow_shadowing(false);
    Ok(())
}

struct Bounded;

impl HasData for Bounded {
    type Data<'a> = Waits<'a>;
}

/// Runs `work` until it is done or the deadline comes, whichever is first; past the deadline
/// (done or not) it is [`OutOfTime`].
fn wait<T>(deadline: Instant, work: impl Future<Output = T>) -> Result<T, OutOfTime> {
    // The timer is made inside the runtime `in_tokio` enters; a wait that is ready at once
    // never arms it.
    let done = in_tokio(async move {
        tokio::time::timeout_at(tokio::time::Instant::from_std(deadline), work)
            .await
            .ok()
    });
    match done {
        Some(done) if Instant::now() < deadline => Ok(done),
        _ => Err(OutOfTime),
    }
}

/// [`wait`] for a stream operation: [`OutOfTime`] is a trap, not an error the guest handles.
fn wait_stream<T>(
    deadline: Instant,
    work: impl Future<Output = StreamResult<T>>,
) -> StreamResult<T> {
    wait(deadline, work).unwrap_or_else(|e| Err(StreamError::Trap(wasmtime::Error::new(e))))
}

impl poll::Host for Waits<'_> {
    fn poll(&mut self, pollables: Vec<Resource<DynPollable>>) -> wasmtime::Result<Vec<u32>> {
        wait(self.deadline, AsyncPoll::poll(self.table, pollables))?
    }
}

impl poll::HostPollable for Waits<'_> {
    fn block(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<()> {
        wait(self.deadline, AsyncPollable::block(self.table, pollable))?
    }

    fn ready(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<bool> {
        poll::HostPollable::ready(self.table, pollable)
    }

    fn drop(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<()> {
        poll::HostPollable::drop(self.table, pollable)
    }
}

impl streams::Host for Waits<'_> {
    fn convert_stream_error(&mut self, err: StreamError) -> wasmtime::Result<streams::StreamError> {
        streams::Host::convert_stream_error(self.table, err)
    }
}

impl streams::HostInputStream for Waits<'_> {
    fn drop(&mut self, stream: Resource<InputStream>) -> wasmtime::Result<()> {
        wait(self.deadline, AsyncInput::drop(self.table, stream))?
    }

    fn read(&mut self, stream: Resource<InputStream>, len: u64) -> StreamResult<Vec<u8>> {
        streams::HostInputStream::read(self.table, stream, len)
    }

    fn blocking_read(&mut self, stream: Resource<InputStream>, len: u64) -> StreamResult<Vec<u8>> {
        let read = AsyncInput::blocking_read(self.table, stream, len);
        wait_stream(self.deadline, read)
    }

    fn skip(&mut self, stream: Resource<InputStream>, len: u64) -> StreamResult<u64> {
        streams::HostInputStream::skip(self.table, stream, len)
    }

    fn blocking_skip(&mut self, stream: Resource<InputStream>, len: u64) -> StreamResult<u64> {
        let skip = AsyncInput::blocking_skip(self.table, stream, len);
        wait_stream(self.deadline, skip)
    }

    fn subscribe(
        &mut self,
        stream: Resource<InputStream>,
    ) -> wasmtime::Result<Resource<DynPollable>> {
        streams::HostInputStream::subscribe(self.table, stream)
    }
}

impl streams::HostOutputStream for Waits<'_> {
    fn drop(&mut self, stream: Resource<OutputStream>) -> wasmtime::Result<()> {
        wait(self.deadline, AsyncOutput::drop(self.table, stream))?
    }

    fn check_write(&mut self, stream: Resource<OutputStream>) -> StreamResult<u64> {
        streams::HostOutputStream::check_write(self.table, stream)
    }

    fn write(&mut self, stream: Resource<OutputStream>, bytes: Vec<u8>) -> StreamResult<()> {
        streams::HostOutputStream::write(self.table, stream, bytes)
    }

    fn blocking_write_and_flush(
        &mut self,
        stream: Resource<OutputStream>,
        bytes: Vec<u8>,
    ) -> StreamResult<()> {
        let write = AsyncOutput::blocking_write_and_flush(self.table, stream, bytes);
        wait_stream(self.deadline, write)
    }

    fn flush(&mut self, stream: Resource<OutputStream>) -> StreamResult<()> {
        streams::HostOutputStream::flush(self.table, stream)
    }

    fn blocking_flush(&mut self, stream: Resource<OutputStream>) -> StreamResult<()> {
        let flush = AsyncOutput::blocking_flush(self.table, stream);
        wait_stream(self.deadline, flush)
    }

    fn subscribe(
        &mut self,
        stream: Resource<OutputStream>,
    ) -> wasmtime::Result<Resource<DynPollable>> {
        streams::HostOutputStream::subscribe(self.table, stream)
    }

    fn write_zeroes(&mut self, stream: Resource<OutputStream>, len: u64) -> StreamResult<()> {
        streams::HostOutputStream::write_zeroes(self.table, stream, len)
    }

    fn blocking_write_zeroes_and_flush(
        &mut self,
        stream: Resource<OutputStream>,
        len: u64,
    ) -> StreamResult<()> {
        let write = AsyncOutput::blocking_write_zeroes_and_flush(self.table, stream, len);
        wait_stream(self.deadline, write)
    }

    fn splice(
        &mut self,
        dst: Resource<OutputStream>,
        src: Resource<InputStream>,
        len: u64,
    ) -> StreamResult<u64> {
        streams::HostOutputStream::splice(self.table, dst, src, len)
    }

    fn blocking_splice(
        &mut self,
        dst: Resource<OutputStream>,
        src: Resource<InputStream>,
        len: u64,
    ) -> StreamResult<u64> {
        let splice = AsyncOutput::blocking_splice(self.table, dst, src, len);
        wait_stream(self.deadline, splice)
    }
}
