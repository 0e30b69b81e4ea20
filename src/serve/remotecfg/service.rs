//! The three procedures of `collector.v1.CollectorService` once the hub has authenticated
//! and authorized the call (`serve::hub`'s side): each request decoded (`messages.rs`: a
//! malformed one is `invalid_argument`, naming the message and what was wrong), an empty id
//! refused, the collector kept or forgotten (`collectors.rs`); `GetConfig`'s status kept
//! before anything may refuse the call (Alloy sends a status once), then answered with the
//! composition for the view and the namespaces the caller gives (`compose.rs`), or
//! `not_modified` when the hash the collector echoes is the one it would be sent now.
//! `RegisterCollector` never depends on the hub's polls: Alloy does not start when it fails.

use std::sync::Arc;
use std::time::Instant;

use super::collectors::{Asked, Collectors};
use super::compose::{Composition, Compositions, Unmade};
use super::connect::ConnectError;
use super::listable::Listable;
use super::messages::{self, GetConfig, Register, Unregister};
use super::root::RootFiles;
use crate::serve::fleet::collected::Word;
use crate::serve::held::Held;
use crate::source::Resource;

/// The largest call read: a `GetConfig` echoes the content it loaded (at most
/// `compose::MAX_CONTENT`) beside a status message and attributes (each bounded by
/// `messages`).
pub const MAX_CALL: usize = super::compose::MAX_CONTENT + (256 << 10);

/// What a call is answered: a message made for it, or a composition's response (made once
/// for every collector it is sent to).
pub enum Message {
    Made(Vec<u8>),
    Text(Arc<Composition>),
}

/// The service: the root, the compositions made, the collectors kept, the namespaces
/// each user may list.
pub struct Remotecfg {
    root: RootFiles,
    compositions: Compositions,
    pub collectors: Collectors,
    pub listable: Listable,
}

fn invalid(message: &str, e: String) -> ConnectError {
    ConnectError::new("invalid_argument", format!("{message}: {e}"))
}

fn id_given(id: &str, message: &str) -> Result<(), ConnectError> {
    match id.is_empty() {
        true => Err(ConnectError::new(
            "invalid_argument",
            format!("{message}: id is empty"),
        )),
        false => Ok(()),
    }
}

impl Remotecfg {
    pub fn new(root: RootFiles) -> Remotecfg {
        Remotecfg {
            root,
            compositions: Compositions::default(),
            collectors: Collectors::default(),
            listable: Listable::default(),
        }
    }

    /// The root read again, if it is a ConfigMap's.
    pub fn refresh_root(&self, now: Instant) {
        self.root.refresh(now);
    }

    /// `asked` of collector (`who`, `id`) kept, and what it says told the fleet; what the
    /// fleet did not take kept, to be told with the next.
    fn ask(
        &self,
        who: &str,
        id: &str,
        asked: Asked<'_>,
        tell: &mut dyn FnMut(Word) -> bool,
        now: Instant,
    ) {
        let word = self.collectors.asked(who, id, asked, now).1;
        let pending = (word.change.is_some() || word.namespaces.is_some()).then(|| word.clone());
        if !tell(word)
            && let Some(w) = pending
        {
            self.collectors.untold(who, id, w, now);
        }
    }

    /// `RegisterCollector` from `who` (its follower name): an empty answer.
    pub fn register(&self, who: &str, body: &[u8], now: Instant) -> Result<Message, ConnectError> {
        let m = Register::decode(body).map_err(|e| invalid("RegisterCollectorRequest", e))?;
        id_given(&m.id, "RegisterCollectorRequest")?;
        self.collectors
            .register(who, &m.id, &m.name, &m.attributes, now);
        log::debug!(
            "--remotecfg: collector {} of {} registered",
            crate::reason::shown(&m.id, 64),
            crate::reason::shown(who, 256)
        );
        Ok(Message::Made(Vec::new()))
    }

    /// `UnregisterCollector` from `who`: an empty answer.
    pub fn unregister(&self, who: &str, body: &[u8]) -> Result<Message, ConnectError> {
        let m = Unregister::decode(body).map_err(|e| invalid("UnregisterCollectorRequest", e))?;
        id_given(&m.id, "UnregisterCollectorRequest")?;
        self.collectors.forget(who, &m.id);
        Ok(Message::Made(Vec::new()))
    }

    /// `GetConfig` from `who`, served of the view `view` gives, with the modules of the
    /// namespaces `may_list` allows; their error ends it. The status it carries is kept
    /// first, whatever then refuses the call (a hub not ready, a review, a text too large
    /// or asked too often): Alloy sends a status only once. What the fleet is told of the
    /// collector goes to `tell` (`fleet::collected`), as soon as it is known.
    pub fn get_config<E>(
        &self,
        who: &str,
        body: &[u8],
        (view, may_list): (
            impl FnOnce() -> Result<Arc<Held>, E>,
            impl FnMut(&str) -> Result<bool, E>,
        ),
        tell: &mut dyn FnMut(Word) -> bool,
        now: Instant,
    ) -> Result<Result<Message, ConnectError>, E> {
        let m = match GetConfig::decode(body) {
            Ok(m) => m,
            Err(e) => return Ok(Err(invalid("GetConfigRequest", e))),
        };
        if let Err(e) = id_given(&m.id, "GetConfigRequest") {
            return Ok(Err(e));
        }
        let asked = Asked {
            attributes: &m.attributes,
            hash: &m.hash,
            status: m.status.as_ref(),
            sent: None,
            at: 0,
        };
        self.ask(who, &m.id, asked, tell, now);
        let root = self.root.current(now);
        let view = view()?;
        let at = (view.versions(Resource::ConfigMaps, None)).map_or(0, |v| v.listed);
        let composed =
            (self.compositions).compose(&root, &view, (who, &m.attributes), now, may_list)?;
        let c = match composed {
            Ok(c) => c,
            Err(Unmade::TooLarge(why)) => {
                log::warn!("--remotecfg: {why}: the collectors keep what they run");
                return Ok(Err(ConnectError::new("resource_exhausted", why)));
            }
            Err(Unmade::Busy(wait)) => {
                let secs = wait.as_secs_f64().ceil().max(1.0) as u64;
                let mut e = ConnectError::new(
                    "resource_exhausted",
                    format!("too many different texts asked of late: try again in {secs} s"),
                );
                e.retry_after = Some(secs);
                return Ok(Err(e));
            }
        };
        let asked = Asked {
            status: None,
            sent: Some(&c),
            at,
            ..asked
        };
        self.ask(who, &m.id, asked, tell, now);
        if m.hash == c.hash {
            let unchanged = messages::get_config_response("", &c.hash, true);
            return Ok(Ok(Message::Made(unchanged)));
        }
        log::debug!(
            "--remotecfg: collector {} of {} sent {} ({} modules)",
            crate::reason::shown(&m.id, 64),
            crate::reason::shown(who, 256),
            &c.hash[..16.min(c.hash.len())],
            c.modules.len()
        );
        Ok(Ok(Message::Text(c)))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::convert::Infallible;

    use super::*;
    use crate::serve::remotecfg::wire::Writer;
    use crate::serve::testing::kinds;

    fn service() -> (Remotecfg, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!(
            "cmpoll-rc-service-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let root = dir.join("root.alloy");
        std::fs::write(&root, "// the root\n").unwrap();
        let paths = crate::serve::remotecfg::root::Paths {
            root: crate::serve::remotecfg::root::Location::File(root),
            arguments: None,
        };
        (Remotecfg::new(RootFiles::open(paths, None).unwrap()), dir)
    }

    fn get_config(id: &str, hash: &str) -> Vec<u8> {
        let mut w = Writer::default();
        w.bytes(1, id.as_bytes());
        w.bytes(3, hash.as_bytes());
        w.out
    }

    /// (content, hash, not_modified) of an encoded `GetConfigResponse`, read back.
    fn response(b: &[u8]) -> (String, String, bool) {
        let mut r = crate::serve::remotecfg::wire::Reader::new(b);
        let mut out = (String::new(), String::new(), false);
        while let Some(f) = r.field() {
            match f.unwrap() {
                (1, crate::serve::remotecfg::wire::Value::Bytes(b)) => {
                    out.0 = String::from_utf8(b.to_vec()).unwrap()
                }
                (2, crate::serve::remotecfg::wire::Value::Bytes(b)) => {
                    out.1 = String::from_utf8(b.to_vec()).unwrap()
                }
                (3, crate::serve::remotecfg::wire::Value::Varint(v)) => out.2 = v == 1,
                other => panic!("{other:?}"),
            }
        }
        out
    }

    fn bytes(m: Message) -> Vec<u8> {
        match m {
            Message::Made(b) => b,
            Message::Text(c) => c.response().to_vec(),
        }
    }

    fn all(_: &str) -> Result<bool, Infallible> {
        Ok(true)
    }

    fn held(view: &Arc<Held>) -> impl FnOnce() -> Result<Arc<Held>, Infallible> {
        let view = view.clone();
        move || Ok(view)
    }

    /// Review 61 (second), finding 8: a status carried by a call the hub then refuses (a
    /// hub not ready, here) is kept: Alloy sends it only once.
    #[test]
    fn a_refused_calls_status_is_kept() {
        let (s, dir) = service();
        let view = Arc::new(Held::empty(kinds()));
        let t = Instant::now();
        let first = s.get_config(
            "w",
            &get_config("a", ""),
            (held(&view), all),
            &mut |_| true,
            t,
        );
        let (_, hash, _) = response(&bytes(first.unwrap().unwrap()));
        let mut w = Writer::default();
        w.bytes(1, b"a");
        w.bytes(3, hash.as_bytes());
        // remote_config_status: FAILED (field 1, varint 3), its message (field 2).
        let status = [&[0x08, 0x03][..], &[0x12, 7], b"1:1: no"].concat();
        w.bytes(5, &status);
        let not_ready = || Err::<Arc<Held>, &str>("503");
        let refused = s.get_config("w", &w.out, (not_ready, |_| Ok(true)), &mut |_| true, t);
        assert_eq!(refused.err(), Some("503"));
        let (r, about) = s.collectors.get("w", "a").unwrap().status.unwrap();
        assert_eq!(
            (r.status, r.message.as_str()),
            (messages::Status::Failed, "1:1: no")
        );
        assert_eq!(about, hash);
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// The content and its hash; the same hash echoed: `not_modified`, no content; another
    /// (or none, after a restart): the content again.
    #[test]
    fn not_modified_when_the_echoed_hash_is_current() {
        let (s, dir) = service();
        let view = Arc::new(Held::empty(kinds()));
        let t = Instant::now();
        let first = s
            .get_config(
                "w",
                &get_config("a", ""),
                (held(&view), all),
                &mut |_| true,
                t,
            )
            .unwrap()
            .unwrap();
        let (content, hash, not_modified) = response(&bytes(first));
        assert!(
            content.contains("// the root") && !not_modified,
            "{content}"
        );
        assert_eq!(hash.len(), 64);
        let again = s
            .get_config(
                "w",
                &get_config("a", &hash),
                (held(&view), all),
                &mut |_| true,
                t,
            )
            .unwrap()
            .unwrap();
        assert_eq!(response(&bytes(again)), (String::new(), hash.clone(), true));
        let other = s
            .get_config(
                "w",
                &get_config("a", "old"),
                (held(&view), all),
                &mut |_| true,
                t,
            )
            .unwrap()
            .unwrap();
        assert_eq!(response(&bytes(other)).0, content);
        assert_eq!(s.collectors.get("w", "a").unwrap().sent.unwrap().hash, hash);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn bad_requests_are_invalid_arguments() {
        let code = |r: Result<Message, ConnectError>| match r {
            Ok(_) => panic!("taken"),
            Err(e) => e.code,
        };
        let (s, dir) = service();
        let view = Arc::new(Held::empty(kinds()));
        let t = Instant::now();
        let Err(e) = s
            .get_config("w", &[0x0a, 0x05], (held(&view), all), &mut |_| true, t)
            .unwrap()
        else {
            panic!("taken")
        };
        assert_eq!(e.code, "invalid_argument");
        assert!(e.message.starts_with("GetConfigRequest: "), "{}", e.message);
        let Err(e) = s
            .get_config(
                "w",
                &get_config("", ""),
                (held(&view), all),
                &mut |_| true,
                t,
            )
            .unwrap()
        else {
            panic!("taken")
        };
        assert_eq!(e.message, "GetConfigRequest: id is empty");
        assert_eq!(code(s.register("w", &[], t)), "invalid_argument");
        assert!(bytes(s.register("w", &get_config("a", ""), t).unwrap()).is_empty());
        assert!(s.collectors.get("w", "a").unwrap().registered);
        assert!(bytes(s.unregister("w", &get_config("a", "")).unwrap()).is_empty());
        assert!(s.collectors.get("w", "a").is_none());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
