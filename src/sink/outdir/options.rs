//! What `--out-dir` is opened with: the folder, the layout, file modes, how long old
//! versions stay readable, and the template (concat). Plain data, assembled by `settings`.

use std::path::PathBuf;
use std::time::Duration;

use crate::source::{Resource, Resources};
use crate::template;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    Files,
    Concat,
    Flat,
}

impl crate::words::Words for Layout {
    const WORDS: &'static [(&'static str, Self)] = &[
        ("files", Layout::Files),
        ("concat", Layout::Concat),
        ("flat", Layout::Flat),
    ];
}

#[derive(Clone, Debug)]
pub struct Options {
    pub dir: PathBuf,
    pub layout: Layout,
    /// File name extension for `concat`.
    pub ext: String,
    pub file_modes: FileModes,
    pub old_version_ttl: Duration,
    /// What is listed: a module's kind follows from its id.
    pub kinds: Resources,
    /// `--folder-annotation` (flat), for messages.
    pub folder_annotation: Option<String>,
    /// `--module-template` and `--offer-arguments` (concat).
    pub template: Option<std::sync::Arc<template::Template>>,
}

/// The mode of written files, per kind (`--file-mode`, else 0644 and 0600 for a Secret's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileModes {
    pub configmaps: u32,
    pub secrets: u32,
}

impl FileModes {
    /// One mode for every kind.
    pub fn all(mode: u32) -> FileModes {
        FileModes {
            configmaps: mode,
            secrets: mode,
        }
    }

    pub fn of(self, kind: Resource) -> u32 {
        match kind {
            Resource::ConfigMaps => self.configmaps,
            Resource::Secrets => self.secrets,
        }
    }
}

impl Default for FileModes {
    /// A Secret's files are for the agent's user only.
    fn default() -> FileModes {
        FileModes {
            configmaps: 0o644,
            secrets: 0o600,
        }
    }
}
