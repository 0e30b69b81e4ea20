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
    pub namespace_from_context: bool,
    pub allow_insecure_http: bool,
    pub log_format: Option<String>,
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
            /// read ConfigMap manifests (YAML/JSON, recursively) from DIR instead of an apiserver
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
            /// list metadata only, then GET the ConfigMaps whose resourceVersion changed
            #[argh(switch)]
            pub metadata_first: bool,
            /// list the kubeconfig context's namespace (in a pod: the pod's own namespace)
            #[argh(switch)]
            pub namespace_from_context: bool,
            /// allow sending credentials to an http:// server
            #[argh(switch)]
            pub allow_insecure_http: bool,
            /// log format: text or json (default: text; levels from RUST_LOG)
            #[argh(option, arg_name = "FORMAT")]
            pub log_format: Option<String>,
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
                    namespace_from_context: self.namespace_from_context,
                    allow_insecure_http: self.allow_insecure_http,
                    log_format: self.log_format.clone(),
                }
            }
        }
    };
}

/// Poll labelled Kubernetes ConfigMaps and hand them to an agent: atomic files, a
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
        /// output layout: files (DIR/NS/NAME/KEY) or concat (DIR/NS.NAME{EXT}) (default: files)
        #[argh(option, arg_name = "LAYOUT")]
        pub layout: Option<String>,
        /// file name extension for --layout concat
        #[argh(option, arg_name = "EXT")]
        pub ext: Option<String>,
        /// mode of written files, octal (default: 0644)
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
        /// serve /healthz, /readyz and /metrics on ADDR (e.g. :8080 or [::]:8080)
        #[argh(option, arg_name = "ADDR")]
        pub listen: Option<String>,
        /// the agent to supervise, after --
        #[argh(positional, arg_name = "AGENT")]
        pub agent: Vec<String>,
    }
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
}
