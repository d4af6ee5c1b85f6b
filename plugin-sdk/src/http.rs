//! HTTP requests from a handler (README, "Plugins, version 2"), through the standard `wasi:http`
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

#[cfg(target_arch = "wasm32")]
mod imp {
    use super::{HttpError, Request, Response};
    use wstd::http::{Body, Client};

    pub fn send(request: Request) -> Result<Response, HttpError> {
        wstd::runtime::block_on(async move {
            let mut builder = wstd::http::Request::builder()
                .method(request.method.as_str())
                .uri(request.url.as_str());
            for (name, value) in &request.headers {
                builder = builder.header(name.as_str(), value.as_str());
            }
            // An empty body is sent as none, so a refusal reaches the guest as the broker's
            // error code, not as a failed body write.
            let body = if request.body.is_empty() {
                Body::empty()
            } else {
                Body::from(request.body)
            };
            let outgoing = builder.body(body).map_err(|e| HttpError(e.to_string()))?;
            let mut answer = Client::new()
                .send(outgoing)
                .await
                .map_err(|e| HttpError(format!("{e:#}")))?;
            let status = answer.status().as_u16();
            let headers = answer
                .headers()
                .iter()
                .map(|(n, v)| {
                    (
                        n.to_string(),
                        String::from_utf8_lossy(v.as_bytes()).into_owned(),
                    )
                })
                .collect();
            let body = answer
                .body_mut()
                .contents()
                .await
                .map_err(|e| HttpError(format!("{e:#}")))?
                .to_vec();
            Ok(Response {
                status,
                headers,
                body,
            })
        })
    }
}

#[cfg(not(target_arch = "wasm32"))]
mod imp {
    use super::{HttpError, Request, Response};

    pub fn send(request: Request) -> Result<Response, HttpError> {
        crate::__private::native_http(request)
    }
}
