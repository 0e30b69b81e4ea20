//! Request credentials: a static token, a token file, basic auth, or an exec plugin.
//! (Static client certificates are part of TLS, see `tls.rs`; an exec plugin's
//! certificate is handed to the client, which rebuilds its TLS configuration.)
//!
//! A token file is re-read whenever it changed (path, size, mtime or inode differ, which
//! is what kubelet's atomic symlink swap of a projected token looks like), looked at
//! before every request, and, unconditionally, after a 401. A failed re-read keeps the
//! previous token and says so, like client-go.
//! An exec plugin runs before the first request, again a little before what it issued
//! expires, and after a 401; a failed run keeps what it issued last while that is valid.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use base64::Engine as _;

use super::exec::{self, Issued, Plugin};
use crate::http::tls::Identity;
use crate::secret::Secret;

/// Where the credential comes from (plain data, part of `kube::Config`).
#[derive(Clone, Debug, PartialEq)]
pub enum Credential {
    None,
    Token(Secret),
    /// A token file, read again when it changes and after a 401; `fallback` (a kubeconfig's
    /// static `token` next to its `tokenFile`) is sent while the file has never been read.
    TokenFile {
        path: PathBuf,
        fallback: Option<Secret>,
    },
    Basic {
        username: String,
        password: Secret,
    },
    Exec(Box<Plugin>),
}

/// What identifies a file version without reading it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Stamp {
    mtime: Option<SystemTime>,
    len: u64,
    ino: u64,
}

pub fn stamp(path: &Path) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let m = fs::metadata(path).ok()?;
    Some(Stamp {
        mtime: m.modified().ok(),
        len: m.len(),
        ino: m.ino(),
    })
}

/// Reads a token file: trimmed, non-empty.
pub fn read_token_file(path: &Path) -> Result<Secret, String> {
    let text = fs::read_to_string(path)
        .map_err(|e| format!("cannot read token file '{}': {e}", path.display()))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(format!("token file '{}' is empty", path.display()));
    }
    Ok(Secret::new(token))
}

/// The live credential: what goes in the `Authorization` header, kept fresh.
#[derive(Debug)]
pub struct Auth {
    source: Credential,
    header: Option<Secret>,
    stamp: Option<Stamp>,
    /// What the exec plugin issued last, and when.
    issued: Option<(Issued, SystemTime)>,
    /// Counts changes of the exec plugin's client certificate.
    identity_changes: u64,
    /// The token file was read at least once.
    read_file: bool,
}

impl Auth {
    /// Reads the credential once; a token file that cannot be read is an error here.
    pub fn new(source: Credential) -> Result<Auth, String> {
        let mut auth = Auth {
            source,
            header: None,
            stamp: None,
            issued: None,
            identity_changes: 0,
            read_file: false,
        };
        auth.load()?;
        Ok(auth)
    }

    fn load(&mut self) -> Result<(), String> {
        self.header = match &self.source {
            Credential::None => None,
            Credential::Token(t) => Some(Secret::new(format!("Bearer {}", t.expose()))),
            Credential::TokenFile { path, fallback } => {
                self.stamp = stamp(path);
                match (read_token_file(path), fallback) {
                    (Ok(token), _) => {
                        self.read_file = true;
                        Some(Secret::new(format!("Bearer {}", token.expose())))
                    }
                    // client-go: the file when it can be read, what it last gave when it
                    // cannot, the static token when it never could.
                    (Err(e), Some(token)) if !self.read_file => {
                        log::debug!("{e}; sending the kubeconfig's token instead");
                        Some(Secret::new(format!("Bearer {}", token.expose())))
                    }
                    (Err(e), _) => return Err(e),
                }
            }
            Credential::Basic { username, password } => {
                let raw = format!("{username}:{}", password.expose());
                Some(Secret::new(format!(
                    "Basic {}",
                    base64::engine::general_purpose::STANDARD.encode(raw)
                )))
            }
            // Run on first use (`prepare`), not at start-up.
            Credential::Exec(_) => None,
        };
        Ok(())
    }

    /// Before a request: runs the exec plugin if it has not run yet or what it issued is
    /// due for renewal. An error only when there is no valid credential left.
    pub fn prepare(&mut self, now: SystemTime) -> Result<(), String> {
        let Credential::Exec(plugin) = &self.source else {
            return Ok(());
        };
        let due = match &self.issued {
            None => true,
            Some((issued, at)) => exec::refresh_at(*at, issued.expires).is_some_and(|t| now >= t),
        };
        if !due {
            return Ok(());
        }
        match plugin.run(exec::TIMEOUT) {
            Ok(issued) => {
                self.accept(issued, now);
                Ok(())
            }
            Err(e) => match &self.issued {
                Some((old, _)) if old.expires.is_some_and(|x| now < x) => {
                    log::warn!("{e}; using the credential it issued before until it expires");
                    Ok(())
                }
                _ => {
                    self.header = None;
                    Err(e)
                }
            },
        }
    }

    fn accept(&mut self, issued: Issued, now: SystemTime) {
        let old_identity = self.issued.as_ref().and_then(|(i, _)| i.identity.as_ref());
        if issued.identity.as_ref() != old_identity {
            self.identity_changes += 1;
        }
        self.header = issued
            .token
            .as_ref()
            .map(|t| Secret::new(format!("Bearer {}", t.expose())));
        let until = issued
            .expires
            .map(|x| humantime::format_rfc3339_seconds(x).to_string())
            .unwrap_or_else(|| "a 401".into());
        log::debug!(
            "exec credential plugin issued a {} valid until {until}",
            match (&issued.token, &issued.identity) {
                (Some(_), Some(_)) => "token and client certificate",
                (Some(_), None) => "token",
                _ => "client certificate",
            }
        );
        self.issued = Some((issued, now));
    }

    /// The exec plugin's client certificate, if it issued one, and a counter that changes
    /// whenever that certificate does.
    pub fn identity(&self) -> (Option<&Identity>, u64) {
        (
            self.issued.as_ref().and_then(|(i, _)| i.identity.as_ref()),
            self.identity_changes,
        )
    }

    /// The `Authorization` header value, if any.
    pub fn header(&self) -> Option<&Secret> {
        self.header.as_ref()
    }

    /// Whether a bearer token or password is sent (and must not go over plain HTTP).
    pub fn sends_secret(&self) -> bool {
        !matches!(self.source, Credential::None)
    }

    /// Before a request: re-reads a token file that changed. Returns whether it did.
    pub fn refresh_if_changed(&mut self) -> bool {
        let Credential::TokenFile { path, .. } = &self.source else {
            return false;
        };
        if stamp(path) == self.stamp {
            return false;
        }
        self.reload("changed")
    }

    /// After a 401: re-reads whatever can be re-read, re-runs an exec plugin. Returns
    /// whether anything could be.
    pub fn refresh_after_unauthorized(&mut self) -> bool {
        match &self.source {
            Credential::TokenFile { .. } => self.reload("401 Unauthorized"),
            Credential::Exec(plugin) => match plugin.run(exec::TIMEOUT) {
                Ok(issued) => {
                    log::info!(
                        "401 Unauthorized: the exec credential plugin issued a new credential"
                    );
                    self.accept(issued, SystemTime::now());
                    true
                }
                Err(e) => {
                    log::warn!("{e}");
                    false
                }
            },
            _ => false,
        }
    }

    fn reload(&mut self, why: &str) -> bool {
        let before = self.header.clone();
        match self.load() {
            Ok(()) => {
                if self.header != before {
                    log::info!("token file re-read ({why}): using the new token");
                }
                true
            }
            Err(e) => {
                log::warn!("{e}; keeping the previous token");
                self.header = before;
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_file_is_re_read_when_it_changes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        fs::write(&path, "one\n").unwrap();
        let mut auth = Auth::new(Credential::TokenFile {
            path: path.clone(),
            fallback: None,
        })
        .unwrap();
        assert_eq!(auth.header().unwrap().expose(), "Bearer one");
        assert!(!auth.refresh_if_changed(), "unchanged file is not re-read");
        // Kubelet swaps a symlink; a new file (new inode) is what the path shows.
        let next = dir.path().join("token.new");
        fs::write(&next, "two").unwrap();
        fs::rename(&next, &path).unwrap();
        assert!(auth.refresh_if_changed());
        assert_eq!(auth.header().unwrap().expose(), "Bearer two");
        fs::remove_file(&path).unwrap();
        assert!(
            !auth.refresh_after_unauthorized(),
            "a vanished file keeps the token"
        );
        assert_eq!(auth.header().unwrap().expose(), "Bearer two");
    }

    #[test]
    fn a_missing_or_empty_token_file_is_an_error_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let file = |p: PathBuf| Credential::TokenFile {
            path: p,
            fallback: None,
        };
        let e = Auth::new(file(dir.path().join("nope"))).unwrap_err();
        assert!(e.starts_with("cannot read token file"), "{e}");
        fs::write(dir.path().join("empty"), " \n").unwrap();
        let e = Auth::new(file(dir.path().join("empty"))).unwrap_err();
        assert!(e.ends_with("is empty"), "{e}");
    }

    /// client-go: a token file next to a static token is read whenever it can be; the
    /// static token is sent while it never could.
    #[test]
    fn a_token_file_wins_over_the_static_token_which_is_its_fallback() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        let both = || Credential::TokenFile {
            path: path.clone(),
            fallback: Some(Secret::new("static")),
        };
        let mut auth = Auth::new(both()).unwrap();
        assert_eq!(auth.header().unwrap().expose(), "Bearer static");
        fs::write(&path, "from-file\n").unwrap();
        assert!(auth.refresh_if_changed());
        assert_eq!(auth.header().unwrap().expose(), "Bearer from-file");
        let auth = Auth::new(both()).unwrap();
        assert_eq!(auth.header().unwrap().expose(), "Bearer from-file");
    }

    #[test]
    fn basic_auth_and_debug_redaction() {
        let auth = Auth::new(Credential::Basic {
            username: "bob".into(),
            password: Secret::new("secret"),
        })
        .unwrap();
        assert_eq!(auth.header().unwrap().expose(), "Basic Ym9iOnNlY3JldA==");
        let dbg = format!("{auth:?}");
        assert!(!dbg.contains("secret") && !dbg.contains("Ym9i"), "{dbg}");
    }
}
