//! `--fetch-url-keys` (k8s-sidecar's `.url` keys): a module's selected keys ending in
//! `.url` whose value is an `http://` or `https://` URL become files named without `.url`,
//! holding the body of a GET of that URL.
//!
//! They are fetched when the module is added or updated, before `--validate` sees it: its
//! hash covers the URL, not the body, so the same URL is not fetched again until the object
//! changes. A failed fetch (no connection, a timeout, a non-2xx answer, a body over
//! `--max-response-bytes`, a loop of redirects) rejects the module, which keeps its last
//! good version (k8s-sidecar writes an empty file); the reason names the URL without its
//! userinfo or query. Basic auth comes from the URL's own userinfo, or from `Options::basic`
//! for the one origin it is meant for (k8s-sidecar's `REQ_USERNAME`/`REQ_PASSWORD`, sent
//! only to `REQ_URL`'s scheme, host and port, where k8s-sidecar sends them anywhere). At
//! most 5 redirects are followed, and credentials never follow one to another origin.

use std::time::Duration;

use base64::Engine as _;

use crate::http::tls::{self, Trust};
use crate::http::url;
use crate::secret::{Secret, SecretSource};
use crate::source::{Content, ModuleFile};

/// The suffix of a key to fetch.
const SUFFIX: &str = ".url";
/// The most redirects one fetch follows.
const MAX_REDIRECTS: usize = 5;

#[derive(Clone, Debug)]
pub struct Options {
    /// Per request, redirects included (`--timeout`).
    pub timeout: Duration,
    /// The largest body (`--max-response-bytes`).
    pub max_bytes: u64,
    /// No TLS verification (k8s-sidecar's `REQ_SKIP_TLS_VERIFY`; warned about).
    pub insecure: bool,
    /// Basic auth for the downloads on one origin.
    pub basic: Option<OriginAuth>,
}

/// A user and password for one origin (`scheme://host:port`).
#[derive(Clone, Debug)]
pub struct OriginAuth {
    pub origin: String,
    pub user: SecretSource,
    pub password: SecretSource,
}

pub struct Fetcher {
    agent: ureq::Agent,
    opts: Options,
}

impl Fetcher {
    pub fn new(opts: Options, env: &dyn Fn(&str) -> Option<String>) -> Result<Fetcher, String> {
        let trust = if opts.insecure {
            Trust::Insecure
        } else {
            Trust::Platform
        };
        let tls =
            tls::client_config(&trust, None, env).map_err(|e| format!("--fetch-url-keys: {e}"))?;
        let agent = crate::http::agent(crate::http::AgentOptions {
            tls,
            server_name: None,
            timeout: opts.timeout,
            disable_compression: false,
            proxy: None,
            keep_idle: crate::http::SHORT_IDLE,
        });
        Ok(Fetcher { agent, opts })
    }

    /// `files` with each `.url` key fetched; `Ok(None)` when there is none to fetch. The
    /// error is the module's rejection reason.
    pub fn fetch(&self, files: &[ModuleFile]) -> Result<Option<Vec<ModuleFile>>, String> {
        if !files.iter().any(|f| target(f).is_some()) {
            return Ok(None);
        }
        let mut out = Vec::with_capacity(files.len());
        for f in files {
            let Some(link) = target(f) else {
                out.push(f.clone());
                continue;
            };
            let name = &f.key[..f.key.len() - SUFFIX.len()];
            if files.iter().any(|g| g.key == name) {
                return Err(format!(
                    "--fetch-url-keys: {} and {} both name the file {name}",
                    f.key, name
                ));
            }
            let body = self.get(&link).map_err(|e| {
                format!("--fetch-url-keys: key {}: {}: {e}", f.key, url::bare(&link))
            })?;
            // As k8s-sidecar writes them: a `data` key's body as text (when it is), a
            // `binaryData` one as bytes.
            let content = match (&f.content, String::from_utf8(body)) {
                (Content::Text(_), Ok(text)) => Content::Text(text),
                (_, Ok(text)) => Content::Binary(text.into_bytes()),
                (_, Err(e)) => Content::Binary(e.into_bytes()),
            };
            out.push(ModuleFile {
                key: name.to_string(),
                content,
            });
        }
        out.sort_by(|a, b| a.key.as_bytes().cmp(b.key.as_bytes()));
        Ok(Some(out))
    }

    /// One GET and its redirects; the body.
    fn get(&self, link: &str) -> Result<Vec<u8>, String> {
        let first = url::origin(link).ok_or("not an http or https URL")?;
        let mut at = link.to_string();
        for _ in 0..=MAX_REDIRECTS {
            let (bare, userinfo) = url::split_userinfo(&at);
            let here = url::origin(&at).ok_or("a redirect to something not http or https")?;
            // Credentials go where they were meant for, never along a redirect elsewhere.
            let auth = match userinfo {
                Some(a) if here == first => Some(a),
                Some(_) => None,
                None => self.basic_for(&here)?,
            };
            let mut request = ureq::http::Request::builder().method("GET").uri(&bare);
            if let Some(a) = &auth {
                request = request.header("Authorization", a.expose());
            }
            let request = request.body(()).map_err(|e| e.to_string())?;
            let secrets = url::secret_parts(&at);
            let mut resp =
                (self.agent.run(request)).map_err(|e| url::scrub(&e.to_string(), &secrets))?;
            let status = resp.status();
            if status.is_redirection()
                && let Some(location) = resp.headers().get("location")
            {
                let location = location.to_str().map_err(|_| "a redirect to no URL")?;
                at = url::join(&at, location).ok_or("a redirect to no URL")?;
                continue;
            }
            if !status.is_success() {
                let phrase = status.canonical_reason().unwrap_or("");
                return Err(format!("{} {phrase}", status.as_u16()));
            }
            let max = self.opts.max_bytes;
            return (resp.body_mut().with_config().limit(max).read_to_vec()).map_err(|e| match e {
                ureq::Error::BodyExceedsLimit(_) => {
                    format!("its body is larger than --max-response-bytes ({max} bytes)")
                }
                e => url::scrub(&e.to_string(), &secrets),
            });
        }
        Err(format!("more than {MAX_REDIRECTS} redirects"))
    }

    /// The basic auth `Options::basic` holds for `origin`, read now.
    fn basic_for(&self, origin: &str) -> Result<Option<Secret>, String> {
        let Some(b) = self.opts.basic.as_ref().filter(|b| b.origin == origin) else {
            return Ok(None);
        };
        let (user, password) = (b.user.read()?, b.password.read()?);
        let raw = format!("{}:{}", user.expose(), password.expose());
        let encoded = base64::engine::general_purpose::STANDARD.encode(raw);
        Ok(Some(Secret::new(format!("Basic {encoded}"))))
    }
}

/// The URL a `.url` key names: its value, trimmed, when it is an http or https URL.
fn target(f: &ModuleFile) -> Option<String> {
    if !f.key.ends_with(SUFFIX) || f.key.len() == SUFFIX.len() {
        return None;
    }
    let value = std::str::from_utf8(f.content.bytes()).ok()?.trim();
    let lower = value.to_ascii_lowercase();
    (lower.starts_with("http://") || lower.starts_with("https://")).then(|| value.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(key: &str, content: Content) -> ModuleFile {
        ModuleFile {
            key: key.into(),
            content,
        }
    }

    #[test]
    fn only_url_values_of_url_keys_are_fetched() {
        let text = |k: &str, v: &str| file(k, Content::Text(v.into()));
        assert_eq!(
            target(&text("a.json.url", " https://h/x \n")).as_deref(),
            Some("https://h/x")
        );
        assert_eq!(
            target(&file(
                "b.png.url",
                Content::Binary(b"http://h/b.png".to_vec())
            ))
            .as_deref(),
            Some("http://h/b.png")
        );
        assert_eq!(
            target(&text("a.json", "https://h/x")),
            None,
            "not a .url key"
        );
        assert_eq!(
            target(&text("a.url", "file:///etc/passwd")),
            None,
            "not http"
        );
        assert_eq!(target(&text(".url", "https://h/x")), None, "no name left");
        let f = Fetcher::new(
            Options {
                timeout: Duration::from_secs(1),
                max_bytes: 1,
                insecure: false,
                basic: None,
            },
            &|_| None,
        )
        .unwrap();
        let plain = [text("a.json", "{}")];
        assert_eq!(f.fetch(&plain).unwrap(), None, "nothing to fetch");
        let both = [
            text("a.json", "{}"),
            text("a.json.url", "http://127.0.0.1:9/a"),
        ];
        let e = f.fetch(&both).unwrap_err();
        assert!(e.contains("both name the file a.json"), "{e}");
    }
}
