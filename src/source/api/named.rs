//! Objects read by name instead of listed by label (`Selection::names`: k8s-sidecar's
//! `RESOURCE_NAME`): a GET of each, a 404 about it meaning it is absent.

use super::{ACCEPT_JSON, ApiSource, read_error};
use crate::kube;
use crate::source::reader::read_object;
use crate::source::scope::{Scope, encode};
use crate::source::{Collect, Error};

impl ApiSource {
    /// The names read in `scope` instead of a list by label (`Selection::names`); `None`
    /// where no entry names the scope's namespace and kind (and in all namespaces).
    pub(super) fn named(&self, scope: Scope) -> Option<Vec<String>> {
        let ns = scope.0?;
        let names: Vec<String> = (self.selection.names.iter())
            .filter(|n| n.namespace.as_deref().is_none_or(|x| x == ns))
            .filter(|n| n.kind.is_none_or(|k| k == scope.1))
            .map(|n| n.name.clone())
            .collect();
        (!names.is_empty()).then_some(names)
    }

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
            let annotation = self.selection.folder_annotation.clone();
            let got = self
                .client
                .get(&url, ACCEPT_JSON, &action)
                .and_then(|body| {
                    let fail = body.failure();
                    read_object(
                        body,
                        &self.selection.keys,
                        resource,
                        annotation.as_deref(),
                        self.raw,
                    )
                    .map_err(|e| read_error(&fail, "not a valid object", e))
                });
            match got {
                Ok((kind, got, item))
                    if kind == resource.kind() && got.name == *name && got.namespace == ns =>
                {
                    out.item(self.qualify(item))?;
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
}
