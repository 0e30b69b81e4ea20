use std::collections::HashMap;

use super::*;

/// The apiserver's Events, as the fake keeps them; and each call made.
#[derive(Default)]
struct Fake {
    events: HashMap<(String, String), Value>,
    calls: Vec<String>,
    down: bool,
}

impl EventApi for &mut Fake {
    fn create(&mut self, namespace: &str, event: &Value) -> Result<bool, String> {
        let name = event["metadata"]["name"].as_str().unwrap().to_string();
        self.calls.push(format!("create {name}"));
        if self.down {
            return Err("503".into());
        }
        let key = (namespace.to_string(), name);
        if self.events.contains_key(&key) {
            return Ok(false);
        }
        self.events.insert(key, event.clone());
        Ok(true)
    }

    fn patch(&mut self, namespace: &str, name: &str, patch: &Value) -> Result<bool, String> {
        self.calls.push(format!("patch {name}"));
        let Some(e) = self
            .events
            .get_mut(&(namespace.to_string(), name.to_string()))
        else {
            return Ok(false);
        };
        for (k, v) in patch.as_object().unwrap() {
            e[k] = v.clone();
        }
        Ok(true)
    }
}

fn notice(name: &str, hash: u8, message: &str, count: u32) -> Notice {
    Notice {
        regarding: Regarding {
            kind: Resource::ConfigMaps,
            namespace: "ns".into(),
            name: name.into(),
            uid: format!("u-{name}"),
            resource_version: "7".into(),
        },
        hash: Hash([hash; 32]),
        reason: "Refused",
        message: message.into(),
        count,
    }
}

const GAP: Duration = Duration::from_secs(30);

#[test]
fn one_event_per_object_and_version_updated_as_its_words_change() {
    let mut fake = Fake::default();
    let t0 = Instant::now();
    {
        let mut w = Writer::new(&mut fake, "hub-a".into(), GAP, Results::default());
        let one = notice("m", 1, "refused by 1 of 10 followers: node-7: bad", 1);
        assert_eq!(w.write(std::slice::from_ref(&one), t0), None);
        // The same again: nothing written.
        assert_eq!(w.write(&[one], t0 + GAP * 2), None);
        // More refusals: written, but not before the gap.
        let two = notice(
            "m",
            1,
            "refused by 2 of 10 followers: node-7: bad; node-9: bad",
            2,
        );
        let soon = t0 + GAP * 2 + Duration::from_secs(1);
        assert_eq!(
            w.write(std::slice::from_ref(&two), soon),
            None,
            "its last write was long ago"
        );
        let three = notice("m", 1, "refused by 3 of 10 followers: …", 3);
        let next = w.write(std::slice::from_ref(&three), soon + Duration::from_secs(1));
        assert_eq!(next, Some(soon + GAP), "one write per gap");
        assert_eq!(w.write(std::slice::from_ref(&three), soon + GAP), None);
        // Another version of the same object: an Event of its own.
        w.write(
            &[three, notice("m", 2, "refused by the hub", 1)],
            soon + GAP,
        );
    }
    assert_eq!(
        fake.calls,
        [
            "create m.0101010101010101.7f3a3a2c",
            "patch m.0101010101010101.7f3a3a2c",
            "patch m.0101010101010101.7f3a3a2c",
            "create m.0202020202020202.7f3a3a2c",
        ]
        .map(|s| s.replace("7f3a3a2c", &hub8("hub-a")))
    );
    assert_eq!(fake.events.len(), 2);
    let e = &fake.events[&(
        "ns".to_string(),
        format!("m.0101010101010101.{}", hub8("hub-a")),
    )];
    assert_eq!(e["message"], "refused by 3 of 10 followers: …");
    assert_eq!(e["count"], 3);
    assert_eq!(e["involvedObject"]["kind"], "ConfigMap");
    assert_eq!(e["involvedObject"]["uid"], "u-m");
    assert_eq!(e["type"], "Warning");
    assert_eq!(e["reason"], "Refused");
    assert_eq!(e["source"]["host"], "hub-a");
}

fn hub8(instance: &str) -> String {
    Sha256::digest(format!("configmap/{instance}").as_bytes())[..4]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn a_restarted_hub_updates_its_event_and_another_hub_writes_its_own() {
    let mut fake = Fake::default();
    let t0 = Instant::now();
    let n = notice("m", 1, "refused by the hub's --validate: bad", 1);
    Writer::new(&mut fake, "hub-a".into(), GAP, Results::default())
        .write(std::slice::from_ref(&n), t0);
    let later = notice(
        "m",
        1,
        "refused by the hub's --validate: bad; and 1 follower",
        2,
    );
    Writer::new(&mut fake, "hub-a".into(), GAP, Results::default()).write(&[later], t0);
    assert_eq!(
        fake.events.len(),
        1,
        "the restarted hub's Event is the same"
    );
    Writer::new(&mut fake, "hub-b".into(), GAP, Results::default())
        .write(std::slice::from_ref(&n), t0);
    assert_eq!(fake.events.len(), 2, "one per hub");
    // A Secret of the same name and content: an Event of its own.
    let mut secret = n;
    secret.regarding.kind = Resource::Secrets;
    Writer::new(&mut fake, "hub-b".into(), GAP, Results::default()).write(&[secret], t0);
    assert_eq!(fake.events.len(), 3, "one per kind");
}

#[test]
fn a_failure_is_tried_again_at_the_next_slot_and_names_fit() {
    let mut fake = Fake {
        down: true,
        ..Fake::default()
    };
    let t0 = Instant::now();
    let long = "x".repeat(253);
    let n = notice(&long, 1, &"é".repeat(1000), 1);
    {
        let mut w = Writer::new(&mut fake, "hub".into(), GAP, Results::default());
        assert_eq!(w.write(std::slice::from_ref(&n), t0), Some(t0 + GAP));
        assert_eq!(
            w.write(std::slice::from_ref(&n), t0 + Duration::from_secs(1)),
            Some(t0 + GAP)
        );
    }
    assert_eq!(fake.calls.len(), 1);
    fake.down = false;
    Writer::new(&mut fake, "hub".into(), GAP, Results::default()).write(&[n], t0);
    let (_, e) = fake.events.iter().next().unwrap();
    let name = e["metadata"]["name"].as_str().unwrap();
    assert_eq!(name.len(), 253);
    assert!(crate::names::dns1123_subdomain(name).is_empty(), "{name}");
    assert!(e["message"].as_str().unwrap().len() <= MAX_NOTE);
}
