//! One stream adapter for every consumer that polls (a pull consumer, a group member).

use futures_util::Stream;
use mmmq_core::Envelope;

use crate::error::{ClientError, backoff};

/// Something that answers the next messages when polled.
pub(crate) trait Polls {
    /// The next messages (maybe none, after a long poll).
    fn poll_messages(
        &mut self,
    ) -> impl std::future::Future<Output = Result<Vec<Envelope>, ClientError>> + Send;
}

/// Every message `source` answers, forever. Transient errors are yielded (and retried with
/// backoff); others end the stream after being yielded.
pub(crate) fn envelopes<P: Polls + Send>(
    source: P,
) -> impl Stream<Item = Result<Envelope, ClientError>> {
    futures_util::stream::unfold(
        (source, std::collections::VecDeque::new(), 0u32, false),
        |(mut source, mut buffered, mut failures, done)| async move {
            if done {
                return None;
            }
            loop {
                if let Some(e) = buffered.pop_front() {
                    return Some((Ok(e), (source, buffered, 0, false)));
                }
                if failures > 0 {
                    tokio::time::sleep(backoff(failures)).await;
                }
                match source.poll_messages().await {
                    Ok(messages) => {
                        failures = 0;
                        buffered.extend(messages);
                    }
                    Err(e) => {
                        let transient = e.is_transient();
                        failures += 1;
                        return Some((Err(e), (source, buffered, failures, !transient)));
                    }
                }
            }
        },
    )
}
