//! SASL/PLAIN on a Kafka connection (docs/kafka.md, "Connections"): with `--auth-token`, a
//! client logs in before anything but ApiVersions, SaslHandshake and SaslAuthenticate, with the
//! token as its password (any user name).
//!
//! As Kafka's broker does: a SaslAuthenticate needs a SaslHandshake that chose PLAIN first
//! (`ILLEGAL_SASL_STATE` and closed otherwise); a failed login is answered after a delay and the
//! connection closed, so that one address, holding at most `--max-connections-per-ip`
//! connections, tries at most that many passwords a second. Failures are counted
//! (`mmmq_auth_failures_total{listener="kafka",mechanism="PLAIN"}`) and logged without the
//! password.

use std::time::Duration;

use kafka_protocol::ResponseError;
use kafka_protocol::messages::{
    SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse,
};
use kafka_protocol::protocol::StrBytes;

use super::Shared;
use super::connection::{Refused, Session};

/// How long a failed login waits before its answer (Kafka's
/// `connection.failed.authentication.delay.ms` is 100 ms; a second here makes guessing a
/// password cost what it should).
pub(crate) const FAILED_LOGIN_DELAY: Duration = Duration::from_secs(1);

/// The answer to SaslHandshake: PLAIN is the one mechanism.
pub(crate) fn handshake(
    session: &mut Session,
    r: &SaslHandshakeRequest,
    version: i16,
) -> SaslHandshakeResponse {
    let ok = r.mechanism.as_str() == "PLAIN";
    session.handshake = ok;
    if ok && version == 0 {
        session.raw_sasl_next = true;
    }
    SaslHandshakeResponse::default()
        .with_error_code(if ok {
            0
        } else {
            ResponseError::UnsupportedSaslMechanism.code()
        })
        .with_mechanisms(vec![StrBytes::from_static_str("PLAIN")])
}

/// The answer to SaslAuthenticate; the connection closes after a refusal.
pub(crate) async fn authenticate(
    shared: &Shared,
    session: &mut Session,
    r: &SaslAuthenticateRequest,
) -> SaslAuthenticateResponse {
    // Kafka answers a refusal, then closes: the client learns why.
    let refusal = if !session.handshake {
        Some((
            ResponseError::IllegalSaslState,
            "SaslAuthenticate before a SaslHandshake",
        ))
    } else if login(shared, session, &r.auth_bytes).await.is_err() {
        Some((
            ResponseError::SaslAuthenticationFailed,
            "Authentication failed: invalid credentials",
        ))
    } else {
        None
    };
    session.close_after_answer = refusal.is_some();
    match refusal {
        None => SaslAuthenticateResponse::default(),
        Some((code, why)) => SaslAuthenticateResponse::default()
            .with_error_code(code.code())
            .with_error_message(Some(StrBytes::from_static_str(why))),
    }
}

/// Checks a SASL/PLAIN token (`authzid NUL authcid NUL password`): the password must be the
/// broker's auth token. Without a token every login succeeds. A failure waits
/// [`FAILED_LOGIN_DELAY`] before it returns.
pub(crate) async fn login(
    shared: &Shared,
    session: &mut Session,
    token: &[u8],
) -> Result<(), Refused> {
    let mut parts = token.split(|&b| b == 0);
    let (_authzid, _user, password) = (parts.next(), parts.next(), parts.next());
    let ok = match (&shared.auth_token, password) {
        (None, _) => true,
        (Some(expected), Some(given)) if parts.next().is_none() => {
            use subtle::ConstantTimeEq;
            bool::from(expected.as_bytes().ct_eq(given))
        }
        _ => false,
    };
    if !ok {
        shared.broker.metrics().kafka.auth_failed("PLAIN");
        if let Some(suppressed) = shared.closing_log.allow() {
            tracing::info!(peer = %session.peer, suppressed, "kafka: a SASL/PLAIN login failed");
        }
        tokio::time::sleep(FAILED_LOGIN_DELAY).await;
        return Err(Refused::AuthFailed);
    }
    session.authenticated = true;
    Ok(())
}
