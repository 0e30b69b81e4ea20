//! Who a request is: an authenticated user as the apiserver's authenticators make it (a
//! TokenReview's `status.user`, or a service-account token the hub verified itself), which
//! every SubjectAccessReview about the request carries.

use std::collections::BTreeMap;

/// An authenticated user.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct User {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}
