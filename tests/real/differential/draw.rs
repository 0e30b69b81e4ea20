//! What the differential test asks: a small seeded PRNG (splitmix64), the roles it draws
//! (verbs × resourceNames × namespaces × kinds) and the requests (path shape, both watch
//! spellings, selectors, versions and their match, pages, the watch options, odd boolean
//! spellings). Case `i` depends only on the seed and the cases before it, so a smaller
//! case count runs a prefix of a larger one.

use std::fmt;

/// splitmix64: small, fast, and the same on every machine.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// `true` with `percent` % probability.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    /// One of the values, by weight.
    pub fn weighted<T: Copy>(&mut self, from: &[(u64, T)]) -> T {
        let total: u64 = from.iter().map(|(w, _)| w).sum();
        let mut at = self.next() % total;
        for (w, v) in from {
            if at < *w {
                return *v;
            }
            at -= w;
        }
        unreachable!("the weights add up")
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    ConfigMaps,
    Secrets,
}

impl Kind {
    pub fn plural(self) -> &'static str {
        match self {
            Kind::ConfigMaps => "configmaps",
            Kind::Secrets => "secrets",
        }
    }
}

/// Where a role grants: a Role in `ns0`, Roles in `ns0` and `ns1`, a ClusterRole.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scope {
    One,
    Two,
    Cluster,
}

/// One rule: these verbs on these kinds (only these names, when any), at a scope.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Role {
    pub kinds: Vec<Kind>,
    pub verbs: Vec<&'static str>,
    pub names: Vec<&'static str>,
    pub scope: Scope,
}

/// Who asks.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Who {
    /// No `Authorization` header.
    Anonymous,
    /// A bearer token the apiserver does not know.
    Refused,
    /// A service account bound to the role.
    Account(Role),
}

impl fmt::Display for Who {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = match self {
            Who::Anonymous => return write!(f, "no token"),
            Who::Refused => return write!(f, "a token the apiserver refuses"),
            Who::Account(r) => r,
        };
        let scope = match r.scope {
            Scope::One => "a Role in ns0",
            Scope::Two => "Roles in ns0 and ns1",
            Scope::Cluster => "a ClusterRole",
        };
        let verbs = if r.verbs.is_empty() {
            "no verb".to_string()
        } else {
            r.verbs.join(",")
        };
        let kinds: Vec<&str> = r.kinds.iter().map(|k| k.plural()).collect();
        write!(f, "{scope}: {verbs} on {}", kinds.join(","))?;
        if !r.names.is_empty() {
            write!(f, ", resourceNames [{}]", r.names.join(","))?;
        }
        Ok(())
    }
}

impl Role {
    /// The role's rules, as RBAC takes them.
    pub fn rules(&self) -> serde_json::Value {
        if self.verbs.is_empty() {
            return serde_json::json!([]);
        }
        let kinds: Vec<&str> = self.kinds.iter().map(|k| k.plural()).collect();
        let mut rule =
            serde_json::json!({"apiGroups": [""], "resources": kinds, "verbs": self.verbs});
        if !self.names.is_empty() {
            rule["resourceNames"] = serde_json::json!(self.names);
        }
        serde_json::json!([rule])
    }
}

/// A resourceVersion, resolved when the request is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rv {
    Zero,
    /// The version of the same collection at the hub (what its clients hold).
    Hub,
    /// The apiserver's current one.
    Api,
    /// One from before the pre-phase's writes.
    Old,
    /// Not a number.
    Bogus,
}

/// How a request asks to watch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Watch {
    No,
    /// `/api/v1/watch/…`, with `watch=VALUE` too when some.
    Path(Option<&'static str>),
    /// `…?watch=VALUE`.
    Param(&'static str),
}

/// One request; `{name}`, `{ns0}`… in the field selector are filled in when it is made.
#[derive(Clone, Debug)]
pub struct Request {
    /// 0: the cluster-wide hub; 1: the hub of `ns0` and `ns1`.
    pub hub: usize,
    pub kind: Kind,
    /// `None`: cluster-wide.
    pub ns: Option<usize>,
    pub name: Option<&'static str>,
    pub watch: Watch,
    pub labels: Option<&'static str>,
    pub fields: Option<&'static str>,
    pub rv: Option<Rv>,
    pub rv_match: Option<&'static str>,
    pub limit: Option<&'static str>,
    pub continue_token: Option<&'static str>,
    pub send_initial: Option<&'static str>,
    pub bookmarks: Option<&'static str>,
}

/// Names in paths: selected (`a`, `b`, `c`, `p` from the pre-phase), unselected (`u`),
/// the script's object (`w`, there only while a script runs) and none (`nope`).
const NAMES: &[(u64, &str)] = &[
    (30, "a"),
    (12, "b"),
    (8, "c"),
    (6, "p"),
    (14, "u"),
    (18, "w"),
    (8, "nope"),
];

const LABELS: &[(u64, Option<&str>)] = &[
    (30, None),
    (14, Some("cmpoll.io/module=true")),
    (8, Some("team=a")),
    (5, Some("team!=a")),
    (5, Some("team in (a,b)")),
    (4, Some("!team")),
    (8, Some("cmpoll.io/module=true,team=a")),
    (4, Some("cmpoll.io/module")),
    (3, Some("team notin (a)")),
    (3, Some("cmpoll.io/module!=true")),
    (1, Some("a b")),
];

const FIELDS: &[(u64, Option<&str>)] = &[
    (40, None),
    (12, Some("metadata.name={name}")),
    (5, Some("metadata.name!={name}")),
    (6, Some("metadata.name=b")),
    (3, Some("metadata.name==a")),
    (5, Some("metadata.namespace={ns0}")),
    (3, Some("metadata.namespace!={ns0}")),
    (4, Some("metadata.name=a,metadata.namespace={ns1}")),
    (2, Some("metadata.name=a,metadata.name=b")),
    (2, Some("type=Opaque")),
    (1, Some("data.x=1")),
];

/// `watch=VALUE`: Go's true and false, and what only one reader takes for either.
const TRUTHS: &[(u64, &str)] = &[
    (40, "true"),
    (10, "1"),
    (5, "yes"),
    (5, ""),
    (4, "True"),
    (4, "t"),
    (3, "on"),
    (10, "false"),
    (7, "0"),
    (3, "FALSE"),
    (3, "no"),
    (2, "f"),
];

/// What the apiserver reads as false for a boolean query parameter (apimachinery's
/// `Convert_Slice_string_To_bool`: `0`, and `false` in any case); everything else,
/// the empty value included, is true.
pub fn apiserver_false(v: &str) -> bool {
    v == "0" || v.eq_ignore_ascii_case("false")
}

impl Request {
    /// Whether the apiserver may answer with a stream (a watch path, or a `watch` it
    /// reads as true): such requests are held open over a script of writes.
    pub fn may_stream(&self) -> bool {
        match self.watch {
            Watch::No => false,
            Watch::Path(_) => true,
            Watch::Param(v) => !apiserver_false(v),
        }
    }

    /// The path and query, given the namespaces' names and the resolved version.
    pub fn path(&self, ns: &[String; 3], rv: Option<&str>) -> String {
        let mut p = String::from("/api/v1");
        if matches!(self.watch, Watch::Path(_)) {
            p += "/watch";
        }
        if let Some(i) = self.ns {
            p += &format!("/namespaces/{}", ns[i]);
        }
        p += &format!("/{}", self.kind.plural());
        if let Some(n) = self.name {
            p += &format!("/{n}");
        }
        let mut q: Vec<(&str, String)> = Vec::new();
        match self.watch {
            Watch::Param(v) | Watch::Path(Some(v)) => q.push(("watch", v.to_string())),
            _ => {}
        }
        if let Some(l) = self.labels {
            q.push(("labelSelector", l.to_string()));
        }
        if let Some(f) = self.fields {
            let f = f
                .replace("{name}", self.name.unwrap_or("a"))
                .replace("{ns0}", &ns[0])
                .replace("{ns1}", &ns[1]);
            q.push(("fieldSelector", f));
        }
        if let Some(rv) = rv {
            q.push(("resourceVersion", rv.to_string()));
        }
        for (k, v) in [
            ("resourceVersionMatch", self.rv_match),
            ("limit", self.limit),
            ("continue", self.continue_token),
            ("sendInitialEvents", self.send_initial),
            ("allowWatchBookmarks", self.bookmarks),
        ] {
            if let Some(v) = v {
                q.push((k, v.to_string()));
            }
        }
        if !q.is_empty() {
            let q: Vec<String> = (q.iter())
                .map(|(k, v)| format!("{k}={}", encode(v)))
                .collect();
            p += &format!("?{}", q.join("&"));
        }
        p
    }
}

/// Percent-encoding of a query value (all but the unreserved characters).
pub fn encode(v: &str) -> String {
    v.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// One case: who asks what.
#[derive(Clone, Debug)]
pub struct Case {
    pub n: usize,
    pub who: Who,
    pub req: Request,
}

/// `n` cases from `seed`.
pub fn cases(seed: u64, n: usize) -> Vec<Case> {
    let mut rng = Rng::new(seed);
    let mut out: Vec<Case> = Vec::with_capacity(n);
    let mut drawn: Vec<Who> = Vec::new();
    // A GET that follows a list by the same token (what a follower does: a list, then
    // the objects that changed), drawn with the list.
    let mut then: Option<Request> = None;
    for i in 0..n {
        if let Some(req) = then.take() {
            let who = out[i - 1].who.clone();
            out.push(Case { n: i, who, req });
            continue;
        }
        // Most cases reuse a role asked before, often the last case's (so that
        // decisions the hub keeps meet later requests of the same token), the others
        // draw one.
        let roll = rng.below(100);
        let who = if roll < 20 && i > 0 {
            out[i - 1].who.clone()
        } else if roll < 70 && !drawn.is_empty() {
            drawn[rng.below(drawn.len())].clone()
        } else {
            let w = who(&mut rng);
            if !drawn.contains(&w) {
                drawn.push(w.clone());
            }
            w
        };
        let req = request(&mut rng);
        if req.ns.is_some() && req.name.is_none() && req.watch == Watch::No && rng.chance(15) {
            then = Some(Request {
                name: Some(rng.weighted(&[(3, "a"), (1, "b"), (1, "u")])),
                labels: None,
                fields: None,
                rv: None,
                rv_match: None,
                limit: None,
                continue_token: None,
                send_initial: None,
                bookmarks: None,
                ..req.clone()
            });
        }
        out.push(Case { n: i, who, req });
    }
    out
}

fn who(rng: &mut Rng) -> Who {
    match rng.below(100) {
        0..3 => return Who::Anonymous,
        3..6 => return Who::Refused,
        _ => {}
    }
    let kinds = rng.weighted(&[
        (4, &[Kind::ConfigMaps][..]),
        (3, &[Kind::Secrets][..]),
        (3, &[Kind::ConfigMaps, Kind::Secrets][..]),
    ]);
    let verbs: Vec<&'static str> = ["get", "list", "watch"]
        .into_iter()
        .filter(|_| rng.chance(60))
        .collect();
    let names = rng.weighted(&[
        (55, &[][..]),
        (20, &["a"][..]),
        (15, &["a", "w"][..]),
        (10, &["b"][..]),
    ]);
    let scope = rng.weighted(&[(40, Scope::One), (25, Scope::Two), (35, Scope::Cluster)]);
    Who::Account(Role {
        kinds: kinds.to_vec(),
        verbs,
        names: names.to_vec(),
        scope,
    })
}

fn request(rng: &mut Rng) -> Request {
    let hub = rng.weighted(&[(65, 0), (35, 1)]);
    let kind = rng.weighted(&[(55, Kind::ConfigMaps), (45, Kind::Secrets)]);
    let ns = rng.weighted(&[(45, Some(0)), (22, Some(1)), (15, Some(2)), (18, None)]);
    let name = match ns {
        Some(_) if rng.chance(40) => Some(rng.weighted(NAMES)),
        _ => None,
    };
    let watch = match rng.below(100) {
        0..50 => Watch::No,
        50..65 => Watch::Path(None),
        65..68 => Watch::Path(Some(rng.weighted(TRUTHS))),
        _ => Watch::Param(rng.weighted(TRUTHS)),
    };
    let mut r = Request {
        hub,
        kind,
        ns,
        name,
        watch,
        labels: rng.weighted(LABELS),
        fields: rng.weighted(FIELDS),
        rv: None,
        rv_match: None,
        limit: None,
        continue_token: None,
        send_initial: None,
        bookmarks: None,
    };
    let watching = !matches!(r.watch, Watch::No);
    // `0`, the hub's, the apiserver's, an old one.
    let versions = [
        (3, Some(Rv::Zero)),
        (4, Some(Rv::Hub)),
        (2, Some(Rv::Api)),
        (3, Some(Rv::Old)),
    ];
    // Most requests are ones the apiserver takes; some are not, to compare refusals.
    let roll = rng.below(100);
    if watching && roll < 30 {
        // The streaming list, as client-go's reflector asks it.
        r.send_initial = Some("true");
        r.rv_match = Some("NotOlderThan");
        r.bookmarks = rng.weighted(&[(4, Some("true")), (1, Some("1")), (1, None)]);
        r.rv = rng.weighted(&[(3, None), versions[0], versions[1], versions[2]]);
    } else if watching && roll < 85 {
        r.rv = rng.weighted(&[
            (8, None),
            versions[0],
            versions[1],
            versions[2],
            versions[3],
        ]);
        r.bookmarks = rng.weighted(&[(6, None), (3, Some("true")), (1, Some("1"))]);
        r.limit = rng.weighted(&[(9, None), (1, Some("1"))]);
    } else if roll < 40 {
        r.limit = rng.weighted(&[(6, None), (3, Some("1")), (3, Some("2")), (1, Some("500"))]);
    } else if roll < 65 {
        r.rv = rng.weighted(&versions);
        r.limit = rng.weighted(&[(6, None), (3, Some("1")), (1, Some("2"))]);
    } else if roll < 77 {
        r.rv = rng.weighted(&[versions[1], versions[2], versions[3]]);
        r.rv_match = Some("NotOlderThan");
        r.limit = rng.weighted(&[(3, None), (1, Some("1"))]);
    } else if roll < 89 {
        r.rv = rng.weighted(&[versions[1], versions[2], versions[3]]);
        r.rv_match = Some("Exact");
        r.limit = rng.weighted(&[(3, None), (1, Some("1"))]);
    } else {
        // Options that do not go together, or do not parse.
        r.rv = rng.weighted(&[(4, None), versions[0], versions[1], (1, Some(Rv::Bogus))]);
        r.rv_match = rng.weighted(&[
            (2, None),
            (2, Some("NotOlderThan")),
            (2, Some("Exact")),
            (1, Some("Later")),
        ]);
        r.limit = rng.weighted(&[(3, None), (1, Some("2")), (1, Some("-1"))]);
        r.continue_token = rng.weighted(&[(2, None), (1, Some("bm9wZQ"))]);
        r.send_initial = rng.weighted(&[(2, None), (1, Some("true")), (1, Some("false"))]);
        r.bookmarks = rng.weighted(&[(2, None), (1, Some("true"))]);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_draws_the_same_cases_and_a_prefix_for_fewer() {
        let (a, b) = (cases(7, 200), cases(7, 50));
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(format!("{x:?}"), format!("{y:?}"));
        }
        assert_ne!(format!("{:?}", cases(8, 50)), format!("{b:?}"));
    }

    #[test]
    fn paths_are_the_apiservers() {
        let ns = ["n0".to_string(), "n1".to_string(), "n2".to_string()];
        let r = Request {
            hub: 0,
            kind: Kind::Secrets,
            ns: Some(1),
            name: Some("a"),
            watch: Watch::Path(Some("")),
            labels: Some("team in (a,b)"),
            fields: Some("metadata.name!={name},metadata.namespace={ns0}"),
            rv: None,
            rv_match: None,
            limit: Some("2"),
            continue_token: None,
            send_initial: None,
            bookmarks: Some("true"),
        };
        assert_eq!(
            r.path(&ns, Some("12")),
            "/api/v1/watch/namespaces/n1/secrets/a?watch=&labelSelector=team%20in%20%28a%2Cb%29&fieldSelector=metadata.name%21%3Da%2Cmetadata.namespace%3Dn0&resourceVersion=12&limit=2&allowWatchBookmarks=true"
        );
        assert!(r.may_stream());
    }
}
