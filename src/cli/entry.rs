//! The shape of the flag table: what one entry says (name, kind, command, default, the sink it
//! belongs to) and the macros that make, from each entry, both the argh field (and so
//! `--help`) and the `flag::NAME` constant that settings reads it by.
//!
//! An entry is written once, in `cli/table.rs`; nothing else spells a flag's name, variable or
//! default. `Given` is what the command line gave each of a command's flags, in table order.

/// The commands a flag belongs to: a section of the table shared by several, or one's own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Group {
    /// Every command that takes flags: the label selector, the kinds, logging.
    Common,
    /// `run`, `list`, `webhook`: what becomes a module's files (`--keys`).
    Modules,
    /// `run`, `list`: a manifests folder instead of an apiserver.
    Manifests,
    /// `run`, `list`, `serve`: the apiserver, its credentials, how it is listed.
    Apiserver,
    /// `run`, `webhook`, `serve`: `--validate`.
    Validating,
    /// `run`, `serve`: how many validations at once.
    Judging,
    /// `run`, `serve`: Events for the objects' authors.
    Reporting,
    /// `run`, `webhook`, `serve`: `--listen`.
    Listening,
    /// `run`, `serve`: `--interval`, `--jitter`.
    Polling,
    /// `webhook`, `serve`: the serving certificate.
    Tls,
    Run,
    List,
    Webhook,
    Serve,
}

/// The commands that take flags (`sidecar` takes none).
pub const COMMANDS: [&str; 4] = ["run", "list", "webhook", "serve"];

impl Group {
    /// Whether a flag of this group is a flag of `command` (one of `COMMANDS`).
    pub fn of(self, command: &str) -> bool {
        match self {
            Group::Common => matches!(command, "run" | "list" | "webhook" | "serve"),
            Group::Modules => matches!(command, "run" | "list" | "webhook"),
            Group::Manifests => matches!(command, "run" | "list"),
            Group::Apiserver => matches!(command, "run" | "list" | "serve"),
            Group::Validating => matches!(command, "run" | "webhook" | "serve"),
            Group::Judging | Group::Reporting => matches!(command, "run" | "serve"),
            Group::Listening => matches!(command, "run" | "webhook" | "serve"),
            Group::Polling => matches!(command, "run" | "serve"),
            Group::Tls => matches!(command, "webhook" | "serve"),
            Group::Run => command == "run",
            Group::List => command == "list",
            Group::Webhook => command == "webhook",
            Group::Serve => command == "serve",
        }
    }
}

/// What a flag means nothing without: given alone, it is a usage error ("only used with").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Needs {
    Nothing,
    Server,
    OutDir,
    Concat,
    Flat,
    ModuleTemplate,
    Agent,
    ReloadUrl,
    ReloadUrlOrOnChange,
    Validate,
    Rollout,
    Remotecfg,
}

impl Needs {
    /// The end of "--flag: only used with …".
    pub fn what(self) -> &'static str {
        match self {
            Needs::Nothing => "anything",
            Needs::Server => "--server",
            Needs::OutDir => "--out-dir",
            Needs::Concat => "--layout concat",
            Needs::Flat => "--layout flat",
            Needs::ModuleTemplate => "--module-template",
            Needs::Agent => "an agent command (cmpoll run [options] -- AGENT ARGS...)",
            Needs::ReloadUrl => "--reload-url",
            Needs::ReloadUrlOrOnChange => "--reload-url or --on-change",
            Needs::Validate => "--validate",
            Needs::Rollout => "--rollout",
            Needs::Remotecfg => "--remotecfg",
        }
    }
}

/// How a flag takes its value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `--flag VALUE`, once.
    Value,
    /// `--flag VALUE`, repeatable; a variable holds a comma-separated list.
    List,
    /// `--flag`; a variable holds true or false.
    Switch,
}

/// One entry of the table.
#[derive(Debug, PartialEq, Eq)]
pub struct Flag {
    /// The argh field: `out_dir` for `--out-dir`.
    pub field: &'static str,
    pub kind: Kind,
    pub group: Group,
    pub needs: Needs,
    /// The value used when neither the flag nor its variable is given, parsed as they would
    /// be (and shown in `--help`); `None` where the default is not a value (see the help).
    pub default: Option<&'static str>,
}

impl Flag {
    /// `out-dir`.
    pub fn name(&self) -> String {
        self.field.replace('_', "-")
    }

    /// `--out-dir`.
    pub fn long(&self) -> String {
        format!("--{}", self.name())
    }

    /// `CMPOLL_OUT_DIR`.
    pub fn var(&self) -> String {
        format!("CMPOLL_{}", self.field.to_ascii_uppercase())
    }
}

/// What the command line gave one flag.
#[derive(Clone, Debug, PartialEq)]
pub enum Raw {
    Value(Option<String>),
    List(Vec<String>),
    Switch(bool),
}

impl Raw {
    /// Whether the command line gave the flag at all.
    pub fn given(&self) -> bool {
        match self {
            Raw::Value(v) => v.is_some(),
            Raw::List(v) => !v.is_empty(),
            Raw::Switch(b) => *b,
        }
    }
}

/// An argh field type, and so a `Kind`.
pub trait Field {
    const KIND: Kind;
    fn raw(&self) -> Raw;
}

impl Field for Option<String> {
    const KIND: Kind = Kind::Value;
    fn raw(&self) -> Raw {
        Raw::Value(self.clone())
    }
}

impl Field for Vec<String> {
    const KIND: Kind = Kind::List;
    fn raw(&self) -> Raw {
        Raw::List(self.clone())
    }
}

impl Field for bool {
    const KIND: Kind = Kind::Switch;
    fn raw(&self) -> Raw {
        Raw::Switch(*self)
    }
}

/// A command's flags, in table order, with what the command line gave each.
pub type Given = Vec<(&'static Flag, Raw)>;

/// `needs!()` → `Needs::Nothing`; `needs!(OutDir)` → `Needs::OutDir`.
macro_rules! needs {
    () => {
        $crate::cli::entry::Needs::Nothing
    };
    ($n:ident) => {
        $crate::cli::entry::Needs::$n
    };
}

/// `default!()` → `None`; `default!("30s")` → `Some("30s")`.
macro_rules! default {
    () => {
        None
    };
    ($d:literal) => {
        Some($d)
    };
}

/// Whether two names are the same, at compile time (the table checks that each struct's
/// `uses` list names the sections in their order).
pub const fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// The table: `sections` of entries that several commands share, each with the `Group`
/// that says which commands take it (`common (Common) { … }`), then each command's struct
/// with the sections it takes, named in their order (`uses [common: yes, modules: no,
/// …]`, checked at compile time), its own entries and, after them, fields that are not
/// flags (positionals). An entry:
///
/// ```text
/// /// help text (argh's --help)
/// field: Type [argh attributes] = "default", needs Sink;
/// ```
///
/// Types are spelled as plain tokens (`Option<String>`, `Vec<String>`, `bool`), not as a
/// `ty` fragment: argh's derive reads the type's words to tell options from switches.
///
/// Makes `pub mod flag` (one `Flag` per entry, and `flag::ALL`) and each argh struct with
/// `given()`. A struct's fields are its sections' entries in section order, then its own.
macro_rules! flags {
    (
        sections $sections:tt
        $(
            $(#[$meta:meta])*
            pub struct $name:ident ($group:ident) uses $uses:tt $own:tt $extra:tt
        )*
    ) => {
        flags!(@consts $sections $($group $own)*);
        $(
            flags!(@pick [$(#[$meta])*] $name $extra $own [] $uses $sections);
        )*
    };
    // The sections a struct takes (`yes`), gathered in order; its own entries last.
    (@pick $meta:tt $name:ident $extra:tt $own:tt [$($acc:tt)*] [] {}) => {
        flags!(@struct $meta $name $extra [$($acc)* $own]);
    };
    (@pick $meta:tt $name:ident $extra:tt $own:tt [$($acc:tt)*]
        [$label:ident : $use:ident $(, $l:ident : $u:ident)*]
        { $section:ident ($g:ident) $body:tt $($rest:tt)* }
    ) => {
        const _: () = assert!(
            $crate::cli::entry::same(stringify!($label), stringify!($section)),
            concat!(stringify!($name), ": `uses` names sections in their order: ", stringify!($label), " is not ", stringify!($section))
        );
        flags!(@take $use $meta $name $extra $own [$($acc)*] $body [$($l : $u),*] { $($rest)* });
    };
    (@take yes $meta:tt $name:ident $extra:tt $own:tt [$($acc:tt)*] $body:tt $uses:tt $sections:tt) => {
        flags!(@pick $meta $name $extra $own [$($acc)* $body] $uses $sections);
    };
    (@take no $meta:tt $name:ident $extra:tt $own:tt [$($acc:tt)*] $body:tt $uses:tt $sections:tt) => {
        flags!(@pick $meta $name $extra $own [$($acc)*] $uses $sections);
    };
    (@consts { $($section:ident ($sgroup:ident) $sbody:tt)* } $($group:ident $own:tt)*) => {
        flags!(@entries $($sgroup $sbody)* $($group $own)*);
    };
    (@entries $(
        $group:ident {
            $(
                $(#[doc = $doc:literal])+
                $field:ident: $ty:ident $(<$inner:ident>)? [$($argh:tt)*] $(= $default:literal)? $(, needs $needs:ident)?;
            )*
        }
    )*) => {
        /// Every flag of every command, one `Flag` each, named as its argh field.
        #[allow(non_upper_case_globals)]
        pub mod flag {
            use $crate::cli::entry::{Field, Flag, Group};
            $($(
                pub const $field: Flag = Flag {
                    field: stringify!($field),
                    kind: <$ty $(<$inner>)? as Field>::KIND,
                    group: Group::$group,
                    needs: needs!($($needs)?),
                    default: default!($($default)?),
                };
            )*)*
            /// The whole table, in order.
            pub const ALL: &[&Flag] = &[$($(&$field,)*)*];
        }
    };
    (@struct [$($meta:tt)*] $name:ident { $($extra:tt)* } [$({
        $(
            $(#[doc = $doc:literal])+
            $field:ident: $ty:ident $(<$inner:ident>)? [$($argh:tt)*] $(= $default:literal)? $(, needs $needs:ident)?;
        )*
    })*]) => {
        #[derive(argh::FromArgs, Clone, Debug, Default, PartialEq)]
        $($meta)*
        pub struct $name {
            $($(
                $(#[doc = $doc])+
                #[argh($($argh)*)]
                pub $field: $ty $(<$inner>)?,
            )*)*
            $($extra)*
        }

        impl $name {
            /// Every flag of this command with what the command line gave it.
            pub fn given(&self) -> $crate::cli::entry::Given {
                use $crate::cli::entry::Field;
                vec![
                    $($((&flag::$field, self.$field.raw()),)*)*
                ]
            }
        }
    };
}
