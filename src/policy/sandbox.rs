//! The sandbox a command runs in (PROTOCOL 16), as data: its shape as written (a preset
//! or an object, every field optional), completed over the one in force, resolved to
//! real paths, intersected and compared. Pure: the names `$CWD`, `$HOME` and `$TMPDIR`
//! stand for what the caller hands `resolve`, and no path is looked at here. The kernel
//! side (Landlock rulesets, seccomp programs, mount namespaces) is `sys::sandbox`'s.
//!
//! Invariants:
//! - A `Partial` has passed every shape check: only the keys `write`, `read`, `exec`,
//!   `network` and `protect`, each with a value execd knows; every path absolute or
//!   starting with `$CWD`, `$HOME` or `$TMPDIR`, with no `..` (so that "within" can be
//!   read from the words of a path: a `..` would make it a question for the file
//!   system); every protect name one plain path component. Anything else is refused with
//!   the key or value named, never ignored (fail closed, unlike other request fields).
//! - A resolved `Sandbox<PathBuf>` holds absolute, normalized paths, each list sorted
//!   with no root inside another, so two equal sandboxes compare equal.
//! - `within(a, b)` holds exactly when everything `a` allows `b` allows too; the
//!   intersection of two sandboxes is within both.
//! - `write: all` is the state of a command with no sandbox (`off`), never a shape a
//!   file or a request may write.

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};

use serde_json::{json, Map, Value};

/// The most roots one list may name.
pub const MAX_ROOTS: usize = 64;
/// The longest path a root may have.
pub const MAX_PATH: usize = 4096;
/// The most protect names.
pub const MAX_PROTECT: usize = 16;

/// The keys a sandbox object may have.
pub const KEYS: [&str; 5] = ["write", "read", "exec", "network", "protect"];
/// The presets by name.
pub const PRESETS: [&str; 3] = ["workspace", "read-only", "off"];

/// What a root starts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Base {
    /// An absolute path.
    Abs,
    /// `$CWD`: the workspace holding the command's directory.
    Cwd,
    /// `$HOME`: the run-as user's home, from the passwd database.
    Home,
    /// `$TMPDIR`: the daemon's `--tmpdir`.
    Tmpdir,
}

impl Base {
    /// How a path writes it.
    pub fn name(self) -> &'static str {
        match self {
            Base::Abs => "/",
            Base::Cwd => "$CWD",
            Base::Home => "$HOME",
            Base::Tmpdir => "$TMPDIR",
        }
    }
}

/// A root as written: a base and a normalized relative rest (empty for the base itself).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Root {
    pub base: Base,
    pub rest: PathBuf,
}

impl Root {
    /// How it is written.
    pub fn text(&self) -> String {
        match self.base {
            Base::Abs => Path::new("/").join(&self.rest).display().to_string(),
            b if self.rest.as_os_str().is_empty() => b.name().to_string(),
            b => format!("{}/{}", b.name(), self.rest.display()),
        }
    }
}

/// Every path, or these.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Paths<R> {
    All,
    Only(Vec<R>),
}

/// `network`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Network {
    None,
    All,
}

impl Network {
    pub fn as_str(self) -> &'static str {
        match self {
            Network::None => "none",
            Network::All => "all",
        }
    }
}

/// A whole sandbox: roots as written (`R = Root`, a template) or resolved (`PathBuf`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sandbox<R> {
    pub write: Paths<R>,
    pub read: Paths<R>,
    pub exec: Paths<R>,
    pub network: Network,
    /// Names kept read-only in every write root, sorted.
    pub protect: Vec<String>,
}

/// A template: a sandbox as written, its names not yet resolved.
pub type Template = Sandbox<Root>;
/// A sandbox with every name resolved to a real path.
pub type Resolved = Sandbox<PathBuf>;

fn root(base: Base) -> Root {
    Root {
        base,
        rest: PathBuf::new(),
    }
}

impl Template {
    /// `off`: no sandbox.
    pub fn off() -> Template {
        Sandbox {
            write: Paths::All,
            read: Paths::All,
            exec: Paths::All,
            network: Network::All,
            protect: Vec::new(),
        }
    }

    /// `workspace`: write `$CWD` and `$TMPDIR`, read and exec all, no network, `.git`
    /// protected.
    pub fn workspace() -> Template {
        Sandbox {
            write: Paths::Only(vec![root(Base::Cwd), root(Base::Tmpdir)]),
            read: Paths::All,
            exec: Paths::All,
            network: Network::None,
            protect: vec![".git".into()],
        }
    }

    /// `read-only`: write nothing, read and exec all, no network.
    pub fn read_only() -> Template {
        Sandbox {
            write: Paths::Only(Vec::new()),
            read: Paths::All,
            exec: Paths::All,
            network: Network::None,
            protect: Vec::new(),
        }
    }

    /// A preset by name.
    pub fn preset(name: &str) -> Option<Template> {
        match name {
            "workspace" => Some(Template::workspace()),
            "read-only" => Some(Template::read_only()),
            "off" => Some(Template::off()),
            _ => None,
        }
    }

    /// Whether any root names `base`.
    pub fn names(&self, base: Base) -> bool {
        [&self.write, &self.read, &self.exec]
            .iter()
            .any(|p| match p {
                Paths::All => false,
                Paths::Only(v) => v.iter().any(|r| r.base == base),
            })
    }

    /// Every absolute root it names, as written (what `sys::sandbox` resolves at start).
    pub fn absolute_roots(&self) -> Vec<PathBuf> {
        let mut v = Vec::new();
        for p in [&self.write, &self.read, &self.exec] {
            if let Paths::Only(roots) = p {
                v.extend(
                    roots
                        .iter()
                        .filter(|r| r.base == Base::Abs)
                        .map(|r| Path::new("/").join(&r.rest)),
                );
            }
        }
        v
    }

    /// As JSON, names unresolved.
    pub fn to_json(&self) -> Value {
        shape_json(self, Root::text)
    }
}

/// A sandbox as written in a file or a request: every field optional (an omitted one
/// takes the value in force), or a preset.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Partial {
    /// The preset it names, if it is one.
    pub preset: Option<String>,
    pub write: Option<Paths<Root>>,
    pub read: Option<Paths<Root>>,
    pub exec: Option<Paths<Root>>,
    pub network: Option<Network>,
    pub protect: Option<Vec<String>>,
}

impl Partial {
    /// A preset as a partial with every field set.
    fn of_preset(name: &str, t: Template) -> Partial {
        Partial {
            preset: Some(name.to_string()),
            write: Some(t.write),
            read: Some(t.read),
            exec: Some(t.exec),
            network: Some(t.network),
            protect: Some(t.protect),
        }
    }

    /// The template it makes over `in_force`: each omitted field takes its value there.
    pub fn over(&self, in_force: &Template) -> Template {
        Sandbox {
            write: self.write.clone().unwrap_or_else(|| in_force.write.clone()),
            read: self.read.clone().unwrap_or_else(|| in_force.read.clone()),
            exec: self.exec.clone().unwrap_or_else(|| in_force.exec.clone()),
            network: self.network.unwrap_or(in_force.network),
            protect: self
                .protect
                .clone()
                .unwrap_or_else(|| in_force.protect.clone()),
        }
    }

    /// Its fields as given, the others from `in_force`, all resolved; what is omitted
    /// keeps the resolved value in force (so a request narrowing one field cannot move
    /// the others).
    pub fn resolve_over(&self, in_force: &Resolved, names: &Names) -> (Resolved, Vec<Base>) {
        let mut missing = Vec::new();
        let mut res = |given: &Option<Paths<Root>>, current: &Paths<PathBuf>| match given {
            None => current.clone(),
            Some(p) => resolve_paths(p, names, &mut missing),
        };
        let write = res(&self.write, &in_force.write);
        let read = res(&self.read, &in_force.read);
        let exec = res(&self.exec, &in_force.exec);
        let mut protect = self
            .protect
            .clone()
            .unwrap_or_else(|| in_force.protect.clone());
        protect.sort();
        protect.dedup();
        missing.sort();
        missing.dedup();
        (
            Sandbox {
                write,
                read,
                exec,
                network: self.network.unwrap_or(in_force.network),
                protect,
            },
            missing,
        )
    }

    /// Whether any root it writes names `base`.
    pub fn names(&self, base: Base) -> bool {
        [&self.write, &self.read, &self.exec]
            .iter()
            .any(|p| matches!(p, Some(Paths::Only(v)) if v.iter().any(|r| r.base == base)))
    }
}

/// What `$CWD`, `$HOME` and `$TMPDIR` stand for, and the real path of each absolute
/// root the operator named (resolved at start: symlinks followed).
#[derive(Debug, Clone, Default)]
pub struct Names<'a> {
    pub cwd: Option<&'a Path>,
    pub home: Option<&'a Path>,
    pub tmpdir: Option<&'a Path>,
    /// Operator paths -> their real paths; a path not here is taken as written.
    pub real: Option<&'a HashMap<PathBuf, PathBuf>>,
}

impl Names<'_> {
    /// The real path of an absolute path as written: itself, or, when it lies in one of
    /// the operator's paths that has another real path, that real path and its rest.
    pub fn real_of(&self, path: &Path) -> PathBuf {
        let Some(real) = self.real else {
            return path.to_path_buf();
        };
        if let Some(r) = real.get(path) {
            return r.clone();
        }
        // The longest operator path it lies in.
        let best = real
            .iter()
            .filter(|(given, _)| path.starts_with(given))
            .max_by_key(|(given, _)| given.as_os_str().len());
        match best {
            Some((given, r)) => match path.strip_prefix(given) {
                Ok(rest) if rest.as_os_str().is_empty() => r.clone(),
                Ok(rest) => r.join(rest),
                Err(_) => path.to_path_buf(),
            },
            None => path.to_path_buf(),
        }
    }
}

/// Resolves the roots of `paths`; a root whose base stands for nothing here is left
/// out, its base pushed on `missing`.
fn resolve_paths(paths: &Paths<Root>, names: &Names, missing: &mut Vec<Base>) -> Paths<PathBuf> {
    match paths {
        Paths::All => Paths::All,
        Paths::Only(roots) => {
            let mut out = Vec::with_capacity(roots.len());
            for r in roots {
                let base = match r.base {
                    Base::Abs => Some(names.real_of(&Path::new("/").join(&r.rest))),
                    Base::Cwd => names.cwd.map(|p| p.join(&r.rest)),
                    Base::Home => names.home.map(|p| p.join(&r.rest)),
                    Base::Tmpdir => names.tmpdir.map(|p| p.join(&r.rest)),
                };
                match base {
                    Some(p) => out.push(strip_trailing(p)),
                    None => missing.push(r.base),
                }
            }
            Paths::Only(minimal(out))
        }
    }
}

/// `p` without a trailing empty component (`/a/b/` -> `/a/b`); `join("")` adds one.
fn strip_trailing(p: PathBuf) -> PathBuf {
    p.components().collect()
}

/// Sorted and deduplicated. A root inside another is kept: `protect` looks for its names
/// directly in each write root (a workspace inside `$TMPDIR` keeps its `.git`).
fn minimal(mut roots: Vec<PathBuf>) -> Vec<PathBuf> {
    roots.sort();
    roots.dedup();
    roots
}

impl Template {
    /// Resolved with `names`; roots whose name stands for nothing are left out (their
    /// bases returned): a command in no workspace gets no `$CWD` root.
    pub fn resolve(&self, names: &Names) -> (Resolved, Vec<Base>) {
        let mut missing = Vec::new();
        let write = resolve_paths(&self.write, names, &mut missing);
        let read = resolve_paths(&self.read, names, &mut missing);
        let exec = resolve_paths(&self.exec, names, &mut missing);
        let mut protect = self.protect.clone();
        protect.sort();
        protect.dedup();
        missing.sort();
        missing.dedup();
        (
            Sandbox {
                write,
                read,
                exec,
                network: self.network,
                protect,
            },
            missing,
        )
    }
}

/// The roots within both.
fn paths_meet(a: &Paths<PathBuf>, b: &Paths<PathBuf>) -> Paths<PathBuf> {
    match (a, b) {
        (Paths::All, x) | (x, Paths::All) => x.clone(),
        (Paths::Only(a), Paths::Only(b)) => {
            let mut v: Vec<PathBuf> = a
                .iter()
                .filter(|x| b.iter().any(|y| x.starts_with(y)))
                .chain(b.iter().filter(|y| a.iter().any(|x| y.starts_with(x))))
                .cloned()
                .collect();
            v = minimal(v);
            Paths::Only(v)
        }
    }
}

/// The roots of `a` outside every root of `b`, as words.
fn paths_outside(a: &Paths<PathBuf>, b: &Paths<PathBuf>) -> Option<String> {
    match (a, b) {
        (_, Paths::All) => None,
        (Paths::All, Paths::Only(_)) => Some("all".into()),
        (Paths::Only(a), Paths::Only(b)) => {
            let out: Vec<String> = a
                .iter()
                .filter(|x| !b.iter().any(|y| x.starts_with(y)))
                .map(|x| x.display().to_string())
                .collect();
            (!out.is_empty()).then(|| out.join(" "))
        }
    }
}

impl Resolved {
    /// `off`, resolved (it names nothing).
    pub fn off() -> Resolved {
        Sandbox {
            write: Paths::All,
            read: Paths::All,
            exec: Paths::All,
            network: Network::All,
            protect: Vec::new(),
        }
    }

    /// No sandbox at all: nothing to apply.
    pub fn is_off(&self) -> bool {
        *self == Resolved::off()
    }

    /// Whether everything `self` allows `other` allows too.
    pub fn within(&self, other: &Resolved) -> bool {
        self.outside(other).is_empty()
    }

    /// What `self` allows that `other` does not, in words ("write /etc", "network all",
    /// "protect without .git"): empty when `self` is within `other`.
    pub fn outside(&self, other: &Resolved) -> Vec<String> {
        let mut why = Vec::new();
        for (field, a, b) in [
            ("write", &self.write, &other.write),
            ("read", &self.read, &other.read),
            ("exec", &self.exec, &other.exec),
        ] {
            if let Some(o) = paths_outside(a, b) {
                why.push(format!("{field} {o}"));
            }
        }
        if self.network == Network::All && other.network == Network::None {
            why.push("network all".into());
        }
        // What protects nothing writable is not missed: a sandbox that writes nothing
        // needs no protected names.
        let writes = self.write != Paths::Only(Vec::new());
        let dropped: Vec<&str> = other
            .protect
            .iter()
            .filter(|n| writes && !self.protect.contains(n))
            .map(String::as_str)
            .collect();
        if !dropped.is_empty() {
            why.push(format!("protect without {}", dropped.join(" ")));
        }
        why
    }

    /// The intersection: roots within both, `network: none` if either says so, the union
    /// of `protect`.
    pub fn meet(&self, other: &Resolved) -> Resolved {
        let mut protect: Vec<String> = self.protect.iter().chain(&other.protect).cloned().collect();
        protect.sort();
        protect.dedup();
        Sandbox {
            write: paths_meet(&self.write, &other.write),
            read: paths_meet(&self.read, &other.read),
            exec: paths_meet(&self.exec, &other.exec),
            network: if self.network == Network::None || other.network == Network::None {
                Network::None
            } else {
                Network::All
            },
            protect,
        }
    }

    /// As JSON (`write` is `"all"` only for a command with no sandbox).
    pub fn to_json(&self) -> Value {
        shape_json(self, |p| p.display().to_string())
    }

    /// Reads back what `to_json` wrote (an upgrade carries it); `None` if it is not one.
    pub fn from_json(v: &Value) -> Option<Resolved> {
        let o = v.as_object()?;
        let paths = |k: &str| -> Option<Paths<PathBuf>> {
            match o.get(k)? {
                Value::String(s) if s == "all" => Some(Paths::All),
                Value::Array(a) => a
                    .iter()
                    .map(|p| p.as_str().map(PathBuf::from))
                    .collect::<Option<Vec<_>>>()
                    .map(Paths::Only),
                _ => None,
            }
        };
        Some(Sandbox {
            write: paths("write")?,
            read: paths("read")?,
            exec: paths("exec")?,
            network: match o.get("network")?.as_str()? {
                "none" => Network::None,
                "all" => Network::All,
                _ => return None,
            },
            protect: o
                .get("protect")?
                .as_array()?
                .iter()
                .map(|n| n.as_str().map(String::from))
                .collect::<Option<Vec<_>>>()?,
        })
    }
}

fn shape_json<R>(s: &Sandbox<R>, text: impl Fn(&R) -> String) -> Value {
    let paths = |p: &Paths<R>| match p {
        Paths::All => Value::from("all"),
        Paths::Only(v) => Value::from(v.iter().map(&text).collect::<Vec<_>>()),
    };
    json!({
        "write": paths(&s.write),
        "read": paths(&s.read),
        "exec": paths(&s.exec),
        "network": s.network.as_str(),
        "protect": s.protect,
    })
}

/// The most bytes a character takes in a JSON string: `\uXXXX` for a control character,
/// two for a quote or a backslash, its UTF-8 otherwise (U+FFFD for a path's bad bytes).
fn json_char_len(c: char) -> usize {
    match c {
        '"' | '\\' => 2,
        c if (c as u32) < 0x20 => 6,
        c => c.len_utf8(),
    }
}

/// A shape error: the key (or `""` for the whole value) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShapeError {
    pub key: String,
    pub reason: String,
}

impl ShapeError {
    fn new(key: &str, reason: impl Into<String>) -> ShapeError {
        ShapeError {
            key: key.to_string(),
            reason: reason.into(),
        }
    }
}

impl std::fmt::Display for ShapeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.key.is_empty() {
            f.write_str(&self.reason)
        } else {
            write!(f, "{:?}: {}", self.key, self.reason)
        }
    }
}

/// Parses a sandbox as a file or a request writes it: a preset name, or an object of
/// the keys in `KEYS`. Anything execd does not know is an error naming it.
pub fn parse(value: &Value) -> Result<Partial, ShapeError> {
    match value {
        Value::String(name) => match Template::preset(name) {
            Some(t) => Ok(Partial::of_preset(name, t)),
            None => Err(ShapeError::new(
                "",
                format!("unknown preset {name:?} (known: {})", PRESETS.join(", ")),
            )),
        },
        Value::Object(o) => parse_object(o),
        other => Err(ShapeError::new(
            "",
            format!("must be a preset name or an object, not {}", kind(other)),
        )),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn parse_object(o: &Map<String, Value>) -> Result<Partial, ShapeError> {
    if let Some(k) = o.keys().find(|k| !KEYS.contains(&k.as_str())) {
        return Err(ShapeError::new(
            k,
            format!("unknown key (known: {})", KEYS.join(", ")),
        ));
    }
    let mut p = Partial::default();
    for (k, v) in o {
        // `null` is "absent", as for every other field of a request.
        if v.is_null() {
            continue;
        }
        match k.as_str() {
            "write" => match v {
                Value::Array(a) => p.write = Some(Paths::Only(parse_roots(k, a)?)),
                _ => return Err(ShapeError::new(k, "must be an array of paths")),
            },
            "read" | "exec" => {
                let paths = match v {
                    Value::String(s) if s == "all" => Paths::All,
                    Value::Array(a) => Paths::Only(parse_roots(k, a)?),
                    _ => return Err(ShapeError::new(k, "must be \"all\" or an array of paths")),
                };
                if k == "read" {
                    p.read = Some(paths);
                } else {
                    p.exec = Some(paths);
                }
            }
            "network" => {
                p.network = Some(match v.as_str() {
                    Some("none") => Network::None,
                    Some("all") => Network::All,
                    _ => return Err(ShapeError::new(k, "must be \"none\" or \"all\"")),
                })
            }
            "protect" => {
                let Value::Array(a) = v else {
                    return Err(ShapeError::new(k, "must be an array of names"));
                };
                if a.len() > MAX_PROTECT {
                    return Err(ShapeError::new(k, format!("at most {MAX_PROTECT} names")));
                }
                let mut names = Vec::with_capacity(a.len());
                for n in a {
                    let Some(name) = n.as_str() else {
                        return Err(ShapeError::new(k, "names must be strings"));
                    };
                    if name.is_empty()
                        || name == "."
                        || name == ".."
                        || name.contains('/')
                        || name.contains('\0')
                    {
                        return Err(ShapeError::new(
                            k,
                            format!("{name:?} is not one plain file name"),
                        ));
                    }
                    names.push(name.to_string());
                }
                names.sort();
                names.dedup();
                p.protect = Some(names);
            }
            _ => unreachable!("keys were checked above"),
        }
    }
    Ok(p)
}

fn parse_roots(key: &str, a: &[Value]) -> Result<Vec<Root>, ShapeError> {
    if a.len() > MAX_ROOTS {
        return Err(ShapeError::new(key, format!("at most {MAX_ROOTS} paths")));
    }
    a.iter()
        .map(|v| match v.as_str() {
            Some(s) => parse_root(s).map_err(|why| ShapeError::new(key, why)),
            None => Err(ShapeError::new(key, "paths must be strings")),
        })
        .collect()
}

/// One root: absolute, or `$CWD`, `$HOME`, `$TMPDIR` alone or followed by `/rest`; no
/// `..`; `.` and repeated slashes dropped.
pub fn parse_root(s: &str) -> Result<Root, String> {
    if s.len() > MAX_PATH {
        return Err(format!("a path of at most {MAX_PATH} bytes"));
    }
    if s.contains('\0') {
        return Err(format!("{s:?} holds NUL"));
    }
    let (base, rest) = if let Some(r) = s.strip_prefix('/') {
        (Base::Abs, r)
    } else {
        let Some((name, rest)) = [Base::Cwd, Base::Home, Base::Tmpdir]
            .iter()
            .find_map(|b| s.strip_prefix(b.name()).map(|r| (*b, r)))
        else {
            return Err(format!(
                "{s:?} is neither absolute nor starts with $CWD, $HOME or $TMPDIR"
            ));
        };
        if !(rest.is_empty() || rest.starts_with('/')) {
            return Err(format!("{s:?}: a name is followed by / or nothing"));
        }
        (name, rest)
    };
    let mut clean = PathBuf::new();
    for c in Path::new(rest).components() {
        match c {
            Component::Normal(w) => clean.push(w),
            Component::CurDir | Component::RootDir => {}
            Component::ParentDir => return Err(format!("{s:?} holds \"..\"")),
            Component::Prefix(_) => return Err(format!("{s:?} is not a Unix path")),
        }
    }
    Ok(Root { base, rest: clean })
}

/// The sandbox a command was given, as the core carries it: resolved, with what `$CWD`
/// stood for, and how the child is to treat the roots a request named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Given {
    /// The preset it is, or `custom`.
    pub name: String,
    pub sandbox: Resolved,
    /// The workspace `$CWD` stood for (none: the command's directory is in none).
    pub cwd_root: Option<PathBuf>,
    /// The child checks that the directory it entered really lies in `cwd_root` (the
    /// workspace was chosen from the directory's words, never by looking at it here).
    pub verify_cwd: bool,
    /// An approver let it run wider than in force: the roots it names that lie in no
    /// root execd trusts are opened as named, not beneath one.
    pub escalated: bool,
}

impl Given {
    /// No sandbox.
    pub fn off() -> Given {
        Given {
            name: "off".into(),
            sandbox: Resolved::off(),
            cwd_root: None,
            verify_cwd: false,
            escalated: false,
        }
    }

    pub fn is_off(&self) -> bool {
        self.sandbox.is_off()
    }

    /// What a command object, an approver and the audit show.
    pub fn to_json(&self) -> Value {
        let mut v = self.sandbox.to_json();
        v["name"] = self.name.clone().into();
        v["cwd"] = self
            .cwd_root
            .as_ref()
            .map(|p| Value::from(p.display().to_string()))
            .unwrap_or(Value::Null);
        if self.escalated {
            v["escalated"] = true.into();
        }
        v
    }

    /// At least the length of `to_json` as text, counted without building it: what a
    /// command's record holds for its sandbox (counted per spawn, so no allocation).
    pub fn json_len_bound(&self) -> usize {
        /// Keys, punctuation, `network`, `escalated`, `null`.
        const FIXED: usize = 128;
        let text = |s: &str| 3 + s.chars().map(json_char_len).sum::<usize>();
        let path = |p: &Path| text(&p.to_string_lossy());
        let paths = |p: &Paths<PathBuf>| match p {
            Paths::All => 5,
            Paths::Only(v) => 2 + v.iter().map(|p| path(p)).sum::<usize>(),
        };
        let s = &self.sandbox;
        FIXED
            + text(&self.name)
            + self.cwd_root.as_deref().map_or(0, path)
            + paths(&s.write)
            + paths(&s.read)
            + paths(&s.exec)
            + s.protect.iter().map(|p| text(p)).sum::<usize>()
    }

    /// Reads back what `to_json` wrote (an upgrade carries it).
    pub fn from_json(v: &Value) -> Option<Given> {
        Some(Given {
            name: v.get("name")?.as_str()?.to_string(),
            sandbox: Resolved::from_json(v)?,
            cwd_root: match v.get("cwd") {
                Some(Value::String(s)) => Some(PathBuf::from(s)),
                _ => None,
            },
            verify_cwd: false,
            escalated: v.get("escalated").and_then(Value::as_bool).unwrap_or(false),
        })
    }

    /// One line for people: `workspace (cwd /w)`, `custom: write /w/a; network none`.
    pub fn brief(&self) -> String {
        if self.is_off() {
            return "off".into();
        }
        let s = &self.sandbox;
        let paths = |p: &Paths<PathBuf>| match p {
            Paths::All => "all".to_string(),
            Paths::Only(v) if v.is_empty() => "nothing".to_string(),
            Paths::Only(v) => v
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(" "),
        };
        let mut t = format!(
            "{}: write {}; read {}; exec {}; network {}",
            self.name,
            paths(&s.write),
            paths(&s.read),
            paths(&s.exec),
            s.network.as_str()
        );
        if !s.protect.is_empty() {
            t.push_str(&format!("; protect {}", s.protect.join(" ")));
        }
        t
    }
}

/// What the kernel offers a sandbox, probed once at start (`sys::sandbox::probe`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Kernel {
    /// The Landlock ABI used: the kernel's, at most `--landlock-abi-max` (and the newest
    /// execd knows); 0 without Landlock.
    pub abi: u8,
    /// The kernel's own.
    pub kernel_abi: u8,
    /// Why no mount namespace can be made for `protect`, if none can.
    pub no_namespace: Option<String>,
    /// The daemon holds `CAP_SETPCAP`: commands' bounding sets can be emptied.
    pub setpcap: bool,
}

impl Kernel {
    /// Why `g` cannot be given here, if it cannot: the `sandbox unavailable: ...` reason.
    /// Fail closed: no Landlock, or an ABI below 3 for a sandbox that restricts writes
    /// (truncation is mediated from 3), or `protect` where no mount namespace can be made.
    pub fn unavailable(&self, g: &Given) -> Option<String> {
        if g.is_off() {
            return None;
        }
        let s = &g.sandbox;
        if self.abi == 0 {
            return Some(if self.kernel_abi == 0 {
                "the kernel offers no Landlock (Linux 5.13+ with landlock in lsm=)".into()
            } else {
                "--landlock-abi-max 0 leaves no Landlock".into()
            });
        }
        if s.write != Paths::All && self.abi < 3 {
            return Some(format!(
                "restricting writes needs Landlock ABI 3 or later (truncation is mediated \
                 from 3), and {} is in use{}",
                self.abi,
                if self.kernel_abi > self.abi {
                    format!(
                        " (--landlock-abi-max; the kernel offers {})",
                        self.kernel_abi
                    )
                } else {
                    String::new()
                }
            ));
        }
        if needs_namespace(g) {
            if let Some(why) = &self.no_namespace {
                return Some(format!("protect needs a mount namespace, and {why}"));
            }
        }
        None
    }

    /// Signals are scoped by Landlock (ABI 6+); below it a seccomp rule guards the daemon.
    pub fn signals_scoped(&self) -> bool {
        self.abi >= 6
    }

    /// What `initialize` says of it (`_meta.execd.sandbox`, with the workspaces added).
    pub fn to_json(&self) -> Value {
        json!({
            "landlockAbi": self.abi,
            "kernelLandlockAbi": self.kernel_abi,
            "network": self.abi >= 4,
            "signals": self.signals_scoped(),
            "protect": self.no_namespace.is_none(),
            "protectUnavailable": self.no_namespace,
        })
    }
}

/// Whether `g` runs in a mount namespace: it protects names and may write somewhere.
pub fn needs_namespace(g: &Given) -> bool {
    !g.sandbox.protect.is_empty() && g.sandbox.write != Paths::Only(Vec::new())
}

/// The workspace a directory lies in, read from its words: the longest workspace that is
/// the directory or holds it, by the path given (`given`) or its real path. Nothing is
/// looked at; the child checks the answer on the directory it entered.
pub fn workspace_of<'a>(dir: &Path, workspaces: &'a [(PathBuf, PathBuf)]) -> Option<&'a Path> {
    let dir: PathBuf = dir.components().collect();
    workspaces
        .iter()
        .filter(|(given, real)| dir.starts_with(given) || dir.starts_with(real))
        .max_by_key(|(given, real)| {
            if dir.starts_with(real) {
                real.as_os_str().len()
            } else {
                given.as_os_str().len()
            }
        })
        .map(|(_, real)| real.as_path())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> PathBuf {
        PathBuf::from(s)
    }

    fn names<'a>(cwd: Option<&'a Path>) -> Names<'a> {
        Names {
            cwd,
            home: Some(Path::new("/home/u")),
            tmpdir: Some(Path::new("/tmp")),
            real: None,
        }
    }

    fn only(v: &[&str]) -> Paths<PathBuf> {
        Paths::Only(v.iter().map(|s| p(s)).collect())
    }

    #[test]
    fn presets_resolve_with_the_workspace_as_cwd() {
        let w = p("/w");
        let (r, missing) = Template::workspace().resolve(&names(Some(&w)));
        assert!(missing.is_empty());
        assert_eq!(r.write, only(&["/tmp", "/w"]));
        assert_eq!(r.network, Network::None);
        assert_eq!(r.protect, vec![".git".to_string()]);
        // In no workspace there is no $CWD root, and it says so.
        let (r, missing) = Template::workspace().resolve(&names(None));
        assert_eq!(r.write, only(&["/tmp"]));
        assert_eq!(missing, vec![Base::Cwd]);
        assert!(Template::off().resolve(&names(None)).0.is_off());
    }

    #[test]
    fn unknown_keys_values_and_presets_are_named() {
        let e = parse(&json!({"write": [], "writ": []})).unwrap_err();
        assert_eq!(e.key, "writ");
        let e = parse(&json!({"network": "some"})).unwrap_err();
        assert_eq!(e.key, "network");
        let e = parse(&json!({"write": "all"})).unwrap_err();
        assert_eq!(e.key, "write");
        let e = parse(&json!({"read": ["relative"]})).unwrap_err();
        assert_eq!(e.key, "read");
        let e = parse(&json!({"write": ["$CWD/../x"]})).unwrap_err();
        assert!(e.reason.contains(".."), "{e}");
        let e = parse(&json!({"write": ["$CWDx"]})).unwrap_err();
        assert_eq!(e.key, "write");
        let e = parse(&json!({"protect": ["a/b"]})).unwrap_err();
        assert_eq!(e.key, "protect");
        let e = parse(&json!("sandboxed")).unwrap_err();
        assert!(e.reason.contains("workspace"), "{e}");
        assert!(parse(&json!(3)).is_err());
        // Known keys and values parse; `null` is absent.
        let ok = parse(&json!({"write": ["$CWD/./b//c", "/x/"], "read": "all",
                               "network": "none", "protect": [".git"], "exec": null}))
        .unwrap();
        assert_eq!(
            ok.write,
            Some(Paths::Only(vec![
                Root {
                    base: Base::Cwd,
                    rest: p("b/c")
                },
                Root {
                    base: Base::Abs,
                    rest: p("x")
                }
            ]))
        );
        assert_eq!(ok.exec, None);
    }

    #[test]
    fn intersection_keeps_roots_within_both_and_the_stricter_rest() {
        let a = Sandbox {
            write: only(&["/w", "/tmp"]),
            read: Paths::All,
            exec: Paths::All,
            network: Network::All,
            protect: vec![".git".into()],
        };
        let b = Sandbox {
            write: only(&["/w/sub", "/other"]),
            read: only(&["/usr"]),
            exec: Paths::All,
            network: Network::None,
            protect: vec![".hg".into()],
        };
        let m = a.meet(&b);
        assert_eq!(m.write, only(&["/w/sub"]));
        assert_eq!(m.read, only(&["/usr"]));
        assert_eq!(m.network, Network::None);
        assert_eq!(m.protect, vec![".git".to_string(), ".hg".to_string()]);
        assert!(m.within(&a) && m.within(&b));
        assert!(!a.within(&b));
        let why = a.outside(&b);
        assert!(why.contains(&"write /w /tmp".to_string()), "{why:?}");
        assert!(why.contains(&"read all".to_string()), "{why:?}");
        assert!(why.contains(&"network all".to_string()), "{why:?}");
        assert!(why.contains(&"protect without .hg".to_string()), "{why:?}");
        // A root is within another only by whole components.
        let c = Sandbox {
            write: only(&["/wx"]),
            ..b.clone()
        };
        assert!(!c.within(&Sandbox {
            write: only(&["/w"]),
            ..b.clone()
        }));
    }

    #[test]
    fn a_partial_narrows_only_the_fields_it_names() {
        let w = p("/w");
        let n = names(Some(&w));
        let (in_force, _) = Template::workspace().resolve(&n);
        let asked = parse(&json!({"write": ["$CWD/src"]})).unwrap();
        let (r, missing) = asked.resolve_over(&in_force, &n);
        assert!(missing.is_empty());
        assert_eq!(r.write, only(&["/w/src"]));
        assert_eq!(r.network, Network::None);
        assert!(r.within(&in_force));
        // read-only is within workspace: protecting names matters only where it writes.
        let (ro, _) = Template::read_only().resolve(&n);
        assert!(ro.within(&in_force), "{:?}", ro.outside(&in_force));
        let wider = parse(&json!({"network": "all"})).unwrap();
        let (r, _) = wider.resolve_over(&in_force, &n);
        assert_eq!(r.outside(&in_force), vec!["network all".to_string()]);
        // Over a template: omitted fields come from the one in force.
        let t = parse(&json!({"network": "all"}))
            .unwrap()
            .over(&Template::workspace());
        assert_eq!(t.write, Template::workspace().write);
        assert_eq!(t.network, Network::All);
    }

    #[test]
    fn operator_paths_resolve_to_their_real_paths() {
        let mut real = HashMap::new();
        real.insert(p("/home/u/proj"), p("/data/u/proj"));
        let n = Names {
            real: Some(&real),
            ..names(None)
        };
        assert_eq!(n.real_of(Path::new("/home/u/proj")), p("/data/u/proj"));
        assert_eq!(n.real_of(Path::new("/home/u/proj/a")), p("/data/u/proj/a"));
        assert_eq!(n.real_of(Path::new("/home/u/projx")), p("/home/u/projx"));
    }

    #[test]
    fn a_directory_picks_the_longest_workspace_by_its_words() {
        let ws = vec![
            (p("/w"), p("/w")),
            (p("/w/inner"), p("/w/inner")),
            (p("/link"), p("/real")),
        ];
        assert_eq!(workspace_of(Path::new("/w/a"), &ws), Some(Path::new("/w")));
        assert_eq!(
            workspace_of(Path::new("/w/inner/./b/"), &ws),
            Some(Path::new("/w/inner"))
        );
        assert_eq!(
            workspace_of(Path::new("/link/x"), &ws),
            Some(Path::new("/real"))
        );
        assert_eq!(workspace_of(Path::new("/wx"), &ws), None);
        assert_eq!(workspace_of(Path::new("/"), &ws), None);
    }

    #[test]
    fn given_sandboxes_round_trip_through_json() {
        let w = p("/w");
        let (sandbox, _) = Template::workspace().resolve(&names(Some(&w)));
        let g = Given {
            name: "workspace".into(),
            sandbox,
            cwd_root: Some(w.clone()),
            verify_cwd: false,
            escalated: true,
        };
        assert_eq!(Given::from_json(&g.to_json()), Some(g.clone()));
        assert_eq!(
            Given::from_json(&Given::off().to_json()),
            Some(Given::off())
        );
        assert!(
            g.brief().starts_with("workspace: write /tmp /w"),
            "{}",
            g.brief()
        );
    }

    #[test]
    fn the_counted_json_length_bounds_the_json() {
        let odd = p("/w/\"quoted\\\u{1}\u{7f}é\u{200b}");
        let (sandbox, _) = Template::workspace().resolve(&names(Some(&odd)));
        let mut gs = vec![Given::off()];
        for escalated in [false, true] {
            gs.push(Given {
                name: "custom \"x\"".into(),
                sandbox: sandbox.clone(),
                cwd_root: Some(odd.clone()),
                verify_cwd: false,
                escalated,
            });
        }
        let mut many = gs[1].clone();
        many.sandbox.read = only(&["/a", "/b\n", "/c"]);
        many.sandbox.protect = vec![".git".into(), "\t".into()];
        gs.push(many);
        for g in gs {
            let len = g.to_json().to_string().len();
            assert!(
                len <= g.json_len_bound(),
                "{len} > {}: {g:?}",
                g.json_len_bound()
            );
            // And not wildly more.
            assert!(g.json_len_bound() <= len + 256, "{len}: {g:?}");
        }
    }
}
