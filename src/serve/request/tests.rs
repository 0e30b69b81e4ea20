//! Requests read as the apiserver reads them: routes, the verb and name an authorizer is
//! asked about, and list and watch options.

use super::*;

fn target(kind: Resource, ns: Option<&str>, name: Option<&str>) -> Route {
    Route::Read(Target {
        kind,
        namespace: ns.map(str::to_string),
        name: name.map(str::to_string),
        watch_path: false,
    })
}

#[test]
fn routes() {
    use Resource::*;
    assert_eq!(route("/api/v1/configmaps"), target(ConfigMaps, None, None));
    assert_eq!(
        route("/api/v1/namespaces/team-a/secrets"),
        target(Secrets, Some("team-a"), None)
    );
    assert_eq!(
        route("/api/v1/namespaces/team-a/configmaps/m1"),
        target(ConfigMaps, Some("team-a"), Some("m1"))
    );
    assert!(matches!(
        route("/api/v1/watch/configmaps"),
        Route::Read(Target {
            watch_path: true,
            ..
        })
    ));
    for unknown in [
        "/api/v1/pods",
        "/api/v1/namespaces/a/pods",
        "/api/v1/namespaces/a/configmaps/b/status",
        "/apis/apps/v1/deployments",
        "/",
        "/api/v2/configmaps",
    ] {
        assert_eq!(route(unknown), Route::Unknown, "{unknown}");
    }
    assert_eq!(route("/api"), Route::Discovery(Discovery::Api));
    assert_eq!(route("/api/v1/"), Route::Discovery(Discovery::ApiV1));
    assert_eq!(route("/readyz"), Route::Ops("/readyz"));
}

fn ask_of(query: &str, headers: &[(&str, &str)]) -> Result<Ask, StatusError> {
    let Route::Read(t) = route("/api/v1/configmaps") else {
        panic!()
    };
    let headers: Vec<(String, String)> = (headers.iter())
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    ask(t, &Query::parse(query), &|name| {
        (headers.iter())
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
    })
}

#[test]
fn queries_as_the_apiserver_reads_them() {
    let a = ask_of(
        "labelSelector=cmpoll.io%2Fmodule%3Dtrue&limit=2&resourceVersion=12&resourceVersionMatch=NotOlderThan&timeoutSeconds=3",
        &[("Accept-Encoding", "gzip, deflate")],
    )
    .unwrap();
    assert_eq!(a.labels.as_str(), "cmpoll.io/module=true");
    assert_eq!(a.limit, Some(2));
    assert_eq!(a.not_older_than(), Some(12));
    assert!(a.gzip);
    assert_eq!(a.form, Form::Full);
    assert!(ask_of("watch=true", &[]).unwrap().watch);
    assert!(!ask_of("watch=false", &[]).unwrap().watch);
    assert_eq!(
        ask_of("resourceVersion=0", &[]).unwrap().not_older_than(),
        None
    );
    assert_eq!(ask_of("limit=0", &[]).unwrap().limit, None);
    // The apiserver's own words (labels.Parse, the field label check).
    let e = ask_of("labelSelector=a%20b", &[]).unwrap_err();
    assert_eq!(
        e.message,
        "unable to parse requirement: found 'b', expected: in, notin, =, ==, !=, gt, lt"
    );
    assert_eq!(e.code, 400);
    let e = ask_of("fieldSelector=foo%3Dbar", &[]).unwrap_err();
    assert_eq!(
        e.message,
        "\"foo\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
    );
    assert!(ask_of("resourceVersionMatch=Exact", &[]).is_err());
    assert!(ask_of("resourceVersion=x", &[]).is_err());
    let w = ask_of("", &[("X-Cmpoll-Wait", "9999")]).unwrap();
    assert_eq!(w.wait, Some(MAX_WAIT));
}

fn what(method: &str, path: &str, query: &str) -> (&'static str, Option<String>) {
    let route = route(path);
    match attributes(method, path, &Query::parse(query), &route) {
        Attributes::Resource { verb, name, .. } => (verb, name),
        other => panic!("{other:?}"),
    }
}

fn ask_at(path: &str, query: &str) -> Result<Ask, StatusError> {
    let Route::Read(t) = route(path) else {
        panic!("{path}")
    };
    ask(t, &Query::parse(query), &|_| None)
}

#[test]
fn what_a_request_does_as_the_request_info_resolver_says() {
    let one = "/api/v1/namespaces/t/configmaps/a";
    let all = "/api/v1/namespaces/t/configmaps";
    let a = Some("a".to_string());
    // The legacy watch path: a watch, of the name it carries.
    assert_eq!(
        what("GET", "/api/v1/watch/namespaces/t/configmaps/a", ""),
        ("watch", a.clone())
    );
    assert_eq!(
        what("GET", "/api/v1/watch/namespaces/t/configmaps", ""),
        ("watch", None)
    );
    // ... whose field selector never names the request (only a GET's does).
    assert_eq!(
        what(
            "GET",
            "/api/v1/watch/namespaces/t/configmaps",
            "fieldSelector=metadata.name%3Da"
        ),
        ("watch", None)
    );
    // A GET that names an object is a get, whatever `watch` says.
    for q in ["", "watch=true", "watch=1", "labelSelector=x"] {
        assert_eq!(what("GET", one, q), ("get", a.clone()), "{q}");
    }
    // A collection: watch by apimachinery's booleans, a name from the field selector.
    assert_eq!(what("GET", all, "watch=yes"), ("watch", None));
    assert_eq!(what("GET", all, "watch=false"), ("list", None));
    assert_eq!(what("GET", all, "watch=0&watch=1"), ("list", None));
    assert_eq!(
        what("GET", all, "fieldSelector=metadata.name%3Da"),
        ("list", a.clone())
    );
    assert_eq!(
        what(
            "GET",
            all,
            "watch=1&fieldSelector=metadata.name%3D%3Da,metadata.namespace%3Dt"
        ),
        ("watch", a.clone())
    );
    // An option that does not decode: no name (and the verb from `watch` still).
    for bad in ["limit=x", "timeoutSeconds=1.5", "labelSelector=a%20b"] {
        assert_eq!(
            what(
                "GET",
                all,
                &format!("watch=1&fieldSelector=metadata.name%3Da&{bad}")
            ),
            ("watch", None),
            "{bad}"
        );
    }
    // A name that is no path segment is no request's name.
    assert_eq!(what("GET", all, "fieldSelector=metadata.name%3D..").1, None);
    // An unknown field is the handler's 400, not a decode error: the name stands.
    assert_eq!(
        what("GET", all, "fieldSelector=metadata.name%3Da,spec.x%3Dy"),
        ("list", a.clone())
    );
    assert_eq!(what("DELETE", all, ""), ("deletecollection", None));
    assert_eq!(
        what("POST", "/api/v1/watch/namespaces/t/configmaps", "").0,
        "watch"
    );
}

#[test]
fn a_request_about_one_name_is_answered_for_that_name_alone() {
    // The legacy named watch: the name joins the field selector.
    let w = ask_at("/api/v1/watch/namespaces/t/configmaps/a", "").unwrap();
    assert!(w.watch);
    assert!(w.fields.matches("t", "a") && !w.fields.matches("t", "b"));
    let w = ask_at(
        "/api/v1/watch/namespaces/t/configmaps/a",
        "fieldSelector=metadata.name%3Da",
    )
    .unwrap();
    assert!(!w.fields.matches("t", "b"));
    for other in [
        "metadata.name%3Db",
        "metadata.namespace%3Dt",
        "metadata.name!%3Da",
    ] {
        let e = ask_at(
            "/api/v1/watch/namespaces/t/configmaps/a",
            &format!("fieldSelector={other}"),
        )
        .unwrap_err();
        assert_eq!(
            (e.code, e.message.as_str()),
            (
                400,
                "fieldSelector metadata.name doesn't match requested name"
            ),
            "{other}"
        );
    }
    // `…/NAME?watch=true` is a GET: no stream, and selectors are not read.
    let g = ask_at(
        "/api/v1/namespaces/t/configmaps/a",
        "watch=true&labelSelector=a%20b&fieldSelector=metadata.name%3Db&limit=x",
    )
    .unwrap();
    assert!(!g.watch);
    assert!(g.fields.matches("t", "a") && g.labels.as_str().is_empty());
    let e = ask_at("/api/v1/namespaces/t/configmaps/a", "export=1").unwrap_err();
    assert_eq!(e.code, 400);
    // A watch from no version or 0 is a streaming list (SetListOptionsDefaults); one
    // that says `sendInitialEvents=false` is not.
    let all = "/api/v1/namespaces/t/configmaps";
    assert_eq!(
        ask_at(all, "watch=1").unwrap().watching.send_initial_events,
        Some(true)
    );
    assert_eq!(
        ask_at(all, "watch=1&resourceVersion=0")
            .unwrap()
            .watching
            .send_initial_events,
        Some(true)
    );
    assert_eq!(
        ask_at(all, "watch=1&resourceVersion=5")
            .unwrap()
            .watching
            .send_initial_events,
        None
    );
    assert_eq!(
        ask_at(
            all,
            "watch=1&sendInitialEvents=false&resourceVersionMatch=NotOlderThan"
        )
        .unwrap()
        .watching
        .send_initial_events,
        Some(false)
    );
    // The first of a repeated option is the one read.
    assert!(!ask_at(all, "watch=false&watch=true").unwrap().watch);
    // The legacy path watches with a list's options: no defaults, a list's checks.
    let legacy = "/api/v1/watch/namespaces/t/configmaps";
    let w = ask_at(legacy, "allowWatchBookmarks=true").unwrap();
    assert!(w.watch && w.watching.send_initial_events.is_none());
    let e = ask_at(
        legacy,
        "sendInitialEvents=true&resourceVersionMatch=NotOlderThan&resourceVersion=1",
    )
    .unwrap_err();
    assert_eq!(e.code, 422);
    assert!(
        e.message
            .contains("sendInitialEvents is forbidden for list"),
        "{}",
        e.message
    );
    // ... unless it says `watch=true` too.
    assert!(
        ask_at(
            legacy,
            "watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan"
        )
        .is_ok()
    );
}

#[test]
fn accept_is_negotiated_in_the_clients_order() {
    let form_of = |accept: &str| ask_of("", &[("Accept", accept)]).map(|a| a.form);
    // cmpoll's own metadata request: protobuf first (not served), then JSON.
    assert_eq!(
        form_of(
            "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
        )
        .unwrap(),
        Form::Metadata
    );
    // kubectl get: tables first (not served), then JSON.
    assert_eq!(
        form_of(
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
        )
        .unwrap(),
        Form::Full
    );
    assert_eq!(form_of("*/*").unwrap(), Form::Full);
    let e = form_of("application/vnd.kubernetes.protobuf").unwrap_err();
    assert_eq!(e.code, 406);
}
