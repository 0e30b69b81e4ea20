//! What one list request of the apiserver is: its scope (a kind, in one namespace or all),
//! the path and action words that follow from it, its query parameters, whether it asks
//! for metadata only and whether a hub may hold it; and query values percent-encoded.

use std::time::Duration;

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

use super::Resource;

/// One scope: a namespace, or all of them, of one resource.
#[derive(Clone, Copy)]
pub struct Scope<'a>(pub Option<&'a str>, pub Resource);

impl Scope<'_> {
    /// The scope's kind and namespace (`""`: all namespaces).
    pub fn key(&self) -> String {
        format!("{}/{}", self.1.plural(), self.0.unwrap_or(""))
    }

    pub fn path(&self) -> String {
        let r = self.1.plural();
        match self.0 {
            Some(n) => format!("/api/v1/namespaces/{}/{r}", encode(n)),
            None => format!("/api/v1/{r}"),
        }
    }

    pub fn action(&self) -> String {
        let r = self.1.plural();
        match self.0 {
            Some(n) => format!("list {r} in namespace \"{n}\""),
            None => format!("list {r} in all namespaces"),
        }
    }
}

/// One list request: where, with which query parameters, and whether for metadata only.
#[derive(Clone, Copy)]
pub struct ListRequest<'a> {
    pub scope: Scope<'a>,
    pub params: &'a [(&'a str, String)],
    pub metadata: bool,
    /// Ask a hub to hold it this long at most until it has a newer list.
    pub wait: Option<Duration>,
}

impl<'a> ListRequest<'a> {
    pub fn new(
        scope: Scope<'a>,
        params: &'a [(&'a str, String)],
        metadata: bool,
    ) -> ListRequest<'a> {
        ListRequest {
            scope,
            params,
            metadata,
            wait: None,
        }
    }
}

/// Everything but RFC 3986's unreserved characters.
const NOT_UNRESERVED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Percent-encodes a query value (everything but RFC 3986 unreserved characters).
pub fn encode(v: &str) -> String {
    utf8_percent_encode(v, NOT_UNRESERVED).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_are_percent_encoded() {
        assert_eq!(encode("a in (x,y),!b+c"), "a%20in%20%28x%2Cy%29%2C%21b%2Bc");
        assert_eq!(encode("cmpoll.io/module=true"), "cmpoll.io%2Fmodule%3Dtrue");
    }
}
