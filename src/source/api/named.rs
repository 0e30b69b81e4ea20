//! Objects read by name instead of listed by label (`Selection::names`: k8s-sidecar's
//! `RESOURCE_NAME`): a GET of each, a 404 about it meaning it is absent; and the GET of
//! one object a metadata list found changed (`get_one`).

use super::{ACCEPT_JSON, ApiSource, read_error};
use crate::kube;
use crate::source::reader::Meta;
use crate::source::scope::{Scope, encode};
use crate::source::{Collect, Error, Item, Resource};

impl ApiSource {
    /// Objects read by name: each GET that finds one delivers it (its labels are not
    /// checked: it was named); a 404 NotFound about it means it is absent.
    pub(super) fn get_named(
        &mut self,
        scope: Scope,
        names: &[String],
        out: &mut dyn Collect,
    ) -> Result<(), Error> {
        let (Some(ns), resource) = (scope.0, scope.1) else {
            return Ok(());
        };
        for name in names {
            let action = format!("get {} {ns}/{name}", resource.singular());
            let url = format!(
                "/api/v1/namespaces/{}/{}/{}",
                encode(ns),
                resource.plural(),
                encode(name)
            );
            let got = self
                .client
                .get(&url, ACCEPT_JSON, &action)
                .and_then(|body| {
                    let fail = body.failure();
                    (self.query.read(body, resource))
                        .map_err(|e| read_error(&fail, "not a valid object", e))
                });
            match got {
                Ok((kind, got, item))
                    if kind == resource.kind() && got.name == *name && got.namespace == ns =>
                {
                    out.item(self.query.qualify(item))?;
                }
                Ok((kind, got, _)) => {
                    return Err(Error::Api(kube::Error::Decode {
                        action,
                        cause: format!(
                            "expected {} {ns}/{name}, got {kind} {}",
                            resource.kind(),
                            got.id()
                        ),
                    }));
                }
                Err(e) if e.is_not_found(resource.plural(), name) => {}
                Err(e) => return Err(Error::Api(e)),
            }
        }
        Ok(())
    }

    /// GETs one object from the cache, not older than its listed resourceVersion; `None`
    /// if it was deleted or relabelled since the list: a 404 `Status` NotFound that names
    /// this very object, or the object no longer selected. Any other 404 (a proxy's text
    /// page, a Status about another object or path) fails the poll.
    pub(super) fn get_one(&mut self, resource: Resource, m: &Meta) -> Result<Option<Item>, Error> {
        let action = format!("get {} {}", resource.singular(), m.id());
        let path = format!(
            "/api/v1/namespaces/{}/{}/{}",
            encode(&m.namespace),
            resource.plural(),
            encode(&m.name)
        );
        let mut url = format!("{path}?resourceVersion={}", encode(&m.resource_version));
        loop {
            let got = self
                .client
                .get(&url, ACCEPT_JSON, &action)
                .and_then(|body| {
                    let fail = body.failure();
                    (self.query.read(body, resource))
                        .map_err(|e| read_error(&fail, "not a valid object", e))
                });
            match got {
                Ok((kind, got, item)) if kind == resource.kind() => {
                    if got.namespace != m.namespace || got.name != m.name {
                        // Not a deletion: an answer about another object says nothing
                        // about this one.
                        return Err(Error::Api(kube::Error::Decode {
                            action,
                            cause: format!("asked for {}, got {}", m.id(), got.id()),
                        }));
                    }
                    // Older than the list said (another apiserver, or hub, behind this one:
                    // the GET from storage above is the newest, a hub's is its own): kept as
                    // the last poll had it, never taken back in time.
                    if let (Ok(have), Ok(want)) = (
                        got.resource_version.parse::<u64>(),
                        m.resource_version.parse::<u64>(),
                    ) && have < want
                    {
                        log::debug!(
                            "{action}: resourceVersion {have} is older than the list's {want}; kept until it catches up"
                        );
                        return Ok(None);
                    }
                    let admitted =
                        (self.query.selection()).admits(&got.namespace, &got.name, &got.labels);
                    return Ok(admitted.then(|| self.query.qualify(item)));
                }
                Ok((kind, _, _)) => {
                    return Err(Error::Api(kube::Error::Decode {
                        action,
                        cause: format!("expected a {}, got kind '{kind}'", resource.kind()),
                    }));
                }
                Err(e) if e.is_not_found(resource.plural(), &m.name) => return Ok(None),
                Err(e) if e.is_too_large_resource_version() && url != path => {
                    log::info!("{e}; reading it from the apiserver's storage instead");
                    url = path.clone();
                }
                Err(e) => return Err(Error::Api(e)),
            }
        }
    }
}
