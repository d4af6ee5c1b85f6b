//! HTTP requests from a handler (docs/plugins.md, "WebAssembly handlers"), through the standard `wasi:http`
//! outgoing handler: the broker sends them only to the origins in the dispatcher's
//! `plugin.allowedHosts` (anything else fails with an error), and counts them in `timeoutMs`.
//!
//! ```no_run
//! use mmmq_plugin_sdk::http;
//!
//! let rate = http::get("http://127.0.0.1:9000/rates/EUR")?.json::<f64>()?;
//! let saved = http::post_json("http://127.0.0.1:9000/audit", &serde_json::json!({"rate": rate}))?;
//! assert_eq!(saved.status, 200);
//! # Ok::<(), http::HttpError>(())
//! ```
//!
//! In native tests nothing leaves the process: [`crate::testing::on_http`] answers the requests
//! and [`crate::testing::take_requests`] shows what was sent.

/// A request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// `GET`, `POST`, …
    pub method: String,
    /// The full URL.
    pub url: String,
    /// Header names and values.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl Request {
    /// A request without headers or body.
    pub fn new(method: &str, url: &str) -> Self {
        Self {
            method: method.to_owned(),
            url: url.to_owned(),
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    /// Adds a header.
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Sets the body.
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = body.into();
        self
    }

    /// Sends it and reads the whole answer.
    pub fn send(self) -> Result<Response, HttpError> {
        imp::send(self)
    }
}

/// An answer, read whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// Header names and values.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl Response {
    /// A `200` with a JSON body (for [`crate::testing::on_http`]).
    pub fn json_body(value: &impl serde::Serialize) -> Self {
        Self {
            status: 200,
            headers: vec![("content-type".into(), "application/json".into())],
            body: serde_json::to_vec(value).expect("a value serializes"),
        }
    }

    /// The body as text.
    pub fn text(&self) -> Result<&str, HttpError> {
        std::str::from_utf8(&self.body)
            .map_err(|e| HttpError(format!("the body is not UTF-8: {e}")))
    }

    /// The body deserialized from JSON; a status other than 2xx is an error.
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, HttpError> {
        if !(200..300).contains(&self.status) {
            return Err(HttpError(format!("status {}", self.status)));
        }
        serde_json::from_slice(&self.body)
            .map_err(|e| HttpError(format!("the body is not the expected JSON: {e}")))
    }
}

/// Why a request failed: refused by the broker (not in `allowedHosts`), timed out, or the
/// server could not be reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpError(pub String);

impl std::fmt::Display for HttpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HTTP request failed: {}", self.0)
    }
}

impl std::error::Error for HttpError {}

/// `GET url`.
pub fn get(url: &str) -> Result<Response, HttpError> {
    Request::new("GET", url).send()
}

/// `POST url` with `value` as a JSON body.
pub fn post_json<T: serde::Serialize + ?Sized>(
    url: &str,
    value: &T,
) -> Result<Response, HttpError> {
    let body = serde_json::to_vec(value).map_err(|e| HttpError(e.to_string()))?;
    Request::new("POST", url)
        .header("content-type", "application/json")
        .body(body)
        .send()
}

/// The guest side of `wasi:http`, on the standard bindings: the request is sent, its body written
/// while the answer is awaited (a server may answer before it has read the body), and the answer's
/// error code is what the caller sees — `HTTP-request-denied` for an origin outside
/// `plugin.allowedHosts`, a timeout, a refused connection — never a secondary failure of the body.
#[cfg(target_arch = "wasm32")]
mod imp {
    use super::{HttpError, Request, Response};
    use wasip2::http::outgoing_handler;
    use wasip2::http::types::{
        ErrorCode, Fields, FutureIncomingResponse, IncomingBody, IncomingResponse, Method,
        OutgoingBody, OutgoingRequest, Scheme,
    };
    use wasip2::io::streams::StreamError;

    pub fn send(request: Request) -> Result<Response, HttpError> {
        let url: http::Uri = request
            .url
            .parse()
            .map_err(|e| HttpError(format!("bad URL {:?}: {e}", request.url)))?;
        let headers = Fields::new();
        for (name, value) in &request.headers {
            headers
                .append(name, value.as_bytes())
                .map_err(|e| HttpError(format!("header {name}: {e:?}")))?;
        }
        let outgoing = OutgoingRequest::new(headers);
        let bad = |what: &str| HttpError(format!("bad {what} in {:?}", request.url));
        outgoing
            .set_method(&method(&request.method))
            .map_err(|()| HttpError(format!("bad method {:?}", request.method)))?;
        let scheme = match url.scheme_str() {
            Some("http") => Scheme::Http,
            Some("https") => Scheme::Https,
            Some(other) => Scheme::Other(other.to_owned()),
            None => return Err(bad("scheme")),
        };
        outgoing
            .set_scheme(Some(&scheme))
            .map_err(|()| bad("scheme"))?;
        outgoing
            .set_authority(url.authority().map(|a| a.as_str()))
            .map_err(|()| bad("host"))?;
        outgoing
            .set_path_with_query(url.path_and_query().map(|p| p.as_str()))
            .map_err(|()| bad("path"))?;
        let body = outgoing.body().expect("a new request has its body");
        let answer = outgoing_handler::handle(outgoing, None).map_err(failed)?;
        write_body(body, &request.body, &answer);
        answer.subscribe().block();
        let incoming = answer
            .get()
            .expect("the answer is ready")
            .expect("the answer is taken once")
            .map_err(failed)?;
        read_response(incoming)
    }

    /// Writes the body as the host takes it, until it is all written or the answer came (a server
    /// that answers without reading the body closes the stream; that is not an error).
    fn write_body(body: OutgoingBody, mut rest: &[u8], answer: &FutureIncomingResponse) {
        if let Ok(stream) = body.write() {
            let answered = answer.subscribe();
            while !rest.is_empty() {
                let writable = stream.subscribe();
                wasip2::io::poll::poll(&[&writable, &answered]);
                if answered.ready() {
                    break;
                }
                match stream.check_write() {
                    Ok(0) => continue,
                    Ok(n) => {
                        let (chunk, tail) = rest.split_at(rest.len().min(n as usize));
                        if stream.write(chunk).is_err() {
                            break;
                        }
                        rest = tail;
                    }
                    Err(_) => break,
                }
            }
            // The stream is a child of the body: it goes first.
            drop(stream);
        }
        let _ = OutgoingBody::finish(body, None);
    }

    fn read_response(incoming: IncomingResponse) -> Result<Response, HttpError> {
        let status = incoming.status();
        let headers = incoming
            .headers()
            .entries()
            .into_iter()
            .map(|(n, v)| (n, String::from_utf8_lossy(&v).into_owned()))
            .collect();
        let body = incoming.consume().expect("the body is taken once");
        let stream = body.stream().expect("the body's stream is taken once");
        let mut bytes = Vec::new();
        loop {
            match stream.blocking_read(64 * 1024) {
                Ok(chunk) => bytes.extend_from_slice(&chunk),
                Err(StreamError::Closed) => break,
                Err(StreamError::LastOperationFailed(e)) => {
                    return Err(HttpError(format!(
                        "reading the answer: {}",
                        e.to_debug_string()
                    )));
                }
            }
        }
        drop(stream);
        let _ = IncomingBody::finish(body);
        Ok(Response {
            status,
            headers,
            body: bytes,
        })
    }

    fn method(name: &str) -> Method {
        match name.to_ascii_uppercase().as_str() {
            "GET" => Method::Get,
            "HEAD" => Method::Head,
            "POST" => Method::Post,
            "PUT" => Method::Put,
            "DELETE" => Method::Delete,
            "CONNECT" => Method::Connect,
            "OPTIONS" => Method::Options,
            "TRACE" => Method::Trace,
            "PATCH" => Method::Patch,
            _ => Method::Other(name.to_owned()),
        }
    }

    /// The error code, said for people; the code's own name stays in it for programs and logs.
    fn failed(code: ErrorCode) -> HttpError {
        let what = match &code {
            ErrorCode::HttpRequestDenied => {
                "refused by the broker: the origin is not in plugin.allowedHosts"
            }
            ErrorCode::ConnectionRefused => "connection refused",
            ErrorCode::DnsError(_) => "the host name did not resolve",
            ErrorCode::ConnectionTimeout
            | ErrorCode::ConnectionReadTimeout
            | ErrorCode::ConnectionWriteTimeout
            | ErrorCode::HttpResponseTimeout => "timed out (the call's timeoutMs bounds it)",
            _ => "failed",
        };
        HttpError(format!("{what} ({code:?})"))
    }
}

#[cfg(not(target_arch = "wasm32"))]
mod imp {
    use super::{HttpError, Request, Response};

    pub fn send(request: Request) -> Result<Response, HttpError> {
        crate::__private::native_http(request)
    }
}
