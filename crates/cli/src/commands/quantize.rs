//! `ds4server quantize SRC OUT.gguf --recipe NAME [--type GROUP=TYPE]...`:
//! a Hugging Face directory or a GGUF to a GGUF in the layout our loaders
//! read for its family (`quantize_layout`), each tensor in its recipe's
//! type (`quantize_recipes`), quantized by the engine's
//! `quant::quantize::rows` with llama.cpp's importance matrix (`imatrix`).
//!
//! Everything that can be refused is refused before a byte is written:
//! missing or mis-shaped tensors, unknown recipes, groups and types,
//! types the quantizer lacks, an IQ2_XXS recipe without an importance
//! matrix. Then the file is streamed: the header first, then each tensor
//! a bounded number of rows at a time (dequantized, quantized, appended),
//! so memory stays a few tensors wide however large the source. Output
//! goes to `OUT.partial` in the same directory, is synced and renamed to
//! `OUT` at the end; an error or Ctrl+C removes it.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufWriter, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use ds4_engine::quant::WeightType;
use ds4_engine::quant::quantize::{QuantizeError, rows as quantize_rows};
use ds4_gguf::{GgufWriter, TensorPlan, Value};

use super::imatrix::Imatrix;
use super::quantize_layout::{self as layout, OutFile, OutTensor, Piece};
use super::quantize_recipes::{self as recipes, Group};
use super::quantize_source::{Kind, Source};
use super::quantize_validate::validate;
use crate::args::QuantizeArgs;

/// Values dequantized per step (16 Mi f32 = 64 MiB).
const CHUNK_VALUES: usize = 1 << 24;

/// Types whose quantizer needs an importance vector.
fn needs_importance(ty: WeightType) -> bool {
    matches!(ty, WeightType::IQ2_XXS)
}

/// One output tensor with its resolved type.
struct Typed {
    t: OutTensor,
    group: Option<Group>,
    /// `None` for integer tables (copied as `Kind::Ids`' type).
    ty: Option<WeightType>,
    ggml: u32,
}

struct Planned {
    path: PathBuf,
    metadata: Vec<(String, Value)>,
    tensors: Vec<Typed>,
}

pub fn quantize(args: QuantizeArgs) -> Result<()> {
    let interrupted = Arc::new(AtomicBool::new(false));
    {
        let flag = interrupted.clone();
        // A second handler cannot be set (tests call `run` in-process only
        // through the binary); failing to set one keeps the default.
        let _ = ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst));
    }
    run(&args, &interrupted)
}

/// The overrides of `--type GROUP=TYPE`.
fn overrides(args: &QuantizeArgs) -> Result<BTreeMap<Group, WeightType>> {
    let mut m = BTreeMap::new();
    for o in &args.types {
        let (g, t) = o
            .split_once('=')
            .with_context(|| format!("--type {o}: expected GROUP=TYPE (e.g. experts=Q4_K)"))?;
        let ty = recipes::parse_type(t.trim())?;
        for g in recipes::parse_groups(g.trim())? {
            if g == Group::Vector && ty != WeightType::F32 {
                bail!("--type {o}: vectors (norms, biases) stay F32");
            }
            m.insert(g, ty);
        }
    }
    Ok(m)
}

/// `OUT` for the main file, `OUT-stem-<suffix>.gguf` beside it otherwise.
fn out_path(out: &Path, suffix: Option<&str>) -> PathBuf {
    match suffix {
        None => out.to_path_buf(),
        Some(s) => {
            let stem = out
                .file_stem()
                .map(|x| x.to_string_lossy().into_owned())
                .unwrap_or_default();
            out.with_file_name(format!("{stem}-{s}.gguf"))
        }
    }
}

fn partial(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".partial");
    path.with_file_name(name)
}

/// Removes the temporary files on drop unless the run committed them.
struct TempFiles(Vec<PathBuf>);

impl Drop for TempFiles {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

pub fn run(args: &QuantizeArgs, interrupted: &AtomicBool) -> Result<()> {
    let started = Instant::now();
    let overrides = overrides(args)?;
    // An unknown recipe is refused before the source is opened.
    recipes::recipe_type(&args.recipe, Group::Other, layout::Layout::LlamaCpp)?;
    let (family, _) = ds4_engine::families::detect(&args.source)?;
    let family = family.descriptor.name;
    let mut src = Source::open(&args.source)?;
    let files = layout::plan(&src, family)?;
    let imatrix = args.imatrix.as_deref().map(Imatrix::load).transpose()?;
    let planned = resolve(args, &src, files, &overrides, imatrix.as_ref())?;

    let total: u64 = planned
        .iter()
        .flat_map(|f| &f.tensors)
        .map(|t| ds4_gguf::tensor_bytes(t.ggml, &t.t.dims).unwrap_or(0) as u64)
        .sum();
    let mut counts: BTreeMap<String, (usize, u64)> = BTreeMap::new();
    for t in planned.iter().flat_map(|f| &f.tensors) {
        let e = counts
            .entry(ds4_engine::quant::ggml_type_name(t.ggml).to_string())
            .or_default();
        e.0 += 1;
        e.1 += ds4_gguf::tensor_bytes(t.ggml, &t.t.dims).unwrap_or(0) as u64;
    }
    eprintln!(
        "quantize: {} ({family}, {:?}) -> recipe {}: {} tensors, {:.1} MiB of tensor data",
        args.source.display(),
        src.format,
        args.recipe,
        planned.iter().map(|f| f.tensors.len()).sum::<usize>(),
        total as f64 / (1 << 20) as f64
    );
    for (ty, (n, b)) in &counts {
        eprintln!(
            "  {ty:>8}: {n:>5} tensors, {:.1} MiB",
            *b as f64 / (1 << 20) as f64
        );
    }
    if args.dry_run {
        for f in &planned {
            println!("{}", f.path.display());
            for t in &f.tensors {
                println!(
                    "  {:<48} {:<16} {:<8} {:?}",
                    t.t.name,
                    t.group.map_or("ids", Group::name),
                    ds4_engine::quant::ggml_type_name(t.ggml),
                    t.t.dims
                );
            }
        }
        return Ok(());
    }

    let threads = match args.threads {
        Some(0) => bail!("--threads 0: at least one thread is needed"),
        Some(n) => n,
        None => std::thread::available_parallelism().map_or(1, usize::from),
    };
    let temps = TempFiles(planned.iter().map(|f| partial(&f.path)).collect());
    let mut progress = Progress::new(total);
    let mut cx = WriteCx {
        imatrix: imatrix.as_ref(),
        threads,
        progress: &mut progress,
        interrupted,
    };
    for (f, tmp) in planned.iter().zip(&temps.0) {
        write_file(&mut src, f, tmp, &mut cx)?;
    }
    for (f, tmp) in planned.iter().zip(&temps.0) {
        std::fs::rename(tmp, &f.path)
            .with_context(|| format!("renaming {} to {}", tmp.display(), f.path.display()))?;
        if let Some(dir) = f.path.parent().filter(|d| !d.as_os_str().is_empty())
            && let Ok(d) = File::open(dir)
        {
            let _ = d.sync_all();
        }
    }
    std::mem::forget(temps);
    progress.finish();
    for f in &planned {
        let size = std::fs::metadata(&f.path).map(|m| m.len()).unwrap_or(0);
        eprintln!("wrote {} ({size} bytes)", f.path.display());
    }
    eprintln!("done in {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

/// Types per tensor, the quantizer probed for each, the imatrix checked,
/// the metadata completed.
fn resolve(
    args: &QuantizeArgs,
    src: &Source,
    files: Vec<OutFile>,
    overrides: &BTreeMap<Group, WeightType>,
    imatrix: Option<&Imatrix>,
) -> Result<Vec<Planned>> {
    let mut probed: HashMap<(WeightType, usize), ()> = HashMap::new();
    let mut no_importance = Vec::new();
    let mut planned = Vec::new();
    for f in files {
        let mut tensors = Vec::new();
        for t in f.tensors {
            let cols = t.dims.last().copied().unwrap_or(1);
            let typed = match t.kind {
                Kind::Ids(id) => Typed {
                    t,
                    group: None,
                    ty: None,
                    ggml: id,
                },
                Kind::Float => {
                    let group = recipes::group_of(&t.name, &t.dims, f.layout);
                    let want = match overrides.get(&group) {
                        Some(ty) => *ty,
                        None => recipes::recipe_type(&args.recipe, group, f.layout)?,
                    };
                    let ty = recipes::fallback(want, cols);
                    if ty != want {
                        eprintln!(
                            "note: {}: rows of {cols} values are not whole {want} blocks; written as {ty}",
                            t.name
                        );
                    }
                    if needs_importance(ty) && imatrix.is_none() && !args.allow_no_imatrix {
                        bail!(
                            "`{}` would be {ty}, which needs llama.cpp's importance matrix: pass --imatrix FILE, or --allow-no-imatrix to weight each expert by its own squared values (ds4's fallback; recorded in the file)",
                            t.name
                        );
                    }
                    if let std::collections::hash_map::Entry::Vacant(e) = probed.entry((ty, cols)) {
                        let ones = vec![1.0f32; cols];
                        match quantize_rows(ty, &vec![0.0; cols], cols, Some(&ones)) {
                            Ok(_) => {}
                            Err(QuantizeError::Unsupported(_)) => bail!(
                                "{}: the quantizer does not write {ty} yet (tensor {}, group {group}); choose another recipe or --type {group}=<type>",
                                t.name,
                                t.name
                            ),
                            Err(other) => bail!("{}: {other}", t.name),
                        }
                        e.insert(());
                    }
                    if needs_importance(ty) {
                        let n_exp = if t.dims.len() == 3 { t.dims[0] } else { 1 };
                        match imatrix {
                            Some(m) => {
                                if m.weights(&t.name, cols, 0, n_exp)?.is_none() {
                                    bail!(
                                        "{}: no entry for tensor `{}`, which {ty} needs (the imatrix must come from this model, named as in the output GGUF)",
                                        m.path.display(),
                                        t.name
                                    );
                                }
                            }
                            None => no_importance.push(t.name.clone()),
                        }
                    }
                    Typed {
                        ggml: ty.ggml_id().expect("GGUF types only"),
                        t,
                        group: Some(group),
                        ty: Some(ty),
                    }
                }
            };
            tensors.push(typed);
        }
        planned.push(Planned {
            path: out_path(&args.out, f.suffix),
            metadata: f.metadata,
            tensors,
        });
    }
    let extra = quantize_metadata(args, src, imatrix, !no_importance.is_empty());
    for p in &mut planned {
        let drop = |k: &str| {
            k.starts_with("ds4server.quantize.")
                || k.starts_with("quantize.imatrix.")
                || k == "general.quantization_version"
        };
        p.metadata.retain(|(k, _)| !drop(k));
        p.metadata.extend(extra.iter().cloned());
    }
    Ok(planned)
}

/// What the file says about how it was made.
fn quantize_metadata(
    args: &QuantizeArgs,
    src: &Source,
    imatrix: Option<&Imatrix>,
    synthetic: bool,
) -> Vec<(String, Value)> {
    let s = |v: String| Value::String(v);
    let name = |p: &Path| {
        p.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    let mut m = vec![
        ("general.quantization_version".into(), Value::U32(2)),
        ("ds4server.quantize.recipe".into(), s(args.recipe.clone())),
        (
            "ds4server.quantize.overrides".into(),
            s(args.types.join(",")),
        ),
        ("ds4server.quantize.source".into(), s(name(&src.path))),
        (
            "ds4server.quantize.requantized".into(),
            Value::Bool(src.format == ds4_engine::load::ModelFormat::Gguf),
        ),
    ];
    match imatrix {
        Some(im) => {
            m.push(("quantize.imatrix.file".into(), s(name(&im.path))));
            if let Some(d) = im.datasets.first() {
                m.push(("quantize.imatrix.dataset".into(), s(d.clone())));
            }
            m.push((
                "quantize.imatrix.entries_count".into(),
                Value::I32(im.entries.len() as i32),
            ));
            m.push((
                "quantize.imatrix.chunks_count".into(),
                Value::I32(im.chunk_count as i32),
            ));
        }
        None if synthetic => m.push((
            "ds4server.quantize.imatrix".into(),
            s(
                "none (--allow-no-imatrix): IQ2_XXS weighted by each expert's own squared values"
                    .into(),
            ),
        )),
        None => m.push(("ds4server.quantize.imatrix".into(), s("none".into()))),
    }
    m
}

/// Progress on stderr: the tensor, bytes done and an estimate of the time
/// left, redrawn at most twice a second on a terminal.
struct Progress {
    total: u64,
    done: u64,
    started: Instant,
    last: Instant,
    tty: bool,
}

impl Progress {
    fn new(total: u64) -> Self {
        Self {
            total,
            done: 0,
            started: Instant::now(),
            last: Instant::now(),
            tty: std::io::stderr().is_terminal(),
        }
    }

    fn add(&mut self, bytes: u64, tensor: &str, force: bool) {
        self.done += bytes;
        if !force && self.last.elapsed().as_millis() < 500 {
            return;
        }
        self.last = Instant::now();
        let el = self.started.elapsed().as_secs_f64();
        let left = if self.done > 0 {
            el * (self.total.saturating_sub(self.done)) as f64 / self.done as f64
        } else {
            0.0
        };
        let line = format!(
            "{tensor}: {:.1}/{:.1} MiB ({:.0}%), {:.0} s left",
            self.done as f64 / (1 << 20) as f64,
            self.total as f64 / (1 << 20) as f64,
            100.0 * self.done as f64 / self.total.max(1) as f64,
            left
        );
        if self.tty {
            eprint!("\r\x1b[2K{line}");
        } else {
            eprintln!("{line}");
        }
    }

    fn finish(&self) {
        if self.tty {
            eprintln!();
        }
    }
}

/// What every tensor's write shares.
struct WriteCx<'a> {
    imatrix: Option<&'a Imatrix>,
    threads: usize,
    progress: &'a mut Progress,
    interrupted: &'a AtomicBool,
}

fn write_file(src: &mut Source, f: &Planned, tmp: &Path, cx: &mut WriteCx) -> Result<()> {
    let plans: Vec<TensorPlan> = f
        .tensors
        .iter()
        .map(|t| TensorPlan {
            name: t.t.name.clone(),
            dims: t.t.dims.clone(),
            ggml_type: t.ggml,
        })
        .collect();
    let file = File::create(tmp).with_context(|| format!("{}: cannot create", tmp.display()))?;
    let mut w = GgufWriter::new(BufWriter::with_capacity(1 << 22, file), &f.metadata, &plans)
        .with_context(|| format!("{}", tmp.display()))?;
    for t in &f.tensors {
        if cx.interrupted.load(Ordering::SeqCst) {
            bail!("interrupted: {} removed", tmp.display());
        }
        match t.ty {
            None => {
                let width = if t.ggml == 27 { 8 } else { 4 };
                let mut bytes = Vec::new();
                for p in &t.t.pieces {
                    for v in src.ids(&p.source)? {
                        if width == 8 {
                            bytes.extend(v.to_le_bytes());
                        } else {
                            let v = i32::try_from(v).with_context(|| {
                                format!(
                                    "{}: `{}`: id {v} does not fit I32",
                                    src.file_of(&p.source).display(),
                                    p.source
                                )
                            })?;
                            bytes.extend(v.to_le_bytes());
                        }
                    }
                }
                w.write(&bytes)?;
                cx.progress.add(bytes.len() as u64, &t.t.name, true);
            }
            Some(ty) => write_tensor(src, &mut w, t, ty, cx)
                .with_context(|| format!("{}: nothing written", f.path.display()))?,
        }
    }
    let out = w.finish()?;
    let file = out.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()?;
    Ok(())
}

/// llama.cpp's `permute`: within each head of `d` rows, row `i·2 + j` of
/// the output is row `j·d/2 + i` of the input (half-split → interleaved).
fn permute_heads(values: &[f32], cols: usize, d: usize) -> Vec<f32> {
    let mut out = vec![0.0; values.len()];
    let rows = values.len() / cols;
    for h in 0..rows / d {
        for i in 0..d / 2 {
            for j in 0..2 {
                let o = h * d + i * 2 + j;
                let s = h * d + j * (d / 2) + i;
                out[o * cols..(o + 1) * cols].copy_from_slice(&values[s * cols..(s + 1) * cols]);
            }
        }
    }
    out
}

/// The pieces' rows `r0..r1` (global rows of the output tensor), in order.
fn dequantize(
    src: &mut Source,
    cache: &mut Option<(String, ds4_engine::quant::QuantTensor)>,
    pieces: &[Piece],
    r0: usize,
    r1: usize,
    cols: usize,
) -> Result<Vec<f32>> {
    let mut out = Vec::with_capacity((r1 - r0) * cols);
    let mut base = 0;
    for p in pieces {
        let (a, b) = (r0.max(base), r1.min(base + p.rows));
        if a < b {
            if cache.as_ref().is_none_or(|(n, _)| *n != p.source) {
                if let Some((_, old)) = cache.take() {
                    for part in &old.parts {
                        part.data.release();
                    }
                }
                *cache = Some((p.source.clone(), src.values(&p.source)?));
            }
            let q = &cache.as_ref().expect("set above").1;
            let mut v = vec![0.0f32; (b - a) * cols];
            q.dequantize_rows(a - base, b - base, &mut v);
            if let Some(d) = p.permute {
                v = permute_heads(&v, cols, d);
            }
            out.extend_from_slice(&v);
        }
        base += p.rows;
    }
    Ok(out)
}

/// Rows `row0..` of tensor `name` (`values`, rows of `cols`) in `ty`,
/// checked as llama.cpp's `ggml_validate_row_data` checks them. Errors
/// name the tensor and the row (of the whole tensor).
fn quantize_checked(
    name: &str,
    ty: WeightType,
    values: &[f32],
    cols: usize,
    importance: Option<&[f32]>,
    row0: usize,
) -> Result<Vec<u8>> {
    let bytes = quantize_rows(ty, values, cols, importance).map_err(|e| match e {
        QuantizeError::Search { row, reason, .. } => {
            anyhow::anyhow!("{name}: row {}: {ty}: {reason}", row0 + row)
        }
        QuantizeError::NonFinite {
            what: "value",
            index,
            value,
        } => anyhow::anyhow!(
            "{name}: row {}: column {} is {value} (only finite values can be quantized to {ty})",
            row0 + index / cols.max(1),
            index % cols.max(1)
        ),
        other => anyhow::anyhow!("quantizing {name} to {ty}: {other}"),
    })?;
    if let Err(bad) = validate(ty, &bytes, cols) {
        let why = if bad.what.starts_with("inf") {
            format!(" (a source value too large for {ty})")
        } else {
            String::new()
        };
        bail!(
            "{name}: row {}, block {}: {} in the {ty} data{why}; refused, as llama.cpp's ggml_validate_row_data refuses it",
            row0 + bad.row,
            bad.block,
            bad.what
        );
    }
    Ok(bytes)
}

/// [`quantize_checked`] with the rows split over up to `threads` scoped
/// threads, the pieces joined in row order: the same bytes as one thread
/// (each row is quantized on its own).
fn quantize_parallel(
    name: &str,
    ty: WeightType,
    values: &[f32],
    cols: usize,
    importance: Option<&[f32]>,
    row0: usize,
    threads: usize,
) -> Result<Vec<u8>> {
    let rows = values.len() / cols.max(1);
    let n = threads.min(rows).max(1);
    if n == 1 {
        return quantize_checked(name, ty, values, cols, importance, row0);
    }
    let per = rows.div_ceil(n);
    let parts: Vec<Result<Vec<u8>>> = std::thread::scope(|s| {
        // A thread the system refuses is an error, not a panic.
        let handles: Vec<_> = values
            .chunks(per * cols)
            .enumerate()
            .map(|(i, piece)| {
                std::thread::Builder::new()
                    .name(format!("quantize-{i}"))
                    .spawn_scoped(s, move || {
                        quantize_checked(name, ty, piece, cols, importance, row0 + i * per)
                    })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| match h {
                Ok(h) => h.join().unwrap_or_else(|_| {
                    Err(anyhow::anyhow!("{name}: a quantizer thread panicked"))
                }),
                Err(e) => Err(anyhow::anyhow!(
                    "{name}: cannot start a quantizer thread ({e}); try a smaller --threads"
                )),
            })
            .collect()
    });
    let mut out = Vec::with_capacity(ty.row_bytes(cols).unwrap_or(0) * rows);
    for p in parts {
        out.extend_from_slice(&p?);
    }
    Ok(out)
}

fn write_tensor<W: Write>(
    src: &mut Source,
    w: &mut GgufWriter<W>,
    t: &Typed,
    ty: WeightType,
    cx: &mut WriteCx,
) -> Result<()> {
    let imatrix = cx.imatrix;
    let dims = &t.t.dims;
    let cols = dims.last().copied().unwrap_or(1);
    let rows: usize = dims.iter().rev().skip(1).product();
    // Segments: one per expert of a 3-D stack (its own importance), else
    // the whole tensor.
    let (n_seg, seg_rows) = if dims.len() == 3 {
        (dims[0], dims[1])
    } else {
        (1, rows)
    };
    // Whole heads per chunk when rows are permuted.
    let unit =
        t.t.pieces
            .iter()
            .filter_map(|p| p.permute)
            .max()
            .unwrap_or(1);
    let chunk = ((CHUNK_VALUES / cols.max(1)).max(1)).div_ceil(unit) * unit;
    let mut cache = None;
    for e in 0..n_seg {
        let (s0, s1) = (e * seg_rows, (e + 1) * seg_rows);
        let importance: Option<Vec<f32>> = match imatrix {
            Some(m) => m.weights(&t.t.name, cols, e, n_seg)?.map(<[f32]>::to_vec),
            None if needs_importance(ty) => {
                // ds4's fallback: Σ over the expert's rows of value².
                let mut acc = vec![0.0f32; cols];
                let mut r = s0;
                while r < s1 {
                    let r_end = (r + chunk).min(s1);
                    let v = dequantize(src, &mut cache, &t.t.pieces, r, r_end, cols)?;
                    for row in v.chunks_exact(cols) {
                        for (a, x) in acc.iter_mut().zip(row) {
                            *a += x * x;
                        }
                    }
                    r = r_end;
                }
                Some(acc)
            }
            None => None,
        };
        let mut r = s0;
        while r < s1 {
            if cx.interrupted.load(Ordering::SeqCst) {
                bail!("interrupted");
            }
            let r_end = (r + chunk).min(s1);
            let v = dequantize(src, &mut cache, &t.t.pieces, r, r_end, cols)?;
            let bytes = quantize_parallel(
                &t.t.name,
                ty,
                &v,
                cols,
                importance.as_deref(),
                r,
                cx.threads,
            )?;
            w.write(&bytes)?;
            cx.progress.add(bytes.len() as u64, &t.t.name, false);
            r = r_end;
        }
    }
    if let Some((_, q)) = cache {
        for part in &q.parts {
            part.data.release();
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutation_is_llama_cpps() {
        // One head of 4 rows (d = 4) of 1 column: halves [0, 1 | 2, 3]
        // interleave to [0, 2, 1, 3]; a second head follows.
        let v: Vec<f32> = (0..8).map(|x| x as f32).collect();
        assert_eq!(
            permute_heads(&v, 1, 4),
            [0.0, 2.0, 1.0, 3.0, 4.0, 6.0, 5.0, 7.0]
        );
    }

    #[test]
    fn companion_paths_sit_beside_the_output() {
        let out = Path::new("/m/ds4.gguf");
        assert_eq!(out_path(out, None), out);
        assert_eq!(out_path(out, Some("mtp")), Path::new("/m/ds4-mtp.gguf"));
        assert_eq!(partial(out), Path::new("/m/ds4.gguf.partial"));
    }

    #[test]
    fn an_interrupted_run_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("m.gguf");
        let args = QuantizeArgs {
            source: Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../tests/fixtures/llama/tiny/f32_untied"),
            out: out.clone(),
            recipe: "f16".into(),
            types: vec![],
            imatrix: None,
            allow_no_imatrix: false,
            dry_run: false,
            threads: None,
        };
        // Ctrl+C before the first tensor: the header was written to
        // OUT.partial, which is removed; OUT never appears.
        let e = run(&args, &AtomicBool::new(true)).unwrap_err().to_string();
        assert!(e.contains("interrupted"), "{e}");
        assert!(!out.exists() && !partial(&out).exists());
        let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
        // The same run uninterrupted writes it.
        run(&args, &AtomicBool::new(false)).unwrap();
        assert!(out.exists() && !partial(&out).exists());
    }
}
