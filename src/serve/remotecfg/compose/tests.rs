#![allow(clippy::unwrap_used)]

use std::convert::Infallible;
use std::time::{Duration, Instant};

use super::*;
use crate::serve::remotecfg::wrapped::{COLLECTORS, IDLE};
use crate::serve::testing::{item, kinds, poll};
use crate::source::{Content, Item, ModuleFile};

/// ConfigMap `ns/name` at `rv` with `data`, annotated `cmpoll.io/collectors: only_for`.
fn module(ns: &str, name: &str, rv: u64, data: &[(&str, &str)], only_for: Option<&str>) -> Item {
    let mut i = item(ns, name, rv, &[]);
    let mut meta =
        serde_json::json!({"name": name, "namespace": ns, "resourceVersion": rv.to_string()});
    if let Some(s) = only_for {
        meta["annotations"] = serde_json::json!({ COLLECTORS: s });
    }
    let data: serde_json::Map<String, serde_json::Value> = (data.iter())
        .map(|(k, v)| (k.to_string(), serde_json::Value::from(*v)))
        .collect();
    let metadata = meta.to_string();
    let json = format!(
        "{{\"metadata\":{metadata},\"data\":{}}}",
        serde_json::Value::Object(data.clone())
    );
    let m = "{\"metadata\":".len();
    i.raw = Some(crate::source::RawObject {
        json: json.as_bytes().into(),
        metadata: m..m + metadata.len(),
    });
    i.files = (data.iter())
        .map(|(k, v)| ModuleFile {
            key: k.clone(),
            content: Content::Text(v.as_str().unwrap().to_string()),
        })
        .collect();
    i
}

fn root(args: Option<&str>) -> Root {
    let text = "prometheus.remote_write \"default\" { }\n".to_string();
    Root::parse(text, args.map(|a| (a, "args"))).unwrap()
}

fn held(items: Vec<Item>) -> Held {
    poll(&Held::empty(kinds()), 1, &[(None, 10)], items)
}

fn all(_: &str) -> Result<bool, Infallible> {
    Ok(true)
}

fn attrs(pairs: &[(&str, &str)]) -> Attributes {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

const SCRAPE: &str = "argument \"receiver\" { }\nprometheus.scrape \"x\" { targets = [] forward_to = [argument.receiver.value] }\n";

#[test]
fn the_root_then_each_module_in_its_declare_block() {
    let r = root(Some(
        "receiver = prometheus.remote_write.default.receiver\nother = 1\n",
    ));
    let view = held(vec![
        module(
            "team-b",
            "web",
            3,
            &[("m.alloy", SCRAPE), ("notes.txt", "not alloy")],
            None,
        ),
        module("team-a", "db", 4, &[("m.alloy", "// nothing\n")], None),
        module("team-a", "txt", 5, &[("notes.txt", "no alloy key")], None),
    ]);
    let c = Compositions::default();
    let got = c
        .compose(&r, &view, ("who", &Attributes::new()), Instant::now(), all)
        .unwrap()
        .unwrap();
    assert!(got.content.starts_with(HEAD), "{}", got.content);
    assert!(
        got.content
            .contains("prometheus.remote_write \"default\" { }\n")
    );
    let a = got.content.find("declare \"team_a_S_db\" {").unwrap();
    let b = got.content.find("declare \"team_b_S_web\" {").unwrap();
    assert!(a < b, "in key order: {}", got.content);
    assert!(
        got.content.contains(
            "team_b_S_web \"module\" {\n  receiver = prometheus.remote_write.default.receiver\n}"
        ),
        "{}",
        got.content
    );
    assert!(
        !got.content.contains("other = 1"),
        "an offer it does not declare is not passed"
    );
    assert!(!got.content.contains("not alloy"), "only *.alloy keys");
    let keys: Vec<&str> = got.modules.iter().map(|v| &*v.key).collect();
    assert_eq!(keys, ["team-a/db", "team-b/web"]);
    // Each module's lines, as Alloy numbers them: its first comment to its instance's end.
    let lines: Vec<&str> = got.content.lines().collect();
    for (Version { key, .. }, (first, last)) in got.modules.iter().zip(got.spans.iter()) {
        assert!(
            lines[first - 1].starts_with(&format!("// {key}: ")),
            "{key}: {}",
            lines[first - 1]
        );
        assert_eq!(lines[last - 1], "}", "{key}");
        let instance = format!("{} \"module\" {{", crate::template::ident(key));
        assert!(
            lines[first - 1..*last].contains(&instance.as_str()),
            "{key}"
        );
    }
    assert_eq!(got.spans.len(), 2);
    assert!(got.spans[0].1 < got.spans[1].0);
    assert_eq!(got.hash.len(), 64);
    assert_eq!(
        got.hash,
        Sha256::digest(got.content.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    );
    // Nothing at all: still a text.
    let empty = held(vec![]);
    let none = c
        .compose(&r, &empty, ("who", &Attributes::new()), Instant::now(), all)
        .unwrap()
        .unwrap();
    assert!(none.content.starts_with("//") && none.modules.is_empty());
}

/// A module the isolation checks refuse goes to no one; the others still go.
#[test]
fn a_module_that_leaves_its_block_goes_to_no_one() {
    let r = root(None);
    let view = held(vec![
        module(
            "a",
            "escape",
            1,
            &[("m.alloy", "}\nprometheus.remote_write \"x\" {\n")],
            None,
        ),
        module("a", "names", 2, &[("m.alloy", "b_S_web \"m\" { }\n")], None),
        module("b", "web", 3, &[("m.alloy", "// fine\n")], None),
        module("b", "sel", 4, &[("m.alloy", "// fine\n")], Some("a in (")),
    ]);
    let got = Compositions::default()
        .compose(&r, &view, ("who", &Attributes::new()), Instant::now(), all)
        .unwrap()
        .unwrap();
    let keys: Vec<&str> = got.modules.iter().map(|v| &*v.key).collect();
    assert_eq!(keys, ["b/web"], "{}", got.content);
    assert!(!got.content.contains("remote_write \"x\""));
}

/// `cmpoll.io/collectors` narrows a module to the collectors its selector matches;
/// `may_list` to the namespaces a collector may list.
#[test]
fn selectors_and_namespaces_choose_the_modules() {
    let r = root(None);
    let view = held(vec![
        module(
            "a",
            "linux",
            1,
            &[("m.alloy", "// l\n")],
            Some("collector.os=linux,team in (a)"),
        ),
        module("a", "all", 2, &[("m.alloy", "// all\n")], None),
        module("b", "all", 3, &[("m.alloy", "// b\n")], None),
    ]);
    let c = Compositions::default();
    let keys = |attributes: &Attributes, ns_ok: &dyn Fn(&str) -> bool| -> Vec<String> {
        let may = |ns: &str| Ok::<_, Infallible>(ns_ok(ns));
        let got = c
            .compose(&r, &view, ("who", attributes), Instant::now(), may)
            .unwrap()
            .unwrap();
        got.modules.iter().map(|v| v.key.to_string()).collect()
    };
    let linux_a = attrs(&[("collector.os", "linux"), ("team", "a")]);
    assert_eq!(keys(&linux_a, &|_| true), ["a/all", "a/linux", "b/all"]);
    assert_eq!(
        keys(&attrs(&[("collector.os", "linux")]), &|_| true),
        ["a/all", "b/all"]
    );
    assert_eq!(keys(&linux_a, &|ns| ns == "b"), ["b/all"]);
    assert_eq!(keys(&linux_a, &|_| false), Vec::<String>::new());
    // The namespace's answer is asked once per namespace, and its error ends it.
    let mut asked = Vec::new();
    let e = c.compose(&r, &view, ("who", &linux_a), Instant::now(), |ns: &str| {
        asked.push(ns.to_string());
        if ns == "b" {
            Err("review failed")
        } else {
            Ok(true)
        }
    });
    assert_eq!(e.unwrap_err(), "review failed");
    assert_eq!(asked, ["a", "b"]);
}

/// One composition per distinct set of modules: asked again, the same one is handed out;
/// a new version or a new root makes another.
#[test]
fn compositions_are_made_once() {
    let r = root(None);
    let c = Compositions::default();
    let v1 = held(vec![module("a", "m", 1, &[("m.alloy", "// one\n")], None)]);
    let first = c
        .compose(&r, &v1, ("who", &Attributes::new()), Instant::now(), all)
        .unwrap()
        .unwrap();
    let again = c
        .compose(&r, &v1, ("who", &attrs(&[("x", "y")])), Instant::now(), all)
        .unwrap()
        .unwrap();
    assert!(Arc::ptr_eq(&first, &again));
    let v2 = held(vec![module("a", "m", 2, &[("m.alloy", "// two\n")], None)]);
    let second = c
        .compose(&r, &v2, ("who", &Attributes::new()), Instant::now(), all)
        .unwrap()
        .unwrap();
    assert_ne!(first.hash, second.hash);
    let other_root = Root::parse("// another root\n".into(), None).unwrap();
    let third = c
        .compose(
            &other_root,
            &v2,
            ("who", &Attributes::new()),
            Instant::now(),
            all,
        )
        .unwrap()
        .unwrap();
    assert!(third.content.contains("// another root"));
    assert_ne!(third.hash, second.hash);
}

#[test]
fn content_over_the_bound_is_refused() {
    let big = format!("// {}\n", "x".repeat(MAX_CONTENT));
    let r = Root::parse(big, None).unwrap();
    let e = Compositions::default()
        .compose(
            &r,
            &held(vec![]),
            ("who", &Attributes::new()),
            Instant::now(),
            all,
        )
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(&e, Unmade::TooLarge(e) if e.contains("more than 4194304")),
        "{e:?}"
    );
}

/// Review 61 (second), finding 5: a set of modules over `MAX_CONTENT` is refused once and
/// the refusal kept by digest: asked again (more often than an identity may have texts
/// made), it is refused from what was kept, costing no budget and no text.
#[test]
fn a_refusal_is_kept_by_digest() {
    let half = format!("// {}\n", "x".repeat(MAX_CONTENT / 2));
    let view = held(vec![
        module("a", "one", 1, &[("m.alloy", &half)], None),
        module("a", "two", 2, &[("m.alloy", &half)], None),
    ]);
    let (r, c, t) = (root(None), Compositions::default(), Instant::now());
    for i in 0..40 {
        let e = (c.compose(&r, &view, ("who", &Attributes::new()), t, all))
            .unwrap()
            .unwrap_err();
        assert!(matches!(&e, Unmade::TooLarge(_)), "{i}: {e:?}");
    }
    // Its budget was spent once: a new text is still made for it.
    let small = held(vec![module("a", "one", 1, &[("m.alloy", "// m\n")], None)]);
    assert!(
        c.compose(&r, &small, ("who", &Attributes::new()), t, all)
            .unwrap()
            .is_ok()
    );
}

/// An identity that asks for more new texts than its budget (cycling its attributes
/// through sets of modules) is told to come back; another identity, and texts already
/// made, are not held up.
#[test]
fn new_texts_are_budgeted_per_identity() {
    let r = root(None);
    let items: Vec<Item> = (0..40)
        .map(|i| {
            module(
                "a",
                &format!("m{i}"),
                i + 1,
                &[("m.alloy", "// m\n")],
                Some(&format!("n={i}")),
            )
        })
        .collect();
    let view = held(items);
    let c = Compositions::default();
    let t = Instant::now();
    let ask = |who: &str, n: usize, at: Instant| {
        let a = attrs(&[("n", &n.to_string())]);
        c.compose(&r, &view, (who, &a), at, all).unwrap()
    };
    for n in 0..16 {
        assert!(ask("greedy", n, t).is_ok(), "{n}");
    }
    let Err(Unmade::Busy(wait)) = ask("greedy", 16, t) else {
        panic!("not budgeted")
    };
    assert!(
        wait > Duration::ZERO && wait <= Duration::from_secs(5),
        "{wait:?}"
    );
    assert!(ask("greedy", 3, t).is_ok(), "made already");
    assert!(ask("other", 17, t).is_ok(), "another identity");
    assert!(
        ask("greedy", 16, t + Duration::from_secs(5)).is_ok(),
        "later"
    );
}

/// An edit of only the `cmpoll.io/collectors` annotation (the module's hash unchanged, a
/// new resourceVersion) changes who gets the module.
#[test]
fn an_annotation_edit_alone_takes_effect() {
    let r = root(None);
    let c = Compositions::default();
    let b = attrs(&[("team", "b")]);
    let modules = |view: &Held| -> usize {
        let got = c.compose(&r, view, ("who", &b), Instant::now(), all);
        got.unwrap().unwrap().modules.len()
    };
    let data = [("m.alloy", "// nothing\n")];
    let before = held(vec![module("ns", "m", 3, &data, Some("team=a"))]);
    assert_eq!(modules(&before), 0);
    let after = held(vec![module("ns", "m", 4, &data, Some("team=b"))]);
    let (o1, o2) = (
        before.keyed(Resource::ConfigMaps).next().unwrap().1,
        after.keyed(Resource::ConfigMaps).next().unwrap().1,
    );
    assert_eq!(
        o1.hash, o2.hash,
        "the annotation is not in the module's hash"
    );
    assert_eq!(modules(&after), 1);
}

/// The wrappings kept are bounded in bytes: a team cycling new large ConfigMaps (new
/// names, new versions) leaves the hub holding the bound at most.
#[test]
fn the_wrappings_kept_are_bounded_in_bytes() {
    let bound = 256 << 10;
    let c = Compositions {
        modules: Modules::bounded(bound),
        ..Compositions::default()
    };
    let r = root(None);
    let big = format!("// {}\n", "x".repeat(16 << 10));
    for round in 0..4u64 {
        let items = (0..40)
            .map(|i| {
                module(
                    "team",
                    &format!("m{round}-{i}"),
                    10 * round + 1,
                    &[("m.alloy", &big)],
                    None,
                )
            })
            .collect();
        let view = held(items);
        let got = c.compose(&r, &view, ("who", &Attributes::new()), Instant::now(), all);
        assert_eq!(got.unwrap().map(|g| g.modules.len()).unwrap_or(40), 40);
        assert!(
            c.modules.bytes() <= bound,
            "{} > {bound}",
            c.modules.bytes()
        );
    }
}

/// A module gone from the views goes from what is kept once unused for `IDLE`.
#[test]
fn a_module_gone_from_the_view_is_dropped() {
    let c = Compositions::default();
    let r = root(None);
    let t = Instant::now();
    let view = held(vec![
        module("a", "gone", 1, &[("m.alloy", "// g\n")], None),
        module("a", "kept", 2, &[("m.alloy", "// k\n")], None),
    ]);
    c.compose(&r, &view, ("who", &Attributes::new()), t, all)
        .unwrap()
        .unwrap();
    assert!(c.modules.holds("a/gone"));
    let later = held(vec![module("a", "kept", 2, &[("m.alloy", "// k\n")], None)]);
    let after = t + IDLE + Duration::from_secs(1);
    c.compose(&r, &later, ("who", &Attributes::new()), after, all)
        .unwrap()
        .unwrap();
    assert!(
        !c.modules.holds("a/gone"),
        "gone from the view, unused: dropped"
    );
    assert!(c.modules.holds("a/kept"));
}

/// A module of a namespace the collector may not list is never wrapped for it.
#[test]
fn namespaces_are_checked_before_wrapping() {
    let c = Compositions::default();
    let r = root(None);
    let view = held(vec![
        module("other", "m", 1, &[("m.alloy", "// o\n")], None),
        module("mine", "m", 2, &[("m.alloy", "// m\n")], None),
    ]);
    let mine = |ns: &str| Ok::<_, Infallible>(ns == "mine");
    let got = c.compose(&r, &view, ("who", &Attributes::new()), Instant::now(), mine);
    assert_eq!(got.unwrap().unwrap().modules.len(), 1);
    assert!(c.modules.holds("mine/m"));
    assert!(!c.modules.holds("other/m"), "not listed: not wrapped");
}

/// The compositions kept are bounded in bytes and in number; over a bound the one asked for
/// longest ago goes, never those asked for since (no clearing of them all).
#[test]
fn compositions_kept_are_bounded_and_the_used_stay() {
    let bound = 64 << 10;
    let c = Compositions {
        made: Mutex::new(Made::bounded(bound)),
        ..Compositions::default()
    };
    let r = root(None);
    let t = Instant::now();
    let ask = |view: &Held, who: &str| {
        let got = c.compose(&r, view, (who, &Attributes::new()), t, all);
        got.unwrap().unwrap()
    };
    let used = held(vec![module("a", "used", 1, &[("m.alloy", "// u\n")], None)]);
    let first = ask(&used, "fleet");
    let text = format!("// {}\n", "x".repeat(4 << 10));
    for i in 0..KEPT_COMPOSITIONS + 20 {
        let other = held(vec![module(
            "a",
            "cycled",
            i as u64 + 2,
            &[("m.alloy", &format!("{text}// {i}\n"))],
            None,
        )]);
        ask(&other, &format!("cycler-{i}"));
        assert!(
            Arc::ptr_eq(&ask(&used, "fleet"), &first),
            "kept while asked for: {i}"
        );
        let made = c.made.lock().unwrap();
        assert!(
            made.bytes <= bound && made.kept.len() <= KEPT_COMPOSITIONS,
            "{}",
            made.bytes
        );
    }
}
