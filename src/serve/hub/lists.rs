//! The hub's lists (`Hub::list`): a whole list rendered once per poll, request shape and
//! view and kept for everyone who asks the same (gzipped once, when large), or a page made
//! for one request — from the start or after a continue token's key, at the token's
//! version, 410 in the apiserver's words once the list changed since — and a body made for
//! one request alone.

use std::sync::Arc;

use super::super::auth::{Halt, HubLane};
use super::super::held::{Held, HeldObject, Versions};
use super::super::render::{self, More};
use super::super::renders::{Rendered, Shape};
use super::super::request::Ask;
use super::super::status::StatusError;
use super::{GZIP_FROM, Hub, selected};
use crate::https::http::Answer;

impl Hub {
    /// A list at version `at`: a whole one rendered once per poll, or one made for this
    /// request (a page, or a list at a version the client chose: `Exact`).
    pub(super) fn list(
        &self,
        (view, held): (usize, &Held),
        ask: &Ask,
        v: Versions,
        at: u64,
        lane: HubLane,
    ) -> Result<Answer, Halt> {
        let kind = ask.target.kind;
        let ns = ask.target.namespace.as_deref();
        if ask.continue_token.is_none() && at == v.listed {
            let shape = Shape {
                target: (kind, ask.target.namespace.clone()),
                labels: ask.labels.canonical(),
                fields: ask.fields.as_str().to_string(),
                form: ask.form,
                versions: (v.listed, v.changed),
                view,
            };
            let kept = self.renders.get(&shape);
            // A limit the whole list fits in is the whole list, as the apiserver answers
            // it (no continue token): its render is the one kept for everyone.
            let fits = |items: usize| ask.limit.is_none_or(|limit| items <= limit);
            match kept {
                Some(r) if fits(r.items) => return Ok(answer(ask, &r)),
                Some(_) => {}
                None if !lane.may_wait() => return Err(Halt::Lane(HubLane::Render)),
                None => {
                    let items: Vec<&Arc<HeldObject>> = (held.objects(kind, ns))
                        .filter(|o| selected(ask, o))
                        .collect();
                    if fits(items.len()) {
                        let plain = render::list(kind, ask.form, at, &items, &More::default());
                        let rendered = self.rendered(shape, plain, items.len());
                        return Ok(answer(ask, &rendered));
                    }
                }
            }
        }
        if !lane.may_wait() {
            // A page is made for this request alone.
            return Err(Halt::Lane(HubLane::Render));
        }
        // A page: from the start, or after a continue token's key, of the list at its rv.
        let (rv, after) = match &ask.continue_token {
            Some(t) => {
                let (rv, key) = render::read_continue(t).map_err(|e| {
                    StatusError::bad_request(format!("invalid continue token: {e}"))
                })?;
                if v.changed > rv {
                    return Err(StatusError::expired(EXPIRED_CONTINUE).into());
                }
                let key = match ns {
                    Some(ns) => format!("{ns}/{key}"),
                    None => key,
                };
                (rv, Some(key))
            }
            None => (at, None),
        };
        let rest: Vec<&Arc<HeldObject>> = (held.objects(kind, ns))
            .filter(|o| after.as_ref().is_none_or(|a| o.key() > *a))
            .filter(|o| selected(ask, o))
            .collect();
        let limit = ask.limit.unwrap_or(usize::MAX);
        let page = &rest[..rest.len().min(limit)];
        let more = match (rest.len() > page.len(), page.last()) {
            (true, Some(last)) => More {
                continue_token: Some(render::continue_token(
                    rv,
                    &match ns {
                        Some(_) => last.name.clone(),
                        None => last.key(),
                    },
                )),
                remaining: (ask.labels.as_str().is_empty() && ask.fields.is_empty())
                    .then_some(rest.len() - page.len()),
            },
            _ => More::default(),
        };
        let plain = render::list(kind, ask.form, rv, page, &more);
        Ok(self.body(ask, plain))
    }

    /// A whole list's render, gzipped if large, kept for whoever asks the same.
    fn rendered(&self, shape: Shape, plain: Vec<u8>, items: usize) -> Arc<Rendered> {
        let gzip = (plain.len() >= GZIP_FROM).then(|| render::gzip(&plain).into());
        let rendered = Arc::new(Rendered {
            plain: plain.into(),
            gzip,
            items,
        });
        self.renders.put(shape, rendered.clone());
        rendered
    }

    /// A body made for this request alone, gzipped if large and accepted.
    pub(super) fn body(&self, ask: &Ask, plain: Vec<u8>) -> Answer {
        if ask.gzip && plain.len() >= GZIP_FROM {
            return Answer::json(200, render::gzip(&plain)).with("Content-Encoding", "gzip");
        }
        Answer::json(200, plain)
    }
}

/// The apiserver's words for a continue token whose list is gone.
const EXPIRED_CONTINUE: &str = "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.";

/// A kept render as answered: gzipped when kept so and accepted.
fn answer(ask: &Ask, r: &Rendered) -> Answer {
    match (&r.gzip, ask.gzip) {
        (Some(gz), true) => Answer::json(200, gz.clone()).with("Content-Encoding", "gzip"),
        _ => Answer::json(200, r.plain.clone()),
    }
}
