//! The command line as typed: argh structs whose doc comments are the `--help` text.
//!
//! Values stay raw strings here; `settings.rs` applies `CMPOLL_*` variables and defaults,
//! validates, and names the flag in every error. `run` and `list` share the source and
//! selection flags; argh cannot flatten structs, so `args!` declares them once for both.

use argh::FromArgs;

/// The flags `run` and `list` share, as plain data.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Common {
    pub manifests: Option<String>,
    pub server: Option<String>,
    pub token_file: Option<String>,
    pub ca_file: Option<String>,
    pub kubeconfig: Option<String>,
    pub context: Option<String>,
    pub service_account_dir: Option<String>,
    pub selector: Option<String>,
    pub field_selector: Option<String>,
    pub namespace: Vec<String>,
    pub keys: Vec<String>,
    pub timeout: Option<String>,
    pub page_size: Option<String>,
    pub max_response_bytes: Option<String>,
    pub metadata_first: bool,
    pub list_mode: Option<String>,
    pub resource: Option<String>,
    pub namespace_from_context: bool,
    pub allow_insecure_http: bool,
    pub log_format: Option<String>,
    pub log_level: Option<String>,
}

/// Declares a subcommand struct with the shared flags first, then its own.
macro_rules! args {
    (
        $(#[$meta:meta])*
        pub struct $name:ident { $($own:tt)* }
    ) => {
        #[derive(FromArgs, Clone, Debug, Default, PartialEq)]
        $(#[$meta])*
        pub struct $name {
            /// read ConfigMap (or Secret) manifests (YAML/JSON, recursively) from DIR instead of an apiserver
            #[argh(option, arg_name = "DIR")]
            pub manifests: Option<String>,
            /// apiserver URL (with --token-file and --ca-file; for systemd units)
            #[argh(option, arg_name = "URL")]
            pub server: Option<String>,
            /// bearer token file for --server (re-read when it changes)
            #[argh(option, arg_name = "FILE")]
            pub token_file: Option<String>,
            /// CA bundle for --server (default: the platform's)
            #[argh(option, arg_name = "FILE")]
            pub ca_file: Option<String>,
            /// kubeconfig file (default: $KUBECONFIG, then in-cluster, then ~/.kube/config)
            #[argh(option, arg_name = "FILE")]
            pub kubeconfig: Option<String>,
            /// kubeconfig context (default: current-context)
            #[argh(option, arg_name = "NAME")]
            pub context: Option<String>,
            /// where in-cluster credentials are (default: /var/run/secrets/kubernetes.io/serviceaccount)
            #[argh(option, arg_name = "DIR")]
            pub service_account_dir: Option<String>,
            /// label selector (default: cmpoll.io/module=true)
            #[argh(option, arg_name = "SELECTOR")]
            pub selector: Option<String>,
            /// field selector (metadata.name, metadata.namespace)
            #[argh(option, arg_name = "SELECTOR")]
            pub field_selector: Option<String>,
            /// namespace to list, repeatable (default: all namespaces)
            #[argh(option, arg_name = "NS")]
            pub namespace: Vec<String>,
            /// glob of data/binaryData keys that become files, repeatable (default: *)
            #[argh(option, arg_name = "GLOB")]
            pub keys: Vec<String>,
            /// per-request timeout (default: 10s)
            #[argh(option, arg_name = "DURATION")]
            pub timeout: Option<String>,
            /// list in pages of N with limit/continue (default: 0, one unpaged list from the watch cache)
            #[argh(option, arg_name = "N")]
            pub page_size: Option<String>,
            /// largest answer to read, e.g. 64MiB (default: 64MiB)
            #[argh(option, arg_name = "BYTES")]
            pub max_response_bytes: Option<String>,
            /// what to list: configmaps or secrets (default: configmaps)
            #[argh(option, arg_name = "RESOURCE")]
            pub resource: Option<String>,
            /// auto, full or metadata: after a first full list, list metadata only and GET what changed; auto falls back to full lists where get is forbidden (default: auto)
            #[argh(option, arg_name = "MODE")]
            pub list_mode: Option<String>,
            /// the same as --list-mode metadata
            #[argh(switch)]
            pub metadata_first: bool,
            /// list the kubeconfig context's namespace (in a pod: the pod's own namespace)
            #[argh(switch)]
            pub namespace_from_context: bool,
            /// allow sending credentials to an http:// server
            #[argh(switch)]
            pub allow_insecure_http: bool,
            /// log format: text or json (default: text)
            #[argh(option, arg_name = "FORMAT")]
            pub log_format: Option<String>,
            /// log level: error, warn, info, debug or trace (default: info; RUST_LOG also works)
            #[argh(option, arg_name = "LEVEL")]
            pub log_level: Option<String>,
            $($own)*
        }

        impl $name {
            pub fn common(&self) -> Common {
                Common {
                    manifests: self.manifests.clone(),
                    server: self.server.clone(),
                    token_file: self.token_file.clone(),
                    ca_file: self.ca_file.clone(),
                    kubeconfig: self.kubeconfig.clone(),
                    context: self.context.clone(),
                    service_account_dir: self.service_account_dir.clone(),
                    selector: self.selector.clone(),
                    field_selector: self.field_selector.clone(),
                    namespace: self.namespace.clone(),
                    keys: self.keys.clone(),
                    timeout: self.timeout.clone(),
                    page_size: self.page_size.clone(),
                    max_response_bytes: self.max_response_bytes.clone(),
                    metadata_first: self.metadata_first,
                    list_mode: self.list_mode.clone(),
                    resource: self.resource.clone(),
                    namespace_from_context: self.namespace_from_context,
                    allow_insecure_http: self.allow_insecure_http,
                    log_format: self.log_format.clone(),
                    log_level: self.log_level.clone(),
                }
            }
        }
    };
}

/// Poll labelled Kubernetes ConfigMaps (or Secrets) and hand them to an agent: atomic files, a
/// supervised child, a reload URL, or JSON events. Every flag can also be set as
/// CMPOLL_<FLAG> (for example CMPOLL_OUT_DIR); the flag wins.
#[derive(FromArgs, Debug, PartialEq)]
pub struct TopLevel {
    /// print the version and exit
    #[argh(switch)]
    pub version: bool,
    #[argh(subcommand)]
    pub command: Option<Command>,
}

#[derive(FromArgs, Debug, PartialEq)]
#[argh(subcommand)]
pub enum Command {
    Run(Box<RunArgs>),
    List(Box<ListArgs>),
}

args! {
    /// Poll once, print the modules with their hashes, and exit (1 if the list fails).
    #[argh(subcommand, name = "list")]
    pub struct ListArgs {
        /// print a JSON array of modules with their files instead of a table
        #[argh(switch)]
        pub json: bool,
    }
}

args! {
    /// The daemon: poll on an interval and tell the agent what changed. Usage: cmpoll run
    /// [options] [-- AGENT_COMMAND ARGS...]
    #[argh(subcommand, name = "run")]
    pub struct RunArgs {
        /// time between polls (default: 30s)
        #[argh(option, arg_name = "DURATION")]
        pub interval: Option<String>,
        /// spread each wait by up to this fraction of the interval (default: 0.1)
        #[argh(option, arg_name = "FRACTION")]
        pub jitter: Option<String>,
        /// poll once, apply the sinks, exit (init containers, CI)
        #[argh(switch)]
        pub once: bool,
        /// print events as JSON lines on stdout (the default when no other sink is given)
        #[argh(switch)]
        pub stdout_events: bool,
        /// write modules to DIR (atomically; created if missing)
        #[argh(option, arg_name = "DIR")]
        pub out_dir: Option<String>,
        /// output layout: files (DIR/NS/NAME/KEY), concat (DIR/NS.NAME{EXT}) or flat (DIR/KEY) (default: files)
        #[argh(option, arg_name = "LAYOUT")]
        pub layout: Option<String>,
        /// file name extension for --layout concat
        #[argh(option, arg_name = "EXT")]
        pub ext: Option<String>,
        /// mode of written files, octal (default: 0644; 0600 with --resource secrets)
        #[argh(option, arg_name = "MODE")]
        pub file_mode: Option<String>,
        /// how long a replaced module version stays readable in --out-dir (default: 30s)
        #[argh(option, arg_name = "DURATION")]
        pub old_version_ttl: Option<String>,
        /// what the agent gets on stdin: events or null (default: null)
        #[argh(option, arg_name = "MODE")]
        pub child_stdin: Option<String>,
        /// signal the agent after each batch with changes, e.g. HUP
        #[argh(option, arg_name = "SIGNAL")]
        pub reload_signal: Option<String>,
        /// restart the agent: always, on-failure or never (default: always)
        #[argh(option, arg_name = "POLICY")]
        pub restart: Option<String>,
        /// how long the agent gets to stop before SIGKILL (default: 10s)
        #[argh(option, arg_name = "DURATION")]
        pub shutdown_grace: Option<String>,
        /// run /bin/sh -c CMD after each batch with changes, once the folder is written
        #[argh(option, arg_name = "CMD")]
        pub on_change: Option<String>,
        /// call this URL after each batch with changes, repeatable
        #[argh(option, arg_name = "URL")]
        pub reload_url: Vec<String>,
        /// extra header for --reload-url calls, 'Name: value' or 'Name: @FILE' (read at
        /// each call), repeatable
        #[argh(option, arg_name = "HEADER")]
        pub reload_header: Vec<String>,
        /// per call of --reload-url, and with --once how long delivery may take (default: 30s)
        #[argh(option, arg_name = "DURATION")]
        pub reload_timeout: Option<String>,
        /// do not call --reload-url after the first batch (the agent reads the folder when
        /// it starts)
        #[argh(switch)]
        pub reload_skip_first: bool,
        /// HTTP method for --reload-url (default: POST)
        #[argh(option, arg_name = "METHOD")]
        pub reload_method: Option<String>,
        /// CA bundle for an https --reload-url (default: the platform's)
        #[argh(option, arg_name = "FILE")]
        pub reload_ca_file: Option<String>,
        /// run /bin/sh -c CMD on each new module version, staged; a non-zero exit keeps the last good version from the agent
        #[argh(option, arg_name = "CMD")]
        pub validate: Option<String>,
        /// how long --validate may run per module (default: 30s)
        #[argh(option, arg_name = "DURATION")]
        pub validate_timeout: Option<String>,
        /// validations run at once (default: 1)
        #[argh(option, arg_name = "N")]
        pub validate_jobs: Option<String>,
        /// serve /healthz, /readyz and /metrics on ADDR (e.g. :8080 or [::]:8080)
        #[argh(option, arg_name = "ADDR")]
        pub listen: Option<String>,
        /// the agent to supervise, after --
        #[argh(positional, arg_name = "AGENT")]
        pub agent: Vec<String>,
    }
}

/// A flag's variable: `--out-dir` → `CMPOLL_OUT_DIR`.
pub fn env_name(flag: &str) -> String {
    format!("CMPOLL_{}", flag.to_ascii_uppercase().replace('-', "_"))
}

/// The long flags of `run` and `list`, read from argh's own `--help` text (one source).
pub fn flag_names() -> Vec<String> {
    let mut names = Vec::new();
    for cmd in ["run", "list"] {
        if let Err(early) = TopLevel::from_args(&["cmpoll"], &[cmd, "--help"]) {
            for line in early.output.lines() {
                if let Some(flag) = line.trim_start().strip_prefix("--")
                    && line.starts_with("  --")
                {
                    let name = flag.split_whitespace().next().unwrap_or("");
                    if name != "help" && !names.iter().any(|n| n == name) {
                        names.push(name.to_string());
                    }
                }
            }
        }
    }
    names
}

/// `--help` with each flag's variable: `  --interval  … [CMPOLL_INTERVAL]`.
pub fn help_with_variables(help: &str) -> String {
    let mut out = String::new();
    for line in help.lines() {
        out.push_str(line);
        if line.starts_with("  --")
            && let Some(name) = line.trim_start().strip_prefix("--")
        {
            let name = name.split_whitespace().next().unwrap_or("");
            if name != "help" {
                out.push_str(&format!(" [{}]", env_name(name)));
            }
        }
        out.push('\n');
    }
    out
}

/// Edit distance, for suggestions.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

/// The flag of `flags` nearest to `name` (at most 2 edits, or a quarter of its length).
pub fn nearest_flag(name: &str, flags: &[String]) -> Option<String> {
    let limit = (name.len() / 4).max(2);
    flags
        .iter()
        .map(|f| (distance(name, f), f))
        .filter(|(d, _)| *d <= limit)
        .min()
        .map(|(_, f)| f.clone())
}

/// argh's error for an unknown flag, with the nearest real one suggested.
pub fn with_suggestion(error: &str) -> String {
    let error = error.trim_end();
    let Some(rest) = error.split("Unrecognized argument: --").nth(1) else {
        return error.to_string();
    };
    let typed = rest.split_whitespace().next().unwrap_or("");
    let typed = typed.split('=').next().unwrap_or(typed);
    match nearest_flag(typed, &flag_names()) {
        Some(f) => format!("{error} (did you mean --{f}?)"),
        None => error.to_string(),
    }
}

/// Warnings for `CMPOLL_*` variables that name no flag (a typo must not pass silently).
pub fn unknown_variables<'a>(names: impl Iterator<Item = &'a str>) -> Vec<String> {
    let ours: Vec<&str> = names.filter(|n| n.starts_with("CMPOLL_")).collect();
    if ours.is_empty() {
        return Vec::new();
    }
    let flags = flag_names();
    let known: Vec<String> = flags.iter().map(|f| env_name(f)).collect();
    let mut out = Vec::new();
    for name in ours {
        let Some(rest) = name.strip_prefix("CMPOLL_") else {
            continue;
        };
        if known.iter().any(|k| k == name) {
            continue;
        }
        let as_flag = rest.to_ascii_lowercase().replace('_', "-");
        let hint = nearest_flag(&as_flag, &flags)
            .map(|f| format!(" (did you mean {}?)", env_name(&f)))
            .unwrap_or_default();
        out.push(format!(
            "{name} names no flag of cmpoll and is ignored{hint}"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<TopLevel, String> {
        TopLevel::from_args(&["cmpoll"], args).map_err(|e| e.output)
    }

    #[test]
    fn subcommands_share_the_source_flags() {
        let t = parse(&[
            "list",
            "--namespace",
            "a",
            "--namespace",
            "b",
            "--json",
            "--keys",
            "*.alloy",
        ])
        .unwrap();
        let Some(Command::List(l)) = t.command else {
            panic!()
        };
        assert!(l.json);
        assert_eq!(l.common().namespace, ["a", "b"]);
        assert_eq!(l.common().keys, ["*.alloy"]);
        let t = parse(&[
            "run",
            "--interval",
            "5s",
            "--server",
            "https://x",
            "--",
            "agent",
            "-c",
            "x",
        ])
        .unwrap();
        let Some(Command::Run(r)) = t.command else {
            panic!()
        };
        assert_eq!(r.interval.as_deref(), Some("5s"));
        assert_eq!(r.common().server.as_deref(), Some("https://x"));
        assert_eq!(r.agent, ["agent", "-c", "x"]);
    }

    #[test]
    fn version_and_unknown_flags() {
        assert!(parse(&["--version"]).unwrap().version);
        assert!(parse(&["list", "--nope"]).unwrap_err().contains("--nope"));
        assert!(
            parse(&["list", "--json", "--interval", "1s"]).is_err(),
            "run-only flag"
        );
    }

    #[test]
    fn typos_get_the_nearest_flag() {
        assert!(flag_names().contains(&"interval".to_string()));
        assert!(flag_names().contains(&"json".to_string()));
        let flags = flag_names();
        assert_eq!(nearest_flag("intervl", &flags).as_deref(), Some("interval"));
        assert_eq!(nearest_flag("out-dri", &flags).as_deref(), Some("out-dir"));
        assert_eq!(nearest_flag("zzzzzzzz", &flags), None);
        assert_eq!(
            with_suggestion("Unrecognized argument: --intervl\n"),
            "Unrecognized argument: --intervl (did you mean --interval?)"
        );
        let warned = unknown_variables(["CMPOLL_INTERVL", "CMPOLL_INTERVAL", "PATH"].into_iter());
        assert_eq!(
            warned,
            [
                "CMPOLL_INTERVL names no flag of cmpoll and is ignored (did you mean CMPOLL_INTERVAL?)"
            ]
        );
        let help = help_with_variables("  --out-dir         write modules\n  --help  x\n");
        assert_eq!(
            help,
            "  --out-dir         write modules [CMPOLL_OUT_DIR]\n  --help  x\n"
        );
    }
}
