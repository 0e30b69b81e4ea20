//! The hub's answers to each request (the HTTPS server's `Handler`): probes and metrics,
//! discovery, and the read API over the last complete poll (`Held`), in the apiserver's
//! order: its bearer token authenticated (401) and no impersonation asked (403), the hub's
//! readiness checked (503: no complete poll, or one older than the readiness bound; before
//! authorization, since a hub that lost its access fails its reviews with its polls), what
//! it does authorized for its own verb and name as the apiserver's request-info resolver
//! names them (403: `request::attributes`), then its options read as the apiserver's
//! handlers read them (406, 400, 422: `request::ask`; any method but GET, once authorized,
//! is a 405), then the answer: the list or object,
//! 404, a watch (`watch.rs`), 410 for a continue token whose list changed since. A request
//! whose review is not kept is sent to a review lane (`auth.rs`) before anything is
//! answered.
//!
//! A list that asks `resourceVersion=R&resourceVersionMatch=NotOlderThan` of a hub whose
//! last list of that scope is older than R (two hubs behind one Service, this one behind)
//! waits for the next poll up to 3 seconds, as the watch cache waits, then gets the watch
//! cache's 504; a follower therefore never takes an older answer than it holds. A
//! follower's `x-cmpoll-wait: S` on such a list makes the hub hold it until what the
//! scope holds changes after R (then the list, at once) or S seconds pass (then `304 Not
//! Modified`, no body): a change reaches every waiting follower as soon as the hub's poll
//! sees it (`hub_protocol`'s waiting list, for a follower whose role has no `watch`).
//! Every answer says `x-cmpoll-hub`, so a follower knows it may ask to wait or watch.
//! A follower's report (`hub_protocol::REPORT_PATH`) is answered by `fleet::report`; every
//! authenticated request, and every pull of a follower's held watch, tells the fleet its
//! follower was heard from.
//! Whole lists are rendered once per poll and request shape, and gzipped once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use super::auth::{Attributes, Auth, Halt, HubLane, User, Who};
use super::discovery;
use super::fleet::Fleet;
use super::fleet::report::Intake;
use super::fleet::state::follower_name;
use super::held::{Held, HeldObject};
use super::impersonate;
use super::remotecfg::service::Remotecfg;
use super::render;
use super::renders::Renders;
use super::request::{self, Ask, Query, Route, Target};
use super::status::StatusError;
use super::views::{self, Views};
use super::watch::{Timeline, Watch};
use crate::backoff::Rng;
use crate::https::http::{Answer, Request};
use crate::https::server::{Call, Handler, Holder, Peer, Reply, Wake};
use crate::hub_protocol::{BEHIND_WAIT, HUB_HEADER, WAIT_HEADER};
use crate::locks::Recover;
use crate::ops::health::Health;
use crate::ops::metrics::{Metrics, Served};
use crate::source::{Resource, Resources};

/// Bodies from this size are gzipped for a client that accepts it.
const GZIP_FROM: usize = 16 * 1024;

/// What the poll loop tells `/status` of its parts.
#[derive(Default)]
pub struct Said {
    /// `--validate`: what the hub's own judge holds back.
    pub validation: serde_json::Value,
    /// `--rollout`: the rollouts.
    pub rollouts: serde_json::Value,
}

/// What every request shares.
pub struct Hub {
    kinds: Resources,
    timeline: Arc<RwLock<Timeline>>,
    pub health: Arc<Mutex<Health>>,
    pub metrics: Arc<Mutex<Metrics>>,
    auth: Auth,
    served: Served,
    renders: Renders,
    /// A request waits because this hub is behind it: the next poll wakes the waiters.
    behind: AtomicBool,
    rng: Mutex<Rng>,
    /// What the followers reported and when each was last heard from (`fleet/`).
    fleet: Arc<Fleet>,
    /// What `/status` says of the poll loop's own parts, as it last said.
    said: Mutex<Said>,
    /// `--remotecfg`: Alloy's collectors (`remotecfg.rs`).
    pub(super) remotecfg: Option<Remotecfg>,
}

/// What a read asks, besides its request: the query as the apiserver reads it, what it
/// does as its authorizer is asked, why it is handled now, and on which lane.
struct Asked<'a> {
    query: &'a Query,
    what: Attributes,
    wake: Wake,
    lane: HubLane,
}

impl Hub {
    pub fn new(
        kinds: Resources,
        health: Arc<Mutex<Health>>,
        metrics: Arc<Mutex<Metrics>>,
        auth: Auth,
        served: Served,
    ) -> Hub {
        Hub {
            kinds,
            timeline: Arc::new(RwLock::new(Timeline::default())),
            health,
            metrics,
            auth,
            served,
            renders: Renders::default(),
            behind: AtomicBool::new(false),
            rng: Mutex::new(Rng::from_time()),
            fleet: Arc::new(Fleet::default()),
            said: Mutex::new(Said::default()),
            remotecfg: None,
        }
    }

    /// `--remotecfg`: the hub answers Alloy's collectors too.
    pub fn with_remotecfg(mut self, remotecfg: Option<Remotecfg>) -> Hub {
        self.remotecfg = remotecfg;
        self
    }

    /// The fleet, as the hub keeps it.
    pub fn fleet(&self) -> &Fleet {
        &self.fleet
    }

    /// The last complete poll (`None` before the first), as the top view serves it.
    pub fn current(&self) -> Option<Arc<Held>> {
        (self.timeline.read().recover()).held.clone()
    }

    /// What every client is served (`None` before the first poll).
    pub fn views(&self) -> Option<Views> {
        (self.timeline.read().recover()).views()
    }

    /// Serves `held` to every client from now on (`publish_views`).
    #[cfg(test)]
    pub fn publish(&self, held: Held) -> bool {
        self.publish_views(Views::one(Arc::new(held)))
    }

    /// Serves `views` from now on, and what changed since the last poll to its watchers;
    /// `true` when waiting requests should be asked again (what a scope holds changed, or
    /// one waits for this hub to catch up).
    pub fn publish_views(&self, views: Views) -> bool {
        // Before the timeline is held for writing: the server's thread reads it.
        self.fleet.served(&views.top, Instant::now());
        let mut t = self.timeline.write().recover();
        let prev = t
            .views()
            .unwrap_or_else(|| Views::one(Arc::new(Held::empty(self.kinds))));
        let changes = |v: &Views| -> Vec<u64> {
            let all = std::iter::once(&v.top).chain(v.cuts.iter().map(|(_, h)| h));
            all.flat_map(|h| h.scopes.iter().map(|s| s.changed))
                .collect()
        };
        let changed = t.held.is_none() || changes(&prev) != changes(&views);
        t.history.record_views(&prev, &views);
        t.held = Some(views.top);
        t.cuts = views.cuts;
        drop(t);
        changed | self.behind.swap(false, Ordering::SeqCst)
    }

    /// The cohort of `user` (`views::cohort` of its follower name): always, since the
    /// views it picks between may change as it is read.
    fn cohort(&self, user: &User) -> f64 {
        views::cohort(&follower_name(user))
    }

    /// Each kind's newest change held back by the history (a scope not listed past it).
    pub fn held_back(&self) -> Vec<(Resource, u64)> {
        let t = self.timeline.read().recover();
        (self.kinds.iter())
            .filter_map(|k| Some((k, t.history.kind(k).held_back()?)))
            .collect()
    }

    /// Who asks, authenticated (401 first, as in the apiserver's filters), and not asking
    /// to be someone else (`impersonate`: a refusal about the request itself); and what
    /// the request does, as the apiserver's authorizer would be asked.
    fn who(
        &self,
        req: &Request,
        route: &Route,
        query: &Query,
        lane: HubLane,
    ) -> Result<(Who, Attributes), Halt> {
        let who = self.auth.authenticate(req.header("authorization"), lane)?;
        (self.fleet).seen(&who.user, req.header(WAIT_HEADER), Instant::now());
        let what = request::attributes(&req.method, &req.path, query, route);
        match impersonate::refused(&who.user, &req.headers, &what) {
            Some(r) => Err(r.into()),
            None => Ok((who, what)),
        }
    }

    fn reply(&self, req: &Request, peer: &Peer, call: Call) -> Result<Reply, Halt> {
        // Reviews and renders are waited for on their own lanes only (`HubLane::may_wait`).
        let lane = HubLane::of(call.lane);
        let route = request::route(&req.path);
        let query = Query::parse(&req.query);
        match &route {
            Route::Ops(path) => self.ops(req, path, &route, &query, lane).map(Reply::Answer),
            Route::Discovery(d) => {
                let d = *d;
                let (who, _) = self.who(req, &route, &query, lane)?;
                self.auth.authorize(
                    &who.user,
                    &Attributes::Path {
                        verb: "get",
                        path: req.path.clone(),
                    },
                    lane,
                )?;
                let addr = req.header("host").unwrap_or_default().to_string();
                let addr = if addr.is_empty() {
                    peer.addr.to_string()
                } else {
                    addr
                };
                Ok(Reply::Answer(Answer::json(
                    200,
                    discovery::body(d, self.kinds, &addr),
                )))
            }
            Route::Report => {
                let (who, _) = self.who(req, &route, &query, lane)?;
                let intake = Intake {
                    fleet: &self.fleet,
                    auth: &self.auth,
                    served: &self.served,
                };
                intake.answer(req, &who.user, lane).map(Reply::Answer)
            }
            Route::Remotecfg => self.collector(req, (&route, &query, lane)),
            Route::Unknown => {
                self.who(req, &route, &query, lane)?;
                Err(StatusError::no_such_path().into())
            }
            Route::Read(target) => {
                let (who, what) = self.who(req, &route, &query, lane)?;
                let call = Asked {
                    query: &query,
                    what,
                    wake: call.wake,
                    lane,
                };
                self.read(req, target.clone(), who, call)
            }
        }
    }

    /// The last complete poll as a client of `cohort` is served it, and the view's place,
    /// if the hub is ready to serve it.
    fn ready_held(&self, cohort: f64) -> Result<(usize, Arc<Held>), StatusError> {
        let ready = (self.health.lock().recover()).serving_withheld(Instant::now());
        let view = (self.timeline.read().recover()).view(cohort);
        match (ready, view) {
            (Ok(()), Some(held)) => Ok(held),
            (Err(why), _) => Err(StatusError::unavailable(
                format!("cmpoll serve is not ready: {why}"),
                1,
            )),
            (Ok(()), None) => Err(StatusError::unavailable(
                "cmpoll serve is not ready: no complete poll yet",
                1,
            )),
        }
    }

    /// The read API, for `who` (authenticated first, as in the apiserver's filters: an
    /// anonymous request is a 401 whatever else is wrong with it), in the apiserver's
    /// order: what the request does is authorized (403) before its options are read (400,
    /// 406, 422), as the apiserver's handlers read them only once its filters let it in.
    fn read(&self, req: &Request, target: Target, who: Who, call: Asked) -> Result<Reply, Halt> {
        let Who { user, holder } = who;
        let Asked {
            query,
            what,
            wake,
            lane,
        } = call;
        let kind = target.kind;
        // A hub that cannot serve says so to whoever it knows, before it asks the
        // apiserver about them (its reviews fail with its polls when it lost its access).
        let cohort = self.cohort(&user);
        let (view, held) = self.ready_held(cohort)?;
        self.authorize(&user, &what, lane)?;
        // Any other method is authorized for its verb first, as the apiserver's filters
        // do (`request::attributes`: a HEAD is a `get`, `list` or `watch`, a POST a
        // `create`…), then refused: the hub serves GETs (the apiserver answers a HEAD it
        // authorized with 405 too; a write it would make).
        if req.method != "GET" {
            let verb = match &what {
                Attributes::Resource { verb, .. } | Attributes::Path { verb, .. } => verb,
            };
            // A method with no verb (OPTIONS…) is named by itself.
            let verb = match verb.is_empty() {
                true => req.method.to_ascii_lowercase(),
                false => verb.to_string(),
            };
            return Err(StatusError::method_not_supported(kind, &verb).into());
        }
        let header = |name: &str| req.header(name).map(str::to_string);
        let ask = request::ask(target, query, &header)?;
        if !held.serves(kind) {
            return Err(StatusError::no_such_path().into());
        }
        if ask.watch {
            let watch = {
                let mut rng = self.rng.lock().recover();
                Watch::start_for(self.timeline.clone(), &ask, cohort, &mut rng)
            };
            if watch.behind() {
                self.behind.store(true, Ordering::SeqCst);
            }
            self.served.watched(if ask.wait.is_some() {
                "follower"
            } else {
                "stream"
            });
            return Ok(Reply::Stream {
                head: Answer::json(200, Vec::new()),
                stream: match ask.wait {
                    Some(wait) => self.fleet.watching(watch, &user, wait),
                    None => Box::new(watch),
                },
                holder,
            });
        }
        let ns = ask.target.namespace.as_deref();
        let v = held.versions(kind, ns).ok_or_else(|| {
            StatusError::unavailable(
                format!("cmpoll serve has not listed {} yet", kind.plural()),
                1,
            )
        })?;
        // `Exact`: the state at R, which the hub holds when nothing changed in the scope
        // between R and its last list (R at least its `changed`); older is the
        // apiserver's 410 for a compacted version, newer waits as a list newer than the
        // hub does.
        let exact = (ask.exact)
            .then(|| ask.resource_version.as_deref()?.parse::<u64>().ok())
            .flatten();
        if exact.is_some_and(|r| r < v.changed) {
            return Err(StatusError::too_old_for_exact().into());
        }
        if let Some(r) = ask.not_older_than().or(exact)
            && v.listed < r
        {
            if wake == Wake::Expired {
                return Err(StatusError::too_large_resource_version(r, v.listed).into());
            }
            self.behind.store(true, Ordering::SeqCst);
            return Ok(Reply::Wait {
                until: Instant::now() + BEHIND_WAIT,
                holder,
            });
        }
        if let Some(name) = &ask.target.name {
            let ns = ns.unwrap_or_default();
            return match held.get(kind, ns, name).filter(|o| selected(&ask, o)) {
                // A large object is gzipped for its client: made where it may wait.
                Some(o) if !lane.may_wait() && ask.gzip && o.raw.json.len() >= GZIP_FROM => {
                    Err(Halt::Lane(HubLane::Render))
                }
                Some(o) => Ok(Reply::Answer(
                    self.body(&ask, render::object(kind, ask.form, o)),
                )),
                None => Err(StatusError::not_found(kind, name).into()),
            };
        }
        if let (Some(wait), Some(r)) = (ask.wait, ask.not_older_than())
            && ask.continue_token.is_none()
        {
            if v.changed <= r {
                if wake == Wake::Expired {
                    self.served.waited("not_modified");
                    // Nothing changed up to the hub's version: the follower has it.
                    self.fleet.listed(&user, &ask, v.listed, Instant::now());
                    return Ok(Reply::Answer(Answer {
                        status: 304,
                        content_type: "application/json",
                        headers: Vec::new(),
                        body: Default::default(),
                    }));
                }
                return Ok(Reply::Wait {
                    until: Instant::now() + wait,
                    holder,
                });
            }
            if wake != Wake::First {
                self.served.waited("newer");
            }
        }
        let at = exact.unwrap_or(v.listed);
        let answer = self.list((view, &held), &ask, v, at, lane)?;
        self.fleet.listed(&user, &ask, at, Instant::now());
        Ok(Reply::Answer(answer))
    }

    /// Authorizes exactly what the request does (`what`, as the apiserver's authorizer is
    /// asked), for its verb alone: a `list` decision never admits a `get` or a `watch`. A
    /// request about one name is first asked for every name of its scope (`get`, `list` or
    /// `watch` of the whole namespace, which a fleet's roles grant and which is kept for
    /// each name); refused, the name itself is asked, and a 403 names it, as the
    /// apiserver's does.
    fn authorize(&self, user: &Arc<User>, what: &Attributes, lane: HubLane) -> Result<(), Halt> {
        if let Attributes::Resource {
            verb,
            kind,
            namespace,
            name: Some(_),
        } = what
        {
            let every = Attributes::Resource {
                verb,
                kind: *kind,
                namespace: namespace.clone(),
                name: None,
            };
            match self.auth.authorize(user, &every, lane) {
                Ok(()) => return Ok(()),
                Err(Halt::Lane(lane)) => return Err(Halt::Lane(lane)),
                // Refused for the whole scope: the object itself is asked.
                Err(Halt::Refused(_)) => {}
            }
        }
        self.auth.authorize(user, what, lane)
    }
}

/// Whether `o` is what `ask`'s selectors select.
fn selected(ask: &Ask, o: &HeldObject) -> bool {
    ask.labels.matches(|k| o.label(k)) && ask.fields.matches(&o.namespace, &o.name)
}

impl Handler for Hub {
    fn handle(&self, req: &Request, peer: &Peer, call: Call) -> Reply {
        let reply = match self.reply(req, peer, call) {
            Ok(r) => r,
            Err(Halt::Lane(lane)) => return Reply::Lane(lane.index()),
            Err(Halt::Refused(refusal)) => {
                if refusal.code >= 500 {
                    log::debug!("{} {}: {}", req.method, req.path, refusal.message);
                }
                Reply::Answer(refusal.answer())
            }
        };
        let stamp = |a: Answer| {
            a.with(HUB_HEADER, env!("CARGO_PKG_VERSION"))
                .with("Cache-Control", "no-cache, private")
        };
        match reply {
            Reply::Answer(a) => {
                self.served.answered(a.status);
                let answer = stamp(a);
                // An answer to an authenticated request (the probes aside) is written for
                // its token: what it pins counts toward that identity's share.
                let read = !matches!(request::route(&req.path), Route::Ops(_));
                match Holder::bearer(req.header("authorization")) {
                    Some(holder) if answer.status < 400 && read => Reply::Held { answer, holder },
                    _ => Reply::Answer(answer),
                }
            }
            Reply::Stream {
                head,
                stream,
                holder,
            } => {
                self.served.answered(head.status);
                Reply::Stream {
                    head: stamp(head),
                    stream,
                    holder,
                }
            }
            other => other,
        }
    }
}

mod lists;
mod ops;
mod remotecfg;
mod status_page;
#[cfg(test)]
mod tests;
