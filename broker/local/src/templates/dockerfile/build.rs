//! The build engine: stages in dependency order, each instruction a step, a step found in
//! the cache does no work; the store side of a step (its image) and the rollback of a
//! cancelled build.

use super::super::{
    build as layer_build, dockerfile::STEP_SOURCE, hex, io_err, layer_reader, registry, too_big,
    unpack, BlobWriter, HashWriter, Image, ImageConfig, Store,
};
use super::context::{self, CopyError, Dest, Layer, Meta, Source};
use super::parse::{self, Cmd, Instr, Kind};
use super::{cache, Request, RunOutcome, RunStep, Runner};
use abx_protocol::{AbxError, ErrorCode};
use sha2::Digest;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::Path;
use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;

/// The largest Dockerfile read.
const MAX_DOCKERFILE: u64 = 1 << 20;
/// Output lines of a failed `RUN` quoted in its error.
const LAST_LINES: usize = 10;

/// One progress event.
#[derive(Clone, Debug)]
pub struct Event {
    /// Steps done.
    pub done: u64,
    /// Steps in all.
    pub total: u64,
    /// `[2/5] RUN make`.
    pub step: String,
    /// An output or status line.
    pub line: Option<String>,
    /// The step was a cache hit.
    pub cached: Option<bool>,
}

/// Where progress goes.
pub type Progress<'a> = &'a (dyn Fn(Event) + Send + Sync);

struct Stage {
    name: Option<String>,
    from: String,
    from_line: usize,
    instrs: Vec<Instr>,
}

/// Where a stage is: its image so far, config, cache chain.
#[derive(Clone)]
struct State {
    fs: Option<Image>,
    config: ImageConfig,
    chain: String,
    shell: Vec<String>,
    args: BTreeMap<String, String>,
    base: Option<String>,
}

/// What a build made, removed again unless it is kept (a cancelled build leaves nothing).
struct Txn<'a> {
    store: &'a Store,
    images: Vec<String>,
    keys: Vec<String>,
    keep: bool,
}

impl Drop for Txn<'_> {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        for k in &self.keys {
            self.store.cache_forget(k);
        }
        for d in &self.images {
            if let Some(dir) = self.store.image_dir(d) {
                let _ = std::fs::remove_dir_all(&dir);
            }
        }
        if !self.images.is_empty() {
            self.store.gc_blobs();
        }
    }
}

fn invalid(line: usize, detail: impl Into<String>) -> AbxError {
    AbxError::new(
        ErrorCode::DockerfileInvalid,
        &[("line", &line.to_string()), ("detail", &detail.into())],
    )
}

fn cancelled() -> AbxError {
    AbxError::new(ErrorCode::RequestCancelled, &[])
}

fn copy_err(e: CopyError, line: usize, store: &Store, req: &Request) -> AbxError {
    match e {
        CopyError::Escapes(p, why) => AbxError::new(
            ErrorCode::BuildContextRefused,
            &[("path", &p), ("reason", &format!("{why} (Dockerfile line {line})"))],
        ),
        CopyError::Missing(p, why) => AbxError::new(
            ErrorCode::LocalFileError,
            &[("path", &p), ("detail", &format!("{why} (COPY/ADD at Dockerfile line {line}, context {})", req.context.display()))],
        )
        .with_suggestion("Name a file or directory under the build context that .dockerignore does not exclude."),
        CopyError::TooBig(what) => AbxError::new(
            ErrorCode::BuildContextRefused,
            &[
                ("path", &req.context.display().to_string()),
                (
                    "reason",
                    &format!(
                        "the files COPY and ADD take (archives unpacked) go over the cap on {what} (at most {} bytes and {} entries in a build: [local] template_max_bytes and template_max_entries; Dockerfile line {line})",
                        store.limits.max_bytes, store.limits.max_entries
                    ),
                ),
            ],
        ),
        CopyError::BadArchive(p, why) => AbxError::new(
            ErrorCode::LocalFileError,
            &[("path", &p), ("detail", &format!("ADD at Dockerfile line {line}: {why}"))],
        ),
        CopyError::Io(e) => io_err(&format!("COPY at Dockerfile line {line}"), e),
    }
}

/// Split the instructions into stages; the ARGs before the first FROM.
fn stages(instrs: Vec<Instr>) -> Result<(Vec<Instr>, Vec<Stage>), AbxError> {
    let mut global = Vec::new();
    let mut out: Vec<Stage> = Vec::new();
    for i in instrs {
        match (&i.kind, out.last_mut()) {
            (Kind::From { image, alias }, _) => out.push(Stage {
                name: alias.clone(),
                from: image.clone(),
                from_line: i.line,
                instrs: Vec::new(),
            }),
            (Kind::Arg(_), None) => global.push(i),
            (_, None) => {
                return Err(invalid(
                    i.line,
                    "the first instruction must be FROM (only ARG may come before it)",
                ))
            }
            (_, Some(s)) => s.instrs.push(i),
        }
    }
    if out.is_empty() {
        return Err(invalid(1, "no FROM: a Dockerfile needs at least one stage"));
    }
    Ok((global, out))
}

/// The stage a reference names (a name, else an index), not `me`.
fn stage_ref(stages: &[Stage], r: &str, me: usize) -> Option<usize> {
    let r = r.to_ascii_lowercase();
    if let Some(i) = stages
        .iter()
        .position(|s| s.name.as_deref() == Some(r.as_str()))
    {
        return (i != me).then_some(i);
    }
    r.parse::<usize>()
        .ok()
        .filter(|&i| i < stages.len() && i != me)
}

/// Build `req` (the caller holds the store's lock).
pub async fn build(
    store: &Arc<Store>,
    runner: &dyn Runner,
    req: &Request,
    progress: Progress<'_>,
    cancel: &CancellationToken,
) -> Result<Image, AbxError> {
    let ctx = req.context.clone();
    let df = req.dockerfile.clone();
    let text = tokio::task::spawn_blocking(move || -> Result<Vec<u8>, AbxError> {
        let src = Source::context(&ctx).map_err(|e| {
            AbxError::new(
                ErrorCode::LocalFileError,
                &[
                    ("path", &ctx.display().to_string()),
                    ("detail", &format!("the build context: {e}")),
                ],
            )
        })?;
        src.read_small(&df, MAX_DOCKERFILE).map_err(|e| match e {
            CopyError::Escapes(p, why) => AbxError::new(
                ErrorCode::BuildContextRefused,
                &[("path", &p), ("reason", &why)],
            ),
            CopyError::Missing(p, why) => AbxError::new(
                ErrorCode::LocalFileError,
                &[("path", &p), ("detail", &format!("the Dockerfile: {why}"))],
            ),
            e => AbxError::internal(format!("reading the Dockerfile: {e:?}")),
        })
    })
    .await
    .map_err(AbxError::internal)??;
    let text = String::from_utf8(text).map_err(|_| invalid(1, "the Dockerfile is not UTF-8"))?;
    let escape = if text
        .lines()
        .take_while(|l| l.trim_start().starts_with('#'))
        .any(|l| l.replace(' ', "").eq_ignore_ascii_case("#escape=`"))
    {
        '`'
    } else {
        '\\'
    };
    let instrs = parse::parse(&text).map_err(|e| invalid(e.line, e.detail))?;
    let (global, stages) = stages(instrs)?;
    // Global ARGs: the FROM lines' variables.
    let mut gargs: BTreeMap<String, String> = BTreeMap::new();
    for i in &global {
        if let Kind::Arg(v) = &i.kind {
            for (k, d) in v {
                let val = match (req.build_args.get(k), d) {
                    (Some(v), _) => v.clone(),
                    (None, Some(d)) => {
                        parse::expand(d, &gargs, escape).map_err(|e| invalid(i.line, e))?
                    }
                    (None, None) => String::new(),
                };
                gargs.insert(k.clone(), val);
            }
        }
    }
    let froms: Vec<String> = stages
        .iter()
        .map(|s| parse::expand(&s.from, &gargs, escape).map_err(|e| invalid(s.from_line, e)))
        .collect::<Result<_, _>>()?;
    // Dependencies, in order; a cycle is refused.
    let mut deps: Vec<Vec<usize>> = Vec::new();
    for (n, s) in stages.iter().enumerate() {
        let mut d = Vec::new();
        if let Some(i) = stage_ref(&stages, &froms[n], n) {
            d.push(i);
        }
        for i in &s.instrs {
            if let Kind::Copy { from: Some(f), .. } = &i.kind {
                if let Some(k) = stage_ref(&stages, f, n) {
                    d.push(k);
                }
            }
        }
        deps.push(d);
    }
    let target = match &req.target {
        Some(t) => stages
            .iter()
            .position(|s| s.name.as_deref() == Some(t.to_ascii_lowercase().as_str()))
            .ok_or_else(|| invalid(1, format!("no stage named {t:?} (target)")))?,
        None => stages.len() - 1,
    };
    let mut order = Vec::new();
    let mut mark = vec![0u8; stages.len()];
    fn visit(
        n: usize,
        deps: &[Vec<usize>],
        mark: &mut [u8],
        order: &mut Vec<usize>,
        stages: &[Stage],
    ) -> Result<(), AbxError> {
        match mark[n] {
            2 => return Ok(()),
            1 => {
                let name = stages[n].name.clone().unwrap_or_else(|| n.to_string());
                return Err(invalid(
                    stages[n].from_line,
                    format!("stage {name:?} depends on itself through FROM or COPY --from (a cycle between stages)"),
                ));
            }
            _ => {}
        }
        mark[n] = 1;
        for &d in &deps[n] {
            visit(d, deps, mark, order, stages)?;
        }
        mark[n] = 2;
        order.push(n);
        Ok(())
    }
    visit(target, &deps, &mut mark, &mut order, &stages)?;
    let total: u64 = order
        .iter()
        .map(|&n| 1 + stages[n].instrs.len() as u64)
        .sum();
    let mut txn = Txn {
        store,
        images: Vec::new(),
        keys: Vec::new(),
        keep: false,
    };
    let res = run_stages(
        store, runner, req, progress, cancel, &stages, &froms, &order, &gargs, escape, total,
        &mut txn,
    )
    .await;
    match res {
        Ok(img) => {
            txn.keep = true;
            Ok(img)
        }
        Err(e) => {
            // A failed step keeps the steps before it (the next build starts there); a
            // cancelled build keeps nothing.
            txn.keep = e.code != ErrorCode::RequestCancelled;
            Err(e)
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn run_stages(
    store: &Arc<Store>,
    runner: &dyn Runner,
    req: &Request,
    progress: Progress<'_>,
    cancel: &CancellationToken,
    stages: &[Stage],
    froms: &[String],
    order: &[usize],
    gargs: &BTreeMap<String, String>,
    escape: char,
    total: u64,
    txn: &mut Txn<'_>,
) -> Result<Image, AbxError> {
    let mut done = 0u64;
    let mut results: HashMap<usize, State> = HashMap::new();
    let mut budget = store.limits.budget();
    let ev = |done: u64, step: &str, line: Option<String>, cached: Option<bool>| {
        progress(Event {
            done,
            total,
            step: step.to_owned(),
            line,
            cached,
        })
    };
    for &n in order {
        let stage = &stages[n];
        if cancel.is_cancelled() {
            return Err(cancelled());
        }
        done += 1;
        let from = &froms[n];
        let step = format!(
            "[{done}/{total}] FROM {from}{}",
            stage
                .name
                .as_ref()
                .map(|a| format!(" AS {a}"))
                .unwrap_or_default()
        );
        let mut st = if let Some(i) = stage_ref(stages, from, n) {
            let mut s = results
                .get(&i)
                .cloned()
                .ok_or_else(|| AbxError::internal("stage order"))?;
            s.args = BTreeMap::new();
            s
        } else if from.eq_ignore_ascii_case("scratch") {
            State {
                fs: None,
                config: ImageConfig::default(),
                chain: cache::key(&[b"FROM scratch"]),
                shell: vec!["/bin/sh".into(), "-c".into()],
                args: BTreeMap::new(),
                base: None,
            }
        } else {
            let img = image(store, from, stage.from_line, cancel, &|l| {
                ev(done, &step, Some(l), None)
            })
            .await?;
            State {
                chain: cache::key(&[b"FROM", img.digest.as_bytes()]),
                config: img.config.clone(),
                base: Some(img.digest.clone()),
                fs: Some(img),
                shell: vec!["/bin/sh".into(), "-c".into()],
                args: BTreeMap::new(),
            }
        };
        ev(done, &step, None, None);
        for ins in &stage.instrs {
            if cancel.is_cancelled() {
                return Err(cancelled());
            }
            done += 1;
            let step = format!("[{done}/{total}] {}", ins.text);
            let mut vars = st.args.clone();
            for kv in &st.config.env {
                if let Some((k, v)) = kv.split_once('=') {
                    vars.insert(k.to_owned(), v.to_owned());
                }
            }
            let ex = |s: &str| parse::expand(s, &vars, escape).map_err(|e| invalid(ins.line, e));
            let meta_step = |st: &mut State, what: &str| {
                st.chain = cache::key(&[st.chain.as_bytes(), what.as_bytes()]);
            };
            match &ins.kind {
                Kind::From { .. } => unreachable!("split into stages"),
                Kind::Arg(list) => {
                    for (k, d) in list {
                        let v = match (req.build_args.get(k), d) {
                            (Some(v), _) => v.clone(),
                            (None, Some(d)) => ex(d)?,
                            (None, None) => gargs.get(k).cloned().unwrap_or_default(),
                        };
                        meta_step(&mut st, &format!("ARG {k}={v}"));
                        st.args.insert(k.clone(), v);
                    }
                }
                Kind::Env(list) => {
                    for (k, v) in list {
                        let v = ex(v)?;
                        meta_step(&mut st, &format!("ENV {k}={v}"));
                        st.config
                            .env
                            .retain(|e| e.split_once('=').map(|x| x.0) != Some(k.as_str()));
                        st.config.env.push(format!("{k}={v}"));
                    }
                }
                Kind::Label(list) => {
                    for (k, v) in list {
                        let v = ex(v)?;
                        meta_step(&mut st, &format!("LABEL {k}={v}"));
                        st.config.labels.insert(k.clone(), v);
                    }
                }
                Kind::Expose(ports) => {
                    for p in ports {
                        let p = ex(p)?;
                        let p = if p.contains('/') {
                            p
                        } else {
                            format!("{p}/tcp")
                        };
                        meta_step(&mut st, &format!("EXPOSE {p}"));
                        if !st.config.exposed_ports.contains(&p) {
                            st.config.exposed_ports.push(p);
                        }
                    }
                }
                Kind::User(u) => {
                    let u = ex(u)?;
                    meta_step(&mut st, &format!("USER {u}"));
                    st.config.user = Some(u);
                }
                Kind::Shell(v) => {
                    meta_step(&mut st, &format!("SHELL {v:?}"));
                    st.shell = v.clone();
                }
                Kind::CmdI(c) => {
                    let argv = argv(c, &st.shell);
                    meta_step(&mut st, &format!("CMD {argv:?}"));
                    st.config.cmd = Some(argv);
                }
                Kind::Entrypoint(c) => {
                    let argv = argv(c, &st.shell);
                    meta_step(&mut st, &format!("ENTRYPOINT {argv:?}"));
                    st.config.entrypoint = Some(argv);
                    st.config.cmd = None;
                }
                Kind::Workdir(w) => {
                    let w = ex(w)?;
                    let cur = st.config.working_dir.clone().unwrap_or_else(|| "/".into());
                    let wd = context::clean_abs(&if w.starts_with('/') {
                        w
                    } else {
                        format!("{cur}/{w}")
                    });
                    st.config.working_dir = Some(wd.clone());
                    let key = cache::key(&[st.chain.as_bytes(), b"WORKDIR", wd.as_bytes()]);
                    st.chain = key.clone();
                    let root = st.fs.as_ref().and_then(|i| store.rootfs(&i.digest));
                    let exists = root.as_ref().is_some_and(|r| is_dir_in(r, &wd));
                    if !exists {
                        let parts: Vec<String> = wd
                            .trim_start_matches('/')
                            .split('/')
                            .map(str::to_owned)
                            .collect();
                        let r2 = root.clone();
                        fs_step(
                            store,
                            &mut st,
                            txn,
                            req,
                            &key,
                            ins,
                            &|hit| ev(done, &step, None, Some(hit)),
                            move |l| {
                                let mut cur = String::new();
                                for p in &parts {
                                    cur = if cur.is_empty() {
                                        p.clone()
                                    } else {
                                        format!("{cur}/{p}")
                                    };
                                    if !r2
                                        .as_ref()
                                        .is_some_and(|r| is_dir_in(r, &format!("/{cur}")))
                                    {
                                        l.dir(&cur, 0o755, &Meta::default())?;
                                    }
                                }
                                Ok(())
                            },
                            &mut budget,
                        )
                        .await?;
                        continue;
                    }
                }
                Kind::Copy {
                    add,
                    srcs,
                    dst,
                    from,
                    chown,
                    chmod,
                } => {
                    let srcs: Vec<String> = srcs.iter().map(|s| ex(s)).collect::<Result<_, _>>()?;
                    if let Some(u) = srcs.iter().find(|s| s.contains("://")) {
                        return Err(invalid(ins.line, format!("ADD of a URL ({u}) is not supported: fetch it with RUN (and a network) instead")));
                    }
                    let dst_x = ex(dst)?;
                    let cur = st.config.working_dir.clone().unwrap_or_else(|| "/".into());
                    let trailing = dst_x.ends_with('/') || dst_x == ".";
                    let dpath = context::clean_abs(&if dst_x.starts_with('/') {
                        dst_x.clone()
                    } else {
                        format!("{cur}/{dst_x}")
                    });
                    let root = st.fs.as_ref().and_then(|i| store.rootfs(&i.digest));
                    let meta = Meta {
                        owner: match chown {
                            Some(c) => {
                                let c = ex(c)?;
                                let r = root.clone();
                                Some(
                                    context::owner(&c, &|f| {
                                        r.as_ref().and_then(|r| read_in(r, &format!("/etc/{f}")))
                                    })
                                    .map_err(|e| invalid(ins.line, e))?,
                                )
                            }
                            None => None,
                        },
                        mode: match chmod {
                            Some(m) => Some(
                                u32::from_str_radix(&ex(m)?, 8)
                                    .ok()
                                    .filter(|m| *m <= 0o7777)
                                    .ok_or_else(|| {
                                        invalid(ins.line, format!("--chmod={m}: not an octal mode"))
                                    })?,
                            ),
                            None => None,
                        },
                    };
                    // Where the sources are: the context, another stage's root, an image's.
                    let (src_root, src_id): (Option<std::path::PathBuf>, String) = match from {
                        None => (None, "context".into()),
                        Some(f) => {
                            let f = ex(f)?;
                            match stage_ref(stages, &f, n) {
                                Some(i) => {
                                    let s = results
                                        .get(&i)
                                        .ok_or_else(|| AbxError::internal("stage order"))?;
                                    let img = s.fs.as_ref().ok_or_else(|| invalid(ins.line, format!("COPY --from={f}: that stage is empty (FROM scratch with no files)")))?;
                                    (store.rootfs(&img.digest), img.digest.clone())
                                }
                                None => {
                                    let img = image(store, &f, ins.line, cancel, &|l| {
                                        ev(done, &step, Some(l), None)
                                    })
                                    .await?;
                                    (store.rootfs(&img.digest), img.digest.clone())
                                }
                            }
                        }
                    };
                    let ctx = req.context.clone();
                    let text = format!(
                        "{} {:?} {dpath} {:?} {:?} {}",
                        if *add { "ADD" } else { "COPY" },
                        srcs,
                        meta.owner,
                        meta.mode,
                        trailing
                    );
                    let chain = st.chain.clone();
                    let add = *add;
                    let r3 = root.clone();
                    let (w, content, b2) = {
                        let st2 = store.clone();
                        let mut b = budget;
                        tokio::task::spawn_blocking(
                            move || -> Result<(BlobWriter, String, unpack::Budget), CopyError> {
                                let src = match &src_root {
                                    None => Source::context(&ctx)?,
                                    Some(r) => Source::root(r)?,
                                };
                                let mut w = st2
                                    .blob_writer()
                                    .map_err(|e| CopyError::Io(std::io::Error::other(e.message)))?;
                                let key = {
                                    let is_dir =
                                        move |p: &str| r3.as_ref().is_some_and(|r| is_dir_in(r, p));
                                    let d = Dest {
                                        path: dpath,
                                        trailing_slash: trailing,
                                        is_dir: &is_dir,
                                    };
                                    let mut l = Layer::new(HashWriter(&mut w), b);
                                    context::copy(&mut l, &src, &srcs, &d, &meta, add)?;
                                    let k = l.key();
                                    b = l.budget_left();
                                    l.finish()?;
                                    k
                                };
                                Ok((w, key, b))
                            },
                        )
                        .await
                        .map_err(AbxError::internal)?
                        .map_err(|e| copy_err(e, ins.line, store, req))?
                    };
                    budget = b2;
                    let key = cache::key(&[
                        chain.as_bytes(),
                        text.as_bytes(),
                        src_id.as_bytes(),
                        content.as_bytes(),
                    ]);
                    st.chain = key.clone();
                    commit_step(store, &mut st, txn, req, &key, w, &|hit| {
                        ev(done, &step, None, Some(hit))
                    })
                    .await?;
                    continue;
                }
                Kind::Run(c) => {
                    let argv = argv(c, &st.shell);
                    let mut env: BTreeMap<String, String> = st.args.clone();
                    for kv in &st.config.env {
                        if let Some((k, v)) = kv.split_once('=') {
                            env.insert(k.to_owned(), v.to_owned());
                        }
                    }
                    let cwd = st.config.working_dir.clone().unwrap_or_else(|| "/".into());
                    let key = cache::key(&[
                        st.chain.as_bytes(),
                        b"RUN",
                        serde_json::to_string(&argv).unwrap_or_default().as_bytes(),
                        serde_json::to_string(&env).unwrap_or_default().as_bytes(),
                        st.config.user.clone().unwrap_or_default().as_bytes(),
                        cwd.as_bytes(),
                    ]);
                    st.chain = key.clone();
                    if !req.no_cache {
                        if let Some(img) = store.cache_get(&key) {
                            st.fs = Some(img);
                            ev(done, &step, None, Some(true));
                            continue;
                        }
                    }
                    let Some(fs) = st.fs.clone() else {
                        return Err(build_failed(
                            req,
                            &step,
                            ins.line,
                            "RUN needs a shell, and this stage is FROM scratch with no files"
                                .into(),
                        ));
                    };
                    ev(done, &step, None, Some(false));
                    // The step's sandbox runs as the stage's USER, which its image's config
                    // says (env and working directory are the exec's).
                    let user = step_cfg(&st.config).user;
                    let on = if fs.config.user == user {
                        fs
                    } else {
                        let mut cfg = fs.config.clone();
                        cfg.user = user;
                        let st2 = store.clone();
                        let (on, new) = tokio::task::spawn_blocking(move || {
                            st2.step_image(Some(&fs), None, &cfg, STEP_SOURCE)
                        })
                        .await
                        .map_err(AbxError::internal)??;
                        if new {
                            txn.images.push(on.digest.clone());
                        }
                        on
                    };
                    let last: Mutex<VecDeque<String>> = Mutex::new(VecDeque::new());
                    let out = |l: String| {
                        {
                            let mut q = last.lock().expect("last lines");
                            if q.len() == LAST_LINES {
                                q.pop_front();
                            }
                            q.push_back(l.clone());
                        }
                        ev(done, &step, Some(l), None);
                    };
                    let r = runner
                        .run_step(
                            RunStep {
                                image: on,
                                argv,
                                env,
                                cwd,
                                network: req.network.clone(),
                                config: step_cfg(&st.config),
                            },
                            &out,
                            cancel,
                        )
                        .await;
                    if cancel.is_cancelled() {
                        if let Ok(RunOutcome::Done(img)) = &r {
                            txn.images.push(img.digest.clone());
                        }
                        return Err(cancelled());
                    }
                    match r {
                        Ok(RunOutcome::Done(img)) => {
                            txn.images.push(img.digest.clone());
                            if store.cache_put(&key, &img.digest) {
                                txn.keys.push(key);
                            }
                            st.fs = Some(*img);
                        }
                        Ok(RunOutcome::Failed(code)) => {
                            let tail: Vec<String> =
                                last.lock().expect("last lines").iter().cloned().collect();
                            return Err(build_failed(
                                req,
                                &step,
                                ins.line,
                                format!(
                                    "the command exited with code {code}{}",
                                    if tail.is_empty() {
                                        String::new()
                                    } else {
                                        format!("; its last output: {}", tail.join(" | "))
                                    }
                                ),
                            ));
                        }
                        Err(e)
                            if matches!(
                                e.code,
                                ErrorCode::Refused | ErrorCode::DiskFull | ErrorCode::QuotaExceeded
                            ) =>
                        {
                            return Err(build_failed(req, &step, ins.line, e.message));
                        }
                        Err(e) => return Err(e),
                    }
                    continue;
                }
            }
            ev(done, &step, None, None);
        }
        results.insert(n, st);
    }
    let last = *order.last().expect("a stage");
    let st = results.remove(&last).expect("built");
    let name = req.name.clone();
    let s2 = store.clone();
    let img = tokio::task::spawn_blocking(move || -> Result<Image, AbxError> {
        let (img, _) = s2.final_image(st.fs.as_ref(), &st.config, &name, st.base.clone())?;
        s2.tag(&[name], &img.digest)?;
        Ok(img)
    })
    .await
    .map_err(AbxError::internal)??;
    Ok(img)
}

/// The config of a step's image: a stage without `USER` runs its `RUN` steps as root (0)
/// inside, as docker does, whoever runs the broker (a `local` sandbox maps one id).
fn step_cfg(c: &ImageConfig) -> ImageConfig {
    let mut c = c.clone();
    if c.user.as_deref().is_none_or(str::is_empty) {
        c.user = Some("0".into());
    }
    c
}

fn build_failed(req: &Request, step: &str, line: usize, detail: String) -> AbxError {
    AbxError::new(
        ErrorCode::BuildFailed,
        &[
            ("template", &req.name),
            ("step", step),
            ("line", &line.to_string()),
            ("detail", &detail),
        ],
    )
}

fn argv(c: &Cmd, shell: &[String]) -> Vec<String> {
    match c {
        Cmd::Exec(v) => v.clone(),
        Cmd::Shell(s) => {
            let mut v = shell.to_vec();
            v.push(s.clone());
            v
        }
    }
}

/// A step that writes a layer with `write` (WORKDIR's directories): cached by `key`.
#[allow(clippy::too_many_arguments)]
async fn fs_step<F>(
    store: &Arc<Store>,
    st: &mut State,
    txn: &mut Txn<'_>,
    req: &Request,
    key: &str,
    _ins: &Instr,
    hit: &(dyn Fn(bool) + Send + Sync),
    write: F,
    budget: &mut unpack::Budget,
) -> Result<(), AbxError>
where
    F: FnOnce(&mut Layer<HashWriter<'_>>) -> std::io::Result<()> + Send + 'static,
{
    let s2 = store.clone();
    let b = *budget;
    let w = tokio::task::spawn_blocking(move || -> Result<BlobWriter, AbxError> {
        let mut w = s2.blob_writer()?;
        {
            let mut l = Layer::new(HashWriter(&mut w), b);
            write(&mut l).map_err(|e| io_err("a layer", e))?;
            l.finish().map_err(|e| io_err("a layer", e))?;
        }
        Ok(w)
    })
    .await
    .map_err(AbxError::internal)??;
    commit_step(store, st, txn, req, key, w, hit).await
}

/// A written layer: the cached image for `key` when there is one (the layer is dropped),
/// else stored and made the step's image.
async fn commit_step(
    store: &Arc<Store>,
    st: &mut State,
    txn: &mut Txn<'_>,
    req: &Request,
    key: &str,
    w: BlobWriter,
    hit: &(dyn Fn(bool) + Send + Sync),
) -> Result<(), AbxError> {
    if !req.no_cache {
        if let Some(img) = store.cache_get(key) {
            drop(w);
            st.fs = Some(img);
            hit(true);
            return Ok(());
        }
    }
    hit(false);
    let s2 = store.clone();
    let parent = st.fs.clone();
    let cfg = step_cfg(&st.config);
    let (img, new) = tokio::task::spawn_blocking(move || -> Result<(Image, bool), AbxError> {
        let digest = format!("sha256:{}", hex(&w.hash.clone().finalize()));
        let size = w.len;
        s2.commit_blob(w, &digest)?;
        s2.step_image(parent.as_ref(), Some((digest, size)), &cfg, STEP_SOURCE)
    })
    .await
    .map_err(AbxError::internal)??;
    if new {
        txn.images.push(img.digest.clone());
    }
    if store.cache_put(key, &img.digest) {
        txn.keys.push(key.to_owned());
    }
    st.fs = Some(img);
    Ok(())
}

/// An image the build names (FROM, COPY --from): stored, else pulled.
async fn image(
    store: &Arc<Store>,
    reference: &str,
    line: usize,
    cancel: &CancellationToken,
    say: &(dyn Fn(String) + Send + Sync),
) -> Result<Image, AbxError> {
    if let Some(img) = store.lookup(reference) {
        if img.source != STEP_SOURCE {
            return Ok(img);
        }
    }
    say(format!("pulling {reference}"));
    let quiet = |_: u64, _: u64, _: &str| {};
    tokio::select! {
        r = registry::pull(store, reference, &quiet) => r.map_err(|e| {
            if e.code == ErrorCode::SourceUnreachable {
                AbxError::new(ErrorCode::TemplateNotFound, &[("template", reference)]).with_suggestion(format!(
                    "Dockerfile line {line}: it is not stored here and pulling it failed ({}). Pull or import it first ('abx template pull', 'abx template import').",
                    e.message
                ))
            } else {
                e
            }
        }),
        _ = cancel.cancelled() => Err(cancelled()),
    }
}

/// Whether `path` (absolute) is a directory in the image root `root` (resolved inside it).
fn is_dir_in(root: &Path, path: &str) -> bool {
    let rel = path.trim_start_matches('/');
    let Ok(r) = unpack::openat2(libc::AT_FDCWD, root, libc::O_PATH | libc::O_DIRECTORY, 0) else {
        return false;
    };
    use std::os::fd::AsRawFd;
    unpack::openat2(
        r.as_raw_fd(),
        Path::new(if rel.is_empty() { "." } else { rel }),
        libc::O_PATH | libc::O_DIRECTORY,
        unpack::RESOLVE_IN_ROOT | unpack::RESOLVE_NO_MAGICLINKS,
    )
    .is_ok()
}

/// A small file of the image root `root` (resolved inside it).
fn read_in(root: &Path, path: &str) -> Option<String> {
    use std::os::fd::AsRawFd;
    let r = unpack::openat2(libc::AT_FDCWD, root, libc::O_PATH | libc::O_DIRECTORY, 0).ok()?;
    let fd = unpack::openat2(
        r.as_raw_fd(),
        Path::new(path.trim_start_matches('/')),
        libc::O_RDONLY | libc::O_NONBLOCK,
        unpack::RESOLVE_IN_ROOT | unpack::RESOLVE_NO_MAGICLINKS,
    )
    .ok()?;
    let st = unpack::fstat(fd.as_raw_fd()).ok()?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return None;
    }
    super::super::read_capped(std::fs::File::from(fd), 1 << 20)
        .ok()
        .map(|b| String::from_utf8_lossy(&b).into_owned())
}

impl Store {
    /// An image of `parent` (None: an empty root) with `layer` (a stored blob) on top and
    /// `config`: its root the parent's hard-link clone with the layer applied. The same
    /// image again (same layers, same config) is found, not made; true when it is new.
    pub fn step_image(
        &self,
        parent: Option<&Image>,
        layer: Option<(String, u64)>,
        config: &ImageConfig,
        source: &str,
    ) -> Result<(Image, bool), AbxError> {
        let mut layers: Vec<(String, u64, String)> = parent
            .map(|p| {
                p.layers
                    .iter()
                    .map(|l| {
                        let s = self
                            .blob_path(l)
                            .and_then(|p| p.metadata().ok())
                            .map_or(0, |m| m.len());
                        (l.clone(), s, l.clone())
                    })
                    .collect()
            })
            .unwrap_or_default();
        if let Some((d, s)) = &layer {
            layers.push((d.clone(), *s, d.clone()));
        }
        let name = if source == STEP_SOURCE {
            "<build step>"
        } else {
            source
        };
        let existed = |d: &str| {
            self.image_dir(d)
                .is_some_and(|d| d.join("rootfs").is_dir() && d.join("image.json").is_file())
        };
        let img = self.store_local(
            name,
            &layers,
            config,
            source,
            parent.map(|p| p.digest.clone()),
        )?;
        if existed(&img.digest) {
            return Ok((self.image(&img.digest).unwrap_or(img), false));
        }
        let dir = self
            .image_dir(&img.digest)
            .ok_or_else(|| io_err("image", "bad digest"))?;
        let tmp = dir.with_extension(format!("tmp-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        let made = (|| -> std::io::Result<()> {
            match parent.and_then(|p| self.rootfs(&p.digest)) {
                Some(r) => unpack::link_clone(&r, &tmp.join("rootfs"))?,
                None => {
                    std::fs::create_dir_all(tmp.join("rootfs"))?;
                    std::fs::set_permissions(
                        tmp.join("rootfs"),
                        std::os::unix::fs::PermissionsExt::from_mode(0o755),
                    )?;
                }
            }
            if let Some((d, _)) = &layer {
                let root = unpack::Root::open(&tmp.join("rootfs"), self.owner)?;
                let f = self
                    .blob_path(d)
                    .and_then(|p| std::fs::File::open(p).ok())
                    .ok_or_else(|| std::io::Error::other("the layer is not stored"))?;
                root.apply(layer_reader(f)?, &mut self.limits.budget())?;
            }
            Ok(())
        })();
        if let Err(e) = made {
            let _ = std::fs::remove_dir_all(&tmp);
            let _ = std::fs::remove_dir_all(&dir);
            self.gc_blobs();
            return Err(if unpack::is_over_budget(&e) {
                too_big(name, &self.limits)
            } else {
                io_err("a build step's root", e)
            });
        }
        self.write_record(&tmp, &img)?;
        if let Ok(b) = std::fs::read(dir.join("blobs.json")) {
            let _ = std::fs::write(tmp.join("blobs.json"), b);
        }
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::rename(&tmp, &dir).map_err(|e| io_err("installing a build step", e))?;
        Ok((img, true))
    }

    /// The built image: `fs` (None: empty) with the final config, named `name`.
    pub fn final_image(
        &self,
        fs: Option<&Image>,
        config: &ImageConfig,
        name: &str,
        base: Option<String>,
    ) -> Result<(Image, bool), AbxError> {
        let (mut img, new) = self.step_image(fs, None, config, "build")?;
        img.name = name.to_owned();
        img.source = "build".into();
        img.base = base;
        let dir = self
            .image_dir(&img.digest)
            .ok_or_else(|| io_err("image", "bad digest"))?;
        self.write_record(&dir, &img)?;
        Ok((img, new))
    }

    /// A `RUN` step's image: the sandbox's upper dir (made from `parent`) read as a layer
    /// through descriptors while the processes of `pidns` are stopped (as `templates/build`
    /// of a sandbox does), on `parent`, with `config`.
    pub fn step_from_upper(
        &self,
        parent: &Image,
        upper: &Path,
        pidns: Option<u64>,
        config: &ImageConfig,
    ) -> Result<Image, AbxError> {
        let mut w = self.blob_writer()?;
        {
            let _stopped = pidns.map(|ns| layer_build::stop_processes(ns, layer_build::STOP_WAIT));
            let mut hw = HashWriter(&mut w);
            let mut b = tar::Builder::new(&mut hw);
            let saved = layer_build::write_layer(&mut b, upper, &mut self.limits.budget())
                .and_then(|()| b.finish());
            if let Err(e) = saved {
                return Err(if unpack::is_over_budget(&e) {
                    too_big("the step's layer", &self.limits)
                } else {
                    io_err("reading the step's layer", e)
                });
            }
        }
        let digest = format!("sha256:{}", hex(&w.hash.clone().finalize()));
        let size = w.len;
        self.commit_blob(w, &digest)?;
        Ok(self
            .step_image(Some(parent), Some((digest, size)), config, STEP_SOURCE)?
            .0)
    }
}
