//! `plugin.allowedHosts` (docs/plugins.md, "WebAssembly handlers"): the origins a plugin may send HTTP
//! requests to through `wasi:http`. Anything else is refused, and without the field there is no
//! network at all.

use std::fmt;

/// One allowed origin: a scheme, a host and a port (`https://api.example.com` is port 443).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedOrigin {
    https: bool,
    host: String,
    port: u16,
}

impl AllowedOrigin {
    /// Parses `http[s]://host[:port]` (a trailing `/` is accepted; a path, query, user or
    /// fragment is not: an origin is all that is allowed or not).
    pub fn parse(text: &str) -> Result<Self, String> {
        let uri: http::Uri = text
            .parse()
            .map_err(|e| format!("{text:?} is not a URL: {e}"))?;
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => return Err(format!("{text:?} must start with http:// or https://")),
        };
        let authority = uri
            .authority()
            .ok_or_else(|| format!("{text:?} has no host"))?;
        if authority.as_str().contains('@') {
            return Err(format!("{text:?} must not carry a user"));
        }
        if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
            return Err(format!(
                "{text:?} must be an origin (scheme, host, port) without a path or query"
            ));
        }
        Ok(Self {
            https,
            host: authority.host().to_ascii_lowercase(),
            port: authority.port_u16().unwrap_or(if https { 443 } else { 80 }),
        })
    }

    /// Whether a request to `uri` goes to this origin.
    pub fn allows(&self, uri: &http::Uri) -> bool {
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => return false,
        };
        let Some(authority) = uri.authority() else {
            return false;
        };
        let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
        https == self.https
            && port == self.port
            && authority.host().eq_ignore_ascii_case(&self.host)
    }
}

impl fmt::Display for AllowedOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.https { "https" } else { "http" };
        write!(f, "{scheme}://{}:{}", self.host, self.port)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_origin_allows_its_scheme_host_and_port_only() {
        let api = AllowedOrigin::parse("https://API.example.com/").unwrap();
        let local = AllowedOrigin::parse("http://127.0.0.1:9000").unwrap();
        let uri = |s: &str| s.parse::<http::Uri>().unwrap();
        assert!(api.allows(&uri("https://api.example.com/v1/rates?x=1")));
        assert!(api.allows(&uri("https://api.example.com:443/")));
        assert!(!api.allows(&uri("http://api.example.com/")));
        assert!(!api.allows(&uri("https://api.example.com:8443/")));
        assert!(!api.allows(&uri("https://api.example.com.evil.net/")));
        assert!(local.allows(&uri("http://127.0.0.1:9000/enrich")));
        assert!(!local.allows(&uri("http://127.0.0.1:9001/enrich")));
        assert_eq!(local.to_string(), "http://127.0.0.1:9000");
        for bad in [
            "api.example.com",
            "ftp://x",
            "https://x/path",
            "https://x?q=1",
            "https://u@x",
            "",
        ] {
            assert!(AllowedOrigin::parse(bad).is_err(), "{bad}");
        }
    }
}
