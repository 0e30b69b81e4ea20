//! The command line as typed, and the one table of flags: each entry below is a flag's
//! name (its field), kind (its type), command (its group), default, `--help` text and the
//! sink it belongs to (`needs`). argh parses and prints help from it; settings reads values
//! by `flag::NAME`, applies `CMPOLL_*` variables and defaults, and derives "only used with"
//! from `needs`; the unknown-variable warning and typo suggestions read `flag::ALL`.
//!
//! Adding a flag is one entry here and the code that reads it (HACKING.md has an example).
//! Values stay raw strings here; `settings` validates them.

use argh::FromArgs;

use super::entry::Given;

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
    Webhook(Box<WebhookArgs>),
    Serve(Box<ServeArgs>),
    Sidecar(SidecarArgs),
    Status(StatusArgs),
}

impl Command {
    /// The command's name, as typed.
    pub fn name(&self) -> &'static str {
        match self {
            Command::Run(_) => "run",
            Command::List(_) => "list",
            Command::Webhook(_) => "webhook",
            Command::Serve(_) => "serve",
            Command::Sidecar(_) => "sidecar",
            Command::Status(_) => "status",
        }
    }

    /// Every flag of the command with what the command line gave it (`sidecar` takes
    /// none: it is `run` with what k8s-sidecar's variables say).
    pub fn given(&self) -> Given {
        match self {
            Command::Run(r) => r.given(),
            Command::List(l) => l.given(),
            Command::Webhook(w) => w.given(),
            Command::Serve(s) => s.given(),
            Command::Sidecar(_) => RunArgs::none().given(),
            Command::Status(_) => Vec::new(),
        }
    }
}

/// A drop-in for kiwigrid/k8s-sidecar where charts embed it (Grafana's dashboard and
/// datasource sidecars, Loki's rules sidecar): takes no flags; reads k8s-sidecar's
/// variables (LABEL, LABEL_VALUE, FOLDER, FOLDER_ANNOTATION, RESOURCE, RESOURCE_NAME,
/// NAMESPACE, METHOD, SLEEP_TIME, REQ_URL and the other REQ_* variables, SCRIPT,
/// UNIQUE_FILENAMES, DEFAULT_FILE_MODE, HEALTH_PORT, HEALTH_HOST, LOG_LEVEL, LOG_FORMAT,
/// SKIP_TLS_VERIFY, KUBECONFIG) and runs `cmpoll run` with what they mean; a CMPOLL_*
/// variable that is also set wins.
#[derive(FromArgs, Debug, PartialEq)]
#[argh(subcommand, name = "sidecar")]
pub struct SidecarArgs {}

/// What a running cmpoll holds, and why: its last poll, each sink's last delivery and
/// reload, how many modules are delivered, rejected and not written, and the ones that are
/// not delivered with why (--all: every module). Asks the daemon's --listen address (GET
/// /status), or reads an output folder's own record.
/// Exit 0 when all is well, 1 when something is wrong, 2 on a usage error. Takes
/// CMPOLL_SERVER_URL, not the daemon's CMPOLL_OUT_DIR or CMPOLL_JSON (it runs where they
/// are set for the daemon).
#[derive(FromArgs, Debug, PartialEq)]
#[argh(subcommand, name = "status")]
pub struct StatusArgs {
    /// the daemon to ask (default: http:// and the address of CMPOLL_LISTEN, else of HEALTH_PORT, else http://127.0.0.1:8080)
    #[argh(option, arg_name = "URL")]
    pub server_url: Option<String>,
    /// read what the output folder DIR records instead of asking a daemon (no poll or reload is known then)
    #[argh(option, arg_name = "DIR")]
    pub out_dir: Option<String>,
    /// print the JSON answer instead of a table
    #[argh(switch)]
    pub json: bool,
    /// list every module, delivered ones too (default: only those rejected or not written)
    #[argh(switch)]
    pub all: bool,
    /// list this module (NS/NAME, or KIND/NS/NAME), whatever its state; repeatable
    #[argh(option, arg_name = "MODULE")]
    pub module: Vec<String>,
    /// ask a hub (cmpoll serve) for its fleet: per object, how many followers hold the served version, and who is behind, refused it (and why) or is gone; exit 1 when a follower refused or is behind
    #[argh(switch)]
    pub fleet: bool,
    /// present the token in FILE to --server-url (a hub answers /status to a token allowed get on it)
    #[argh(option, arg_name = "FILE")]
    pub token_file: Option<String>,
    /// trust the CA certificates in FILE for an https:// --server-url (a hub's serving certificate)
    #[argh(option, arg_name = "FILE")]
    pub ca_file: Option<String>,
}

impl StatusArgs {
    /// The one variable `cmpoll status` reads: it runs where the daemon's variables are
    /// set, so it does not read `CMPOLL_OUT_DIR` or `CMPOLL_JSON` as its flags.
    pub const SERVER_URL_VAR: &str = "CMPOLL_SERVER_URL";
}

impl RunArgs {
    /// `run` with no flag given.
    pub fn none() -> RunArgs {
        RunArgs::from_args(&["run"], &[]).expect("run takes no required flag")
    }
}

flags! {
    sections {
    common (Common) {
        /// label selector
        selector: Option<String> [option, arg_name = "SELECTOR"] = "cmpoll.io/module=true";
        /// what to list: configmaps, secrets, or both (configmaps,secrets: module names then start with configmap/ or secret/)
        resource: Option<String> [option, arg_name = "RESOURCE"] = "configmaps";
        /// log format: text or json
        log_format: Option<String> [option, arg_name = "FORMAT"] = "text";
        /// log level: error, warn, info, debug or trace (default: info; RUST_LOG also works)
        log_level: Option<String> [option, arg_name = "LEVEL"];
    }
    modules (Modules) {
        /// glob of data/binaryData keys that become files, repeatable
        keys: Vec<String> [option, arg_name = "GLOB"] = "*";
    }
    manifests (Manifests) {
        /// read ConfigMap (or Secret) manifests (YAML/JSON, recursively) from DIR instead of an apiserver
        manifests: Option<String> [option, arg_name = "DIR"];
    }
    apiserver (Apiserver) {
        /// apiserver URL (with --token-file and --ca-file; for systemd units)
        server: Option<String> [option, arg_name = "URL"];
        /// bearer token file for --server (re-read when it changes)
        token_file: Option<String> [option, arg_name = "FILE"], needs Server;
        /// CA bundle for --server (default: the platform's)
        ca_file: Option<String> [option, arg_name = "FILE"], needs Server;
        /// kubeconfig file (default: $KUBECONFIG, then in-cluster, then ~/.kube/config)
        kubeconfig: Option<String> [option, arg_name = "FILE"];
        /// kubeconfig context (default: current-context)
        context: Option<String> [option, arg_name = "NAME"];
        /// where in-cluster credentials are
        service_account_dir: Option<String> [option, arg_name = "DIR"]
            = "/var/run/secrets/kubernetes.io/serviceaccount";
        /// field selector (metadata.name, metadata.namespace)
        field_selector: Option<String> [option, arg_name = "SELECTOR"];
        /// namespace to list, repeatable (default: all namespaces)
        namespace: Vec<String> [option, arg_name = "NS"];
        /// per-request timeout
        timeout: Option<String> [option, arg_name = "DURATION"] = "10s";
        /// list in pages of N with limit/continue (0: one unpaged list from the watch cache)
        page_size: Option<String> [option, arg_name = "N"] = "0";
        /// largest answer to read, e.g. 64MiB
        max_response_bytes: Option<String> [option, arg_name = "BYTES"] = "64MiB";
        /// auto, full or metadata: after a first full list, list metadata only and GET what changed; auto falls back to full lists where get is forbidden
        list_mode: Option<String> [option, arg_name = "MODE"] = "auto";
        /// the same as --list-mode metadata
        metadata_first: bool [switch];
        /// list the kubeconfig context's namespace (in a pod: the pod's own namespace)
        namespace_from_context: bool [switch];
        /// allow sending credentials to an http:// server
        allow_insecure_http: bool [switch];
    }
    validating (Validating) {
        /// run /bin/sh -c CMD on each new module version, staged; a non-zero exit keeps the last good version from the agent (cmpoll webhook: denies the object; cmpoll serve: serves every client the last good version)
        validate: Option<String> [option, arg_name = "CMD"];
        /// how long --validate may run per module (default: 30s; cmpoll webhook: 8s, under the apiserver's 10s webhook timeout)
        validate_timeout: Option<String> [option, arg_name = "DURATION"], needs Validate;
    }
    judging (Judging) {
        /// validations run at once
        validate_jobs: Option<String> [option, arg_name = "N"] = "1", needs Validate;
    }
    reporting (Reporting) {
        /// record Kubernetes Events on the ConfigMap or Secret when its module is rejected, accepted again, or cannot be written (needs create and patch on events.k8s.io events; cmpoll serve: one Event per object and version it or its followers refused, on core events)
        report_events: bool [switch];
    }
    listening (Listening) {
        /// serve /healthz, /readyz and /metrics on ADDR, e.g. :8080 or [::]:8080 (cmpoll webhook and cmpoll serve: over HTTPS, with what they serve)
        listen: Option<String> [option, arg_name = "ADDR"];
    }
    polling (Polling) {
        /// time between polls (default: 30s; cmpoll serve: 1s)
        interval: Option<String> [option, arg_name = "DURATION"];
        /// spread each wait by up to this fraction of the interval
        jitter: Option<String> [option, arg_name = "FRACTION"] = "0.1";
    }
    tls (Tls) {
        /// the serving certificate (PEM, with its chain), re-read when it changes
        tls_cert_file: Option<String> [option, arg_name = "FILE"];
        /// the serving certificate's private key (PEM), re-read when it changes
        tls_key_file: Option<String> [option, arg_name = "FILE"];
    }
    }

    /// Poll once, print the modules with their hashes, and exit (1 if the list fails).
    #[argh(subcommand, name = "list")]
    pub struct ListArgs (List) uses [common: yes, modules: yes, manifests: yes, apiserver: yes,
        validating: no, judging: no, reporting: no, listening: no, polling: no, tls: no] {
        /// print a JSON array of modules with their files instead of a table
        json: bool [switch];
    } {}

    /// The daemon: poll on an interval and tell the agent what changed. Usage: cmpoll run
    /// [options] [-- AGENT_COMMAND ARGS...]
    #[argh(subcommand, name = "run")]
    pub struct RunArgs (Run) uses [common: yes, modules: yes, manifests: yes, apiserver: yes,
        validating: yes, judging: yes, reporting: yes, listening: yes, polling: yes, tls: no] {
        /// poll once, apply the sinks, exit (init containers, CI)
        once: bool [switch];
        /// print events as JSON lines on stdout (the default when no other sink is given)
        stdout_events: bool [switch];
        /// write modules to DIR (atomically; created if missing)
        out_dir: Option<String> [option, arg_name = "DIR"];
        /// output layout: files (DIR/NS/NAME/KEY), concat (DIR/NS.NAME{EXT}) or flat (DIR/KEY)
        layout: Option<String> [option, arg_name = "LAYOUT"] = "files", needs OutDir;
        /// file name extension for --layout concat
        ext: Option<String> [option, arg_name = "EXT"], needs Concat;
        /// write each module through this template ({{module}}, {{namespace}}, {{name}}, {{ident}}, {{hash}}, {{content}}, {{arguments}}): an Alloy declare block per module, for example
        module_template: Option<String> [option, arg_name = "FILE"], needs Concat;
        /// NAME = VALUE lines offered to every module: {{arguments}} passes a module those it declares (argument "NAME" blocks)
        offer_arguments: Option<String> [option, arg_name = "FILE"], needs ModuleTemplate;
        /// write each module's files into the folder its annotation ANNOTATION names: relative to --out-dir, or an absolute path inside it
        folder_annotation: Option<String> [option, arg_name = "ANNOTATION"], needs Flat;
        /// name each file namespace_<NS>.<configmap|secret>_<NAME>.<KEY> (k8s-sidecar's UNIQUE_FILENAMES)
        unique_filenames: bool [switch], needs Flat;
        /// fetch keys ending in .url whose value is an http(s) URL, when their object is added or updated: the file is named without .url and holds the body
        fetch_url_keys: bool [switch];
        /// mode of written files, octal (default: 0644; 0600 for a Secret's)
        file_mode: Option<String> [option, arg_name = "MODE"], needs OutDir;
        /// how long a replaced module version stays readable in --out-dir
        old_version_ttl: Option<String> [option, arg_name = "DURATION"] = "30s", needs OutDir;
        /// what the agent gets on stdin: events or null
        child_stdin: Option<String> [option, arg_name = "MODE"] = "null", needs Agent;
        /// signal the agent after each batch with changes, e.g. HUP
        reload_signal: Option<String> [option, arg_name = "SIGNAL"], needs Agent;
        /// restart the agent: always, on-failure or never
        restart: Option<String> [option, arg_name = "POLICY"] = "always", needs Agent;
        /// how long the agent gets to stop before SIGKILL
        shutdown_grace: Option<String> [option, arg_name = "DURATION"] = "10s", needs Agent;
        /// run /bin/sh -c CMD after each batch with changes, once the folder is written
        on_change: Option<String> [option, arg_name = "CMD"];
        /// call this URL after each batch with changes, repeatable
        reload_url: Vec<String> [option, arg_name = "URL"];
        /// extra header for --reload-url calls, 'Name: value' or 'Name: @FILE' (read at each call), repeatable
        reload_header: Vec<String> [option, arg_name = "HEADER"], needs ReloadUrl;
        /// per call of --reload-url or run of --on-change, and with --once how long delivery may take
        reload_timeout: Option<String> [option, arg_name = "DURATION"] = "30s",
            needs ReloadUrlOrOnChange;
        /// do not call --reload-url after the first batch (the agent reads the folder when it starts)
        reload_skip_first: bool [switch], needs ReloadUrl;
        /// HTTP method for --reload-url
        reload_method: Option<String> [option, arg_name = "METHOD"] = "POST", needs ReloadUrl;
        /// CA bundle for an https --reload-url (default: the platform's)
        reload_ca_file: Option<String> [option, arg_name = "FILE"], needs ReloadUrl;
        /// after each batch with changes has reached every sink, run /bin/sh -c CMD: the agent takes the batch and says which modules it added or updated (CMPOLL_MODULES, one namespace/name per line) it refused, one 'namespace/name reason' line each on stdout; those go back to their last good version (or away) and are rejected (k8s/alloy/confirm-modules.sh asks Alloy)
        confirm: Option<String> [option, arg_name = "CMD"], needs Validate;
    } {
        /// the agent to supervise, after --
        #[argh(positional, arg_name = "AGENT")]
        pub agent: Vec<String>,
    }

    /// A validating admission webhook: runs --validate on each ConfigMap (or Secret) being
    /// created or updated, staged as cmpoll run stages a module, and denies it with the
    /// validator's output. Fails open when the validator cannot run or times out.
    #[argh(subcommand, name = "webhook")]
    pub struct WebhookArgs (Webhook) uses [common: yes, modules: yes, manifests: no, apiserver: no,
        validating: yes, judging: no, reporting: no, listening: yes, polling: no, tls: yes] {
        /// accept only clients presenting a certificate this CA (PEM) signed: the apiserver's client certificate for webhooks, which its AdmissionConfiguration names
        client_ca_file: Option<String> [option, arg_name = "FILE"];
    } {}

    /// One poll for a fleet: poll the apiserver as cmpoll run does and serve the last complete
    /// poll over HTTPS as the apiserver's read API for what it selected (GET and list of
    /// configmaps or secrets, authenticated by TokenReview and authorized by
    /// SubjectAccessReview), so that many agents list the hub instead of the apiserver. A
    /// cmpoll run pointed at it learns of a change as soon as the hub polls it.
    #[argh(subcommand, name = "serve")]
    pub struct ServeArgs (Serve) uses [common: yes, modules: no, manifests: no, apiserver: yes,
        validating: yes, judging: yes, reporting: yes, listening: yes, polling: yes, tls: yes] {
        /// on SIGTERM, fail /readyz and let the followers go over this window, spread (each connection ends at a moment of its own, so they reconnect to the other hubs spread), then exit; a second signal stops at once; 0s: at once
        drain_window: Option<String> [option, arg_name = "DURATION"] = "15s";
        /// verify followers' service-account tokens requested for this audience here, against the cluster's service-account issuer keys (/.well-known/openid-configuration), without a TokenReview, their service account read (get serviceaccounts) and kept a minute; a token living over an hour is reviewed by the apiserver instead; a deleted pod's token then works until it expires (keep expirationSeconds short); other tokens are reviewed as before
        token_audience: Option<String> [option, arg_name = "AUDIENCE"];
        /// review a service account's access once for all its pods (its SubjectAccessReview without the pod's extra, which RBAC never reads): only where the cluster authorizes with RBAC
        authorize_per_service_account: bool [switch];
        /// keep here what the hub must remember across restarts: --validate's verdicts and each held-back object's last good version (a volume that outlives the container; mode 0700)
        state_dir: Option<String> [option, arg_name = "DIR"], needs Validate;
        /// roll each new version of an object out in steps, each a share of the clients by a stable hash of their names: e.g. 1%,10%,50%,100% (each N% or N.NNN%, strictly increasing, the last 100%, at most 10), or none (only objects whose cmpoll.io/rollout annotation asks for steps roll out); without it, no rollouts and the annotation is ignored
        rollout: Option<String> [option, arg_name = "STEPS"];
        /// the least time each step of a rollout is held before the next
        rollout_wait: Option<String> [option, arg_name = "DURATION"] = "1m", needs Rollout;
        /// the Secret that holds the rollouts' state, read and written by every hub (default: cmpoll-rollouts in the hub's own namespace: its pod's, else its kubeconfig context's)
        rollout_state: Option<String> [option, arg_name = "NAMESPACE/NAME"], needs Rollout;
        /// answer Alloy's remotecfg block (grafana's collector.v1.CollectorService) on the hub's port: each collector runs ROOT (an Alloy file, read again when it changes; or configmap:NS/NAME, its key root.alloy, and its key arguments as --remotecfg-arguments, read again after each poll) then each selected ConfigMap's *.alloy keys wrapped in a declare block of its own, as docs/alloy.md wraps them, for the namespaces it may list and, with the annotation cmpoll.io/collectors: SELECTOR, when the selector matches its attributes
        remotecfg: Option<String> [option, arg_name = "ROOT"];
        /// NAME = VALUE lines (as --offer-arguments): the arguments --remotecfg offers every module, each passed those it declares; values are Alloy expressions in ROOT's scope
        remotecfg_arguments: Option<String> [option, arg_name = "FILE"], needs Remotecfg;
    } {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::entry::{COMMANDS, Kind, Raw};
    use crate::cli::hints;

    fn parse(args: &[&str]) -> Result<TopLevel, String> {
        TopLevel::from_args(&["cmpoll"], args).map_err(|e| e.output)
    }

    fn given<'a>(g: &'a Given, name: &str) -> &'a Raw {
        &g.iter().find(|(f, _)| f.name() == name).unwrap().1
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
        let c = t.command.unwrap();
        let g = c.given();
        assert_eq!(given(&g, "json"), &Raw::Switch(true));
        assert_eq!(
            given(&g, "namespace"),
            &Raw::List(vec!["a".into(), "b".into()])
        );
        assert_eq!(given(&g, "keys"), &Raw::List(vec!["*.alloy".into()]));
        assert_eq!(given(&g, "selector"), &Raw::Value(None));
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
        let g = r.given();
        assert_eq!(given(&g, "interval"), &Raw::Value(Some("5s".into())));
        assert_eq!(given(&g, "server"), &Raw::Value(Some("https://x".into())));
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

    /// The table and argh agree: each command's `--help` lists exactly its table entries,
    /// in order, and `given()` returns them in the same order.
    #[test]
    fn the_table_is_what_argh_parses() {
        for command in COMMANDS {
            let parsed = parse(&[command]);
            let listed = hints::listed_flags(command);
            let table: Vec<String> = flag::ALL
                .iter()
                .filter(|f| f.group.of(command))
                .map(|f| f.name())
                .collect();
            assert_eq!(listed, table, "{command}");
            let given: Vec<String> = parsed
                .unwrap()
                .command
                .unwrap()
                .given()
                .iter()
                .map(|(f, _)| f.name())
                .collect();
            assert_eq!(given, table, "{command}");
        }
        for f in flag::ALL {
            assert!(
                f.kind != Kind::Switch || f.default.is_none(),
                "{}: a switch's default is off",
                f.name()
            );
        }
    }
}
