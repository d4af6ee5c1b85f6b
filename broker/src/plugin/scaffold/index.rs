//! Is the SDK of this binary on crates.io? `mmmq plugin new` asks the registry's sparse index
//! (the file cargo itself reads) before it writes a registry dependency that cargo could not
//! resolve.

use std::time::Duration;

/// The sparse-index file of `mmmq-plugin-sdk` on crates.io: one JSON object per published
/// version.
pub const CRATES_IO: &str = "https://index.crates.io/mm/mq/mmmq-plugin-sdk";

/// Overrides [`CRATES_IO`] (tests; a registry mirror).
pub const INDEX_ENV: &str = "MMMQ_SDK_INDEX";

/// How long the question may take: a scaffold without network is written at once, not after
/// reqwest's default of never.
const TIMEOUT: Duration = Duration::from_secs(3);

/// Why cargo could not take the SDK from the registry; each says so in a few words on stdout.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Unpublished {
    /// The index has no such crate.
    #[error("mmmq-plugin-sdk is not on crates.io")]
    NoCrate,
    /// The crate is there, this version is not.
    #[error("mmmq-plugin-sdk {0} is not on crates.io")]
    NoVersion(String),
    /// The version is there but yanked: a new lock file would not take it.
    #[error("mmmq-plugin-sdk {0} is yanked on crates.io")]
    Yanked(String),
    /// The index answered something else.
    #[error("{url} answered {status}")]
    Status {
        /// The index URL asked.
        url: String,
        /// Its status code.
        status: u16,
    },
    /// No answer: offline, refused, timed out.
    #[error("{url} could not be asked: {why}")]
    Unreachable {
        /// The index URL asked.
        url: String,
        /// The error and its causes.
        why: String,
    },
}

/// The index URL to ask: `$MMMQ_SDK_INDEX`, else crates.io's.
pub fn url() -> String {
    std::env::var(INDEX_ENV).unwrap_or_else(|_| CRATES_IO.to_owned())
}

/// `Ok` when the index at `url` lists `version` of the SDK, not yanked.
pub async fn published(url: &str, version: &str) -> Result<(), Unpublished> {
    let unreachable = |e: reqwest::Error| {
        // The URL is said once, beside the reason.
        let e = e.without_url();
        let mut why = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(cause) = source {
            why = format!("{why}: {cause}");
            source = cause.source();
        }
        Unpublished::Unreachable {
            url: url.to_owned(),
            why,
        }
    };
    let client = reqwest::Client::builder()
        .timeout(TIMEOUT)
        .user_agent(concat!("mmmq/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(unreachable)?;
    let answer = client.get(url).send().await.map_err(unreachable)?;
    match answer.status().as_u16() {
        200 => {}
        // crates.io answers 404 for a crate it does not have (403 from some mirrors).
        403 | 404 | 410 => return Err(Unpublished::NoCrate),
        status => {
            return Err(Unpublished::Status {
                url: url.to_owned(),
                status,
            });
        }
    }
    let text = answer.text().await.map_err(unreachable)?;
    listed(&text, version)
}

/// The sparse-index format: one JSON object per line, `vers` the version, `yanked` a bool.
fn listed(index: &str, version: &str) -> Result<(), Unpublished> {
    #[derive(serde::Deserialize)]
    struct Line {
        vers: String,
        #[serde(default)]
        yanked: bool,
    }
    let line = index
        .lines()
        .filter_map(|line| serde_json::from_str::<Line>(line).ok())
        .find(|line| line.vers == version);
    match line {
        None => Err(Unpublished::NoVersion(version.to_owned())),
        Some(line) if line.yanked => Err(Unpublished::Yanked(version.to_owned())),
        Some(_) => Ok(()),
    }
}

/// A sparse index on 127.0.0.1 for tests: `body` for the SDK's file, `500` for `/broken`, `404`
/// for anything else (as crates.io answers for a crate it does not have); returns the URL of the
/// SDK's file.
#[cfg(test)]
pub(crate) async fn fake_index(body: String) -> String {
    let app = axum::Router::new()
        .route(
            "/mm/mq/mmmq-plugin-sdk",
            axum::routing::get(move || async move { body }),
        )
        .route(
            "/broken",
            axum::routing::get(|| async { axum::http::StatusCode::INTERNAL_SERVER_ERROR }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}/mm/mq/mmmq-plugin-sdk")
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINES: &str = concat!(
        r#"{"name":"mmmq-plugin-sdk","vers":"0.1.0","deps":[],"cksum":"00","features":{},"yanked":false}"#,
        "\n",
        r#"{"name":"mmmq-plugin-sdk","vers":"0.2.0","deps":[],"cksum":"00","features":{},"yanked":true,"v":2}"#,
        "\n",
    );

    #[tokio::test]
    async fn a_listed_version_is_published_and_the_rest_are_not() {
        let url = fake_index(LINES.to_owned()).await;
        assert_eq!(published(&url, "0.1.0").await, Ok(()));
        assert_eq!(
            published(&url, "0.2.0").await,
            Err(Unpublished::Yanked("0.2.0".into()))
        );
        assert_eq!(
            published(&url, "0.1.1").await,
            Err(Unpublished::NoVersion("0.1.1".into()))
        );
        // A prefix is not the version.
        assert_eq!(
            published(&url, "0.1").await,
            Err(Unpublished::NoVersion("0.1".into()))
        );
        let missing = url.replace("mmmq-plugin-sdk", "other");
        assert_eq!(
            published(&missing, "0.1.0").await,
            Err(Unpublished::NoCrate)
        );
        let broken = url.replace("mm/mq/mmmq-plugin-sdk", "broken");
        assert_eq!(
            published(&broken, "0.1.0").await,
            Err(Unpublished::Status {
                url: broken.clone(),
                status: 500
            })
        );
    }

    #[tokio::test]
    async fn no_answer_is_unpublished_with_the_reason() {
        // A port nothing listens on: refused at once.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let url = format!("http://127.0.0.1:{port}/mm/mq/mmmq-plugin-sdk");
        match published(&url, "0.1.0").await {
            Err(Unpublished::Unreachable { url: asked, why }) => {
                assert_eq!(asked, url);
                assert!(why.contains("Connection refused"), "{why}");
            }
            other => panic!("{other:?}"),
        }
    }
}
