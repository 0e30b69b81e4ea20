//! `--page-size N`: a scope listed in pages with `limit`/`continue` and no resourceVersion,
//! as client-go's pager does, bounded to 10 × `--timeout` and `MAX_PAGES`; a 410 on a later
//! page lists the scope once more, unpaged.

use std::time::Instant;

use super::{ApiSource, MAX_PAGES};
use crate::kube;
use crate::source::reader::ListMeta;
use crate::source::scope::{ListRequest, Scope};
use crate::source::{Collect, Error, Previous};

impl ApiSource {
    /// Every page of a scope, bounded in pages and in time.
    pub(super) fn list_paged(
        &mut self,
        scope: Scope,
        metadata: bool,
        prev: &dyn Previous,
        out: &mut dyn Collect,
        scope_start: crate::source::Mark,
    ) -> Result<ListMeta, Error> {
        let timeout = self.client.timeout();
        let deadline = crate::backoff::after(Instant::now(), timeout.saturating_mul(10));
        let unbounded = |cause: String| {
            Error::Api(kube::Error::Unbounded {
                action: scope.action(),
                cause,
            })
        };
        let mut token: Option<String> = None;
        let mut first: Option<ListMeta> = None;
        for pages in 0.. {
            if pages >= MAX_PAGES {
                return Err(unbounded(format!(
                    "more than {MAX_PAGES} pages of {} (raise --page-size, or 0 for one unpaged list)",
                    self.page_size
                )));
            }
            if pages > 0 && Instant::now() >= deadline {
                return Err(unbounded(format!(
                    "{pages} pages took more than 10 × --timeout ({}) in all (raise --page-size or --timeout)",
                    humantime::format_duration(timeout.saturating_mul(10))
                )));
            }
            let mut params = vec![("limit", self.page_size.to_string())];
            if let Some(t) = &token {
                params.push(("continue", t.clone()));
            }
            let meta =
                match self.fetched_list(ListRequest::new(scope, &params, metadata), prev, out) {
                    Ok((meta, _)) => meta,
                    Err(Error::Api(e)) if token.is_some() && e.is_expired() => {
                        // client-go's pager: one full list, no limit, no continue, no RV.
                        log::warn!(
                            "{e}; listing {} again in one unpaged request",
                            scope.action()
                        );
                        out.rewind(scope_start)?;
                        let req = ListRequest::new(scope, &[], metadata);
                        return Ok(self.fetched_list(req, prev, out)?.0);
                    }
                    Err(e) => return Err(e),
                };
            match &meta.continue_token {
                Some(t) if token.as_ref() == Some(t) => {
                    return Err(unbounded(
                        "the apiserver returned the same continue token twice".into(),
                    ));
                }
                Some(t) => token = Some(t.clone()),
                None => return Ok(first.unwrap_or(meta)),
            }
            first.get_or_insert(meta);
        }
        unreachable!("the page loop returns")
    }
}
