//! A real browser for the dashboard's tests (docs/operations.md, "Dashboard"): Debian's
//! Chromium, headless, driven through chromedriver (WebDriver, `fantoccini`). `./scripts/test`
//! installs both when they are missing. Screenshots go to `target/dashboard-screenshots/`.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

/// How long a page has to show what a test waits for.
pub const WAIT: Duration = Duration::from_secs(30);

/// A headless Chromium session; chromedriver ends with it.
pub struct Browser {
    /// The WebDriver session.
    pub client: Client,
    driver: Child,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// Starts chromedriver on a free port and a session of it.
    pub async fn start() -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect(
                "chromedriver is missing: ./scripts/test installs chromium and chromium-driver",
            );
        let profile = tempfile::tempdir().unwrap();
        let mut caps = serde_json::Map::new();
        // The flags this machine's closed network needs (no background connections, no QUIC).
        caps.insert(
            "goog:chromeOptions".into(),
            json!({"binary": "/usr/bin/chromium", "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--window-size=1280,900", format!("--user-data-dir={}", profile.path().display()),
            ]}),
        );
        let started = Instant::now();
        let client = loop {
            match ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
                .capabilities(caps.clone())
                .connect(&format!("http://127.0.0.1:{port}"))
                .await
            {
                Ok(c) => break c,
                Err(e) if started.elapsed() < WAIT => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("cannot start a browser session: {e}"),
            }
        };
        Self {
            client,
            driver,
            _profile: profile,
        }
    }

    /// Waits until the element at `css` exists and its text contains `needle`; returns the text.
    pub async fn text(&self, css: &str, needle: &str) -> String {
        let started = Instant::now();
        loop {
            let mut seen = String::new();
            if let Ok(e) = self.client.find(Locator::Css(css)).await {
                seen = e.text().await.unwrap_or_default();
                if seen.contains(needle) {
                    return seen;
                }
            }
            assert!(
                started.elapsed() < WAIT,
                "{css} never showed {needle:?} (last: {seen:?})"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Runs `script` (a function body, run in the page) until what it returns satisfies `done`,
    /// for at most `timeout`; returns that value.
    pub async fn until(
        &self,
        script: &str,
        timeout: Duration,
        done: impl Fn(&Value) -> bool,
    ) -> Value {
        let started = Instant::now();
        loop {
            let seen = self.client.execute(script, vec![]).await.unwrap();
            if done(&seen) {
                return seen;
            }
            assert!(
                started.elapsed() < timeout,
                "the page never got there: {script} (last: {seen})"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Clicks the element at `css` once it exists.
    pub async fn click(&self, css: &str) {
        self.client
            .wait()
            .at_most(WAIT)
            .for_element(Locator::Css(css))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
    }

    /// Chooses `value` in the `<select>` at `css`.
    pub async fn select(&self, css: &str, value: &str) {
        let e = self.client.find(Locator::Css(css)).await.unwrap();
        e.select_by_value(value).await.unwrap();
    }

    /// Types `value` into the (cleared) field at `css`.
    pub async fn fill(&self, css: &str, value: &str) {
        let e = self.client.find(Locator::Css(css)).await.unwrap();
        e.clear().await.unwrap();
        e.send_keys(value).await.unwrap();
    }

    /// Saves what the window shows as `target/dashboard-screenshots/{name}.png`.
    pub async fn screenshot(&self, name: &str) {
        let dir = PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../target/dashboard-screenshots"
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let png = self.client.screenshot().await.unwrap();
        std::fs::write(dir.join(format!("{name}.png")), png).unwrap();
    }

    /// Ends the session and chromedriver.
    pub async fn close(self) {
        let _ = self.client.clone().close().await;
        // chromedriver ends in `drop`.
    }
}

/// A test that fails before [`Browser::close`] leaves no chromedriver behind.
impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
