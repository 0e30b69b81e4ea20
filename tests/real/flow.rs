//! API Priority and Fairness on the real apiserver: 429s with its own Retry-After.

use std::time::Duration;

use serde_json::Value;
use test_apiserver::real::{RealApiserver, User};

use super::*;
use crate::util::{Daemon, KillOnDrop, SOON, eventually, kinds, skip_unless};

/// A loop run on a thread until dropped (then stopped and joined), also when the test
/// fails: it must not load the cluster the next test uses.
struct Hammer {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Hammer {
    fn start(mut round: impl FnMut() + Send + 'static) -> Hammer {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                round();
            }
        });
        Hammer {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Hammer {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Flow control as the real apiserver does it: a PriorityLevelConfiguration with no
/// seats of its own (`Reject`) and a FlowSchema that puts cmpoll's service account there.
/// While one slow request holds the one request such a level still admits, every other
/// request of that account is rejected with 429 and APF's own Retry-After, which grows
/// while the rejections go on. cmpoll's next attempt waits at least that long — longer
/// than its own backoff (1 s) would — and it recovers when the level has room again.
#[test]
fn flow_control_429s_retry_after_is_a_floor_for_the_next_poll() {
    use std::time::{Instant, SystemTime};
    if skip_unless(
        std::process::Command::new("curl")
            .arg("--version")
            .output()
            .is_ok(),
        "curl",
    ) {
        return;
    }
    let Some((_one, k)) = cluster() else {
        return;
    };
    let mark = k.audit_mark();
    let (ns, token) = namespace_with_a_module(k, "apf", "jailed");
    // 20 MB of ConfigMaps that are not modules: an answer a slow reader makes the
    // apiserver sit on (more than the sockets' buffers hold).
    let big = "x".repeat(900_000);
    for i in 0..24 {
        k.put_configmap(&ns, &format!("big{i}"), &[], &[("k", &big)]);
    }
    k.apply(&format!(
        r#"{{"apiVersion":"v1","kind":"List","items":[
{{"apiVersion":"flowcontrol.apiserver.k8s.io/v1","kind":"PriorityLevelConfiguration","metadata":{{"name":"{ns}"}},
 "spec":{{"type":"Limited","limited":{{"nominalConcurrencyShares":0,"lendablePercent":0,"borrowingLimitPercent":0,"limitResponse":{{"type":"Reject"}}}}}}}},
{{"apiVersion":"flowcontrol.apiserver.k8s.io/v1","kind":"FlowSchema","metadata":{{"name":"{ns}"}},
 "spec":{{"priorityLevelConfiguration":{{"name":"{ns}"}},"matchingPrecedence":500,
  "rules":[{{"subjects":[{{"kind":"ServiceAccount","serviceAccount":{{"name":"jailed","namespace":"{ns}"}}}}],
   "resourceRules":[{{"verbs":["*"],"apiGroups":["*"],"resources":["*"],"namespaces":["*"],"clusterScope":true}}]}}]}}}}]}}"#
    ));
    let level = k.ok(&[
        "get",
        "prioritylevelconfiguration",
        &ns,
        "-o",
        "jsonpath={.metadata.uid}",
    ]);
    let curl = |extra: &[&str], url: &str| {
        let mut cmd = std::process::Command::new("curl");
        cmd.args(["-s", "--cacert"])
            .arg(k.ca_file())
            .args(["-H", &format!("Authorization: Bearer {token}")])
            .args(extra)
            .arg(format!("{}{url}", k.url));
        cmd
    };
    let list = format!("/api/v1/namespaces/{ns}/configmaps");
    eventually("the FlowSchema in effect", SOON, || {
        let out = curl(&["-o", "/dev/null", "-D", "-"], &list)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .to_lowercase()
            .contains(&format!("x-kubernetes-pf-prioritylevel-uid: {level}"))
    });
    // The slow reader holds the level's one request; everyone else of the account is
    // rejected. A hammer of rejected requests drives APF's Retry-After up.
    let _slow = KillOnDrop(
        curl(
            &["--http1.1", "--limit-rate", "2k", "-o", "/dev/null"],
            &list,
        )
        .spawn()
        .unwrap(),
    );
    let hammered: std::sync::Arc<Mutex<Vec<(SystemTime, u64)>>> = Default::default();
    let hammer = {
        let seen = hammered.clone();
        let mut args: Vec<String> = [
            "-Z",
            "--parallel-max",
            "16",
            "-w",
            "%header{retry-after}\\n",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        for _ in 0..32 {
            args.extend([
                "-o".into(),
                "/dev/null".into(),
                format!("{}{list}?limit=1", k.url),
            ]);
        }
        let base = curl(&[], "");
        let program = base.get_program().to_owned();
        let mut fixed: Vec<String> = base
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        fixed.pop(); // the URL of `curl(&[], "")`
        Hammer::start(move || {
            let out = std::process::Command::new(&program)
                .args(&fixed)
                .args(&args)
                .output()
                .unwrap();
            let at = SystemTime::now();
            let mut seen = seen.lock().unwrap();
            for v in String::from_utf8_lossy(&out.stdout).lines() {
                if let Ok(v) = v.trim().parse() {
                    seen.push((at, v));
                }
            }
        })
    };
    let start = Instant::now();
    while hammered.lock().unwrap().last().is_none_or(|(_, v)| *v < 4) {
        assert!(
            start.elapsed() < Duration::from_secs(40),
            "APF's Retry-After stayed below 4"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let user = format!("system:serviceaccount:{ns}:jailed");
    let by_cmpoll = |k: &RealApiserver| -> Vec<Value> {
        requests(k, mark, &user, &ns)
            .into_iter()
            .filter(|e| e["userAgent"].as_str().unwrap_or("").starts_with("cmpoll/"))
            .collect()
    };
    let c = cmpoll_as(k, &format!("{ns}-jailed"), &User::Token(token.clone()));
    // Its own backoff would wait 1 s (the interval, no jitter).
    let d = Daemon::start(
        c,
        &["--namespace", &ns, "--interval", "1s", "--jitter", "0"],
    );
    let rejected = |got: &[Value]| got.iter().position(|e| e["responseStatus"]["code"] == 429);
    eventually(
        "a list of cmpoll's rejected, and its next attempt",
        Duration::from_secs(40),
        || {
            let got = by_cmpoll(k);
            rejected(&got).is_some_and(|i| i + 1 < got.len())
        },
    );
    let got = by_cmpoll(k);
    let i = rejected(&got).unwrap();
    let (first, next) = (received(&got[i]), received(&got[i + 1]));
    // What APF said then, as the hammer heard it around that moment.
    let around: Vec<u64> = hammered
        .lock()
        .unwrap()
        .iter()
        .filter(|(at, _)| {
            at.duration_since(first)
                .or_else(|e| Ok::<_, ()>(e.duration()))
                .unwrap()
                < Duration::from_millis(300)
        })
        .map(|(_, v)| *v)
        .collect();
    let retry_after = *around.iter().min().expect("the hammer heard APF then");
    let heard = format!(
        "{} answers, {}..={} s",
        around.len(),
        retry_after,
        around.iter().max().unwrap()
    );
    assert!(retry_after >= 2, "{heard}");
    let waited = next.duration_since(first).unwrap();
    assert!(
        waited >= Duration::from_secs(retry_after) - Duration::from_millis(50),
        "cmpoll came back after {waited:?}, Retry-After was {retry_after} s ({heard})\n{}",
        d.stderr()
    );
    assert!(
        d.stderr()
            .contains("429 Too Many Requests: Too many requests, please try again later."),
        "{}",
        d.stderr()
    );
    // Room again: the level gets seats, and cmpoll's next poll goes through.
    drop(hammer);
    drop(_slow);
    k.ok(&["delete", "flowschema", &ns]);
    let b = d.batch(Duration::from_secs(60));
    assert_eq!(kinds(&b)[0], ("added", format!("{ns}/a").as_str()));
    d.stop();
    k.ok(&["delete", "prioritylevelconfiguration", &ns]);
}
