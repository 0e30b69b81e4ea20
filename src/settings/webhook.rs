//! `cmpoll webhook`'s settings: its own flags and the selection flags it shares with
//! `run` (`--selector`, `--keys`, `--resource`, `--validate`, `--validate-timeout`,
//! `--listen`), validated; errors name the flag or variable. It reads no source flag: it
//! never talks to the apiserver, the apiserver talks to it.

use std::path::PathBuf;
use std::time::Duration;

use super::lookup::{Error, Lookup, parse_listen, path, usage, validate_timeout};
use super::source::{keys, labels, logging, resources};
use crate::cli::{WebhookArgs, flag};
use crate::ops::logging;
use crate::selector::FieldSelector;
use crate::source::Selection;
use crate::{validate, webhook};

/// `--validate-timeout`'s default here: under the apiserver's 10 s webhook timeout.
pub const VALIDATE_TIMEOUT: Duration = Duration::from_secs(8);

/// What `cmpoll webhook` runs with.
#[derive(Debug)]
pub struct WebhookSettings {
    pub webhook: webhook::Options,
    pub logging: logging::Options,
}

/// `cmpoll webhook`'s settings.
pub fn webhook(
    args: &WebhookArgs,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<WebhookSettings, Error> {
    read(&Lookup::new(args.given(), env))
}

fn read(look: &Lookup) -> Result<WebhookSettings, Error> {
    let resources = resources(look)?;
    let selection = Selection {
        resources,
        labels: labels(look, resources)?,
        fields: FieldSelector::default(),
        namespaces: Vec::new(),
        keys: keys(look)?,
        folder_annotation: None,
        names: Vec::new(),
    };
    let needed = |f: &'static crate::cli::Flag, what: &str| {
        look.opt(f)
            .filter(|v| !v.value.trim().is_empty())
            .ok_or_else(|| usage(&f.long(), format!("is required: {what}")))
    };
    let command = needed(&flag::validate, "the command that checks a module")?;
    let listen = needed(&flag::listen, "the HTTPS address, e.g. :8443")?;
    let listen = parse_listen(&listen.value).map_err(|e| usage(&listen.from, e))?;
    let cert = needed(&flag::tls_cert_file, "the serving certificate (PEM)")?;
    let key = needed(&flag::tls_key_file, "the serving certificate's key (PEM)")?;
    let timeout = validate_timeout(look, VALIDATE_TIMEOUT)?;
    if timeout >= Duration::from_secs(10) {
        log::warn!(
            "--validate-timeout {}: the apiserver waits at most 10s (30s with timeoutSeconds) for a webhook",
            humantime::format_duration(timeout)
        );
    }
    Ok(WebhookSettings {
        webhook: webhook::Options {
            listen,
            cert: PathBuf::from(cert.value),
            key: PathBuf::from(key.value),
            client_ca: path(look.opt(&flag::client_ca_file))?,
            selection,
            validate: validate::Options {
                command: command.value,
                timeout,
                jobs: 1,
                meta_dir: None,
                ext: String::new(),
                template: None,
                kinds: resources,
                confirm: None,
                out_dir: None,
            },
        },
        logging: logging(look)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::testing;

    fn webhook_of(args: &[&str], env: &[(&str, &str)]) -> Result<WebhookSettings, String> {
        let crate::cli::Command::Webhook(args) = testing::command(&[&["webhook"], args].concat())?
        else {
            panic!("webhook")
        };
        webhook(&args, &testing::env(env)).map_err(|e| e.to_string())
    }

    const NEEDED: [&str; 8] = [
        "--validate",
        "promtool check rules *",
        "--listen",
        ":8443",
        "--tls-cert-file",
        "c.pem",
        "--tls-key-file",
        "k.pem",
    ];

    #[test]
    fn what_it_needs_and_its_defaults() {
        let w = webhook_of(&NEEDED, &[]).unwrap();
        assert_eq!(w.webhook.validate.timeout, VALIDATE_TIMEOUT, "8s here");
        assert_eq!(w.webhook.listen.to_string(), "0.0.0.0:8443");
        assert_eq!(w.webhook.selection.labels.as_str(), "cmpoll.io/module=true");
        let w = webhook_of(&NEEDED, &[("CMPOLL_VALIDATE_TIMEOUT", "3s")]).unwrap();
        assert_eq!(w.webhook.validate.timeout, Duration::from_secs(3));
        for (i, flag) in [
            "--validate",
            "--listen",
            "--tls-cert-file",
            "--tls-key-file",
        ]
        .iter()
        .enumerate()
        {
            let mut args = NEEDED.to_vec();
            args.drain(i * 2..i * 2 + 2);
            let e = webhook_of(&args, &[]).unwrap_err();
            assert!(e.starts_with(&format!("{flag}: is required")), "{e}");
        }
        let e = webhook_of(&[&NEEDED[..], &["--selector", " "]].concat(), &[]).unwrap_err();
        assert!(e.starts_with("--selector: empty"), "{e}");
        // A flag of `run` is not one of the webhook's.
        assert!(webhook_of(&[&NEEDED[..], &["--out-dir", "x"]].concat(), &[]).is_err());
    }

    /// Every flag of the webhook's table entries is read, and no other.
    #[test]
    fn every_flag_of_the_webhook_is_read() {
        use crate::cli::flag;
        let Ok(crate::cli::Command::Webhook(args)) =
            testing::command(&[&["webhook"][..], &NEEDED].concat())
        else {
            panic!("webhook")
        };
        let env = |_: &str| None;
        let look = Lookup::new(args.given(), &env);
        read(&look).unwrap();
        let mut read = look.read();
        read.sort();
        read.dedup();
        let mut table: Vec<&str> = (flag::ALL.iter())
            .filter(|f| f.group.of("webhook"))
            .map(|f| f.field)
            .collect();
        table.sort();
        assert_eq!(read, table);
    }
}
