//! Per-layer key/value caches for softmax attention: per layer and kv head
//! one cache of `[P, head_dim]` rows for keys and one for values, on the
//! backend's device, so each head's keys are contiguous for the attention
//! kernel. A decode step appends one row per head (amortised O(1));
//! snapshots are deep copies of the valid rows.
//!
//! The element type is chosen per model load ([`KvType`]): f32 (the rows
//! as computed) or f16 (each value rounded to nearest even on write, half
//! the memory and half the bytes a decode step reads; attention widens
//! them back exactly, [`crate::backend::Backend::attention_causal_half`]).
//!
//! The exported table is the checkpoint format of the first releases:
//! `kv.{l}.k` / `kv.{l}.v` as `[kv_heads, len, head_dim]` (head-major), f32
//! (an f16 cache exports its values widened, exactly, and imports them
//! rounded back, exactly; the cache type is part of a checkpoint's identity
//! through the model's backend tag, so the two never meet).

use crate::backend::{Backend, HeadRows};
use crate::error::{EngineError, Result};
use crate::state::rows::RowCache;
use crate::state::table::{NamedTensor, TableReader};

/// The element type of a KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvType {
    /// The rows as computed (bit-identical to every release before f16).
    #[default]
    F32,
    /// IEEE binary16, rounded to nearest even on write.
    F16,
}

impl KvType {
    /// `f32` / `f16` (the `--kv-cache` values).
    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
        }
    }

    /// Bytes per cached value.
    pub fn bytes(self) -> usize {
        match self {
            KvType::F32 => 4,
            KvType::F16 => 2,
        }
    }
}

impl std::fmt::Display for KvType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for KvType {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "f32" => Ok(KvType::F32),
            "f16" => Ok(KvType::F16),
            _ => Err(format!("`{s}` is not a KV cache type (use f32 or f16)")),
        }
    }
}

/// Per layer, per kv head: keys and values.
#[derive(Debug, Clone)]
enum Store<B: Backend> {
    F32 {
        k: Vec<Vec<RowCache<B>>>,
        v: Vec<Vec<RowCache<B>>>,
    },
    F16 {
        k: Vec<Vec<B::Half>>,
        v: Vec<Vec<B::Half>>,
    },
}

/// One layer's keys and values per kv head, `[len, head_dim]` each, as
/// [`KvCache::write`] returns them for the attention op.
pub enum KvRows<'a, B: Backend> {
    F32(Vec<&'a B::Buf>, Vec<&'a B::Buf>),
    F16(Vec<&'a B::Half>, Vec<&'a B::Half>),
}

#[derive(Debug, Clone)]
pub struct KvCache<B: Backend> {
    ops: B,
    store: Store<B>,
    layers: usize,
    len: usize,
    max_len: usize,
    kv_heads: usize,
    head_dim: usize,
}

impl<B: Backend> KvCache<B> {
    /// An empty f32 cache.
    pub fn new(
        ops: &B,
        num_layers: usize,
        kv_heads: usize,
        head_dim: usize,
        max_len: usize,
    ) -> Result<Self> {
        Self::with_type(ops, num_layers, kv_heads, head_dim, max_len, KvType::F32)
    }

    /// An empty cache of `kv_type` (f16 is refused where the backend has no
    /// f16 rows).
    pub fn with_type(
        ops: &B,
        num_layers: usize,
        kv_heads: usize,
        head_dim: usize,
        max_len: usize,
        kv_type: KvType,
    ) -> Result<Self> {
        let store = match kv_type {
            KvType::F32 => {
                let rows = |_| {
                    (0..kv_heads)
                        .map(|_| RowCache::new(ops, head_dim))
                        .collect::<Result<Vec<_>>>()
                };
                Store::F32 {
                    k: (0..num_layers).map(rows).collect::<Result<_>>()?,
                    v: (0..num_layers).map(rows).collect::<Result<_>>()?,
                }
            }
            KvType::F16 => {
                let rows = |_| {
                    (0..kv_heads)
                        .map(|_| ops.half_empty())
                        .collect::<Result<Vec<_>>>()
                };
                Store::F16 {
                    k: (0..num_layers).map(rows).collect::<Result<_>>()?,
                    v: (0..num_layers).map(rows).collect::<Result<_>>()?,
                }
            }
        };
        Ok(Self {
            ops: ops.clone(),
            store,
            layers: num_layers,
            len: 0,
            max_len,
            kv_heads,
            head_dim,
        })
    }

    pub fn kv_type(&self) -> KvType {
        match self.store {
            Store::F32 { .. } => KvType::F32,
            Store::F16 { .. } => KvType::F16,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn num_layers(&self) -> usize {
        self.layers
    }

    fn no_layer(layer: usize) -> EngineError {
        EngineError::State(format!("kv cache has no layer {layer}"))
    }

    /// Append this forward's `k, v: [t, kv_heads·head_dim]` to `layer` and
    /// return the layer's keys and values per head, `[len + t, head_dim]`.
    /// The length advances through [`KvCache::advance`] once every layer is
    /// done.
    pub fn write(&mut self, layer: usize, k: &B::Buf, v: &B::Buf) -> Result<KvRows<'_, B>> {
        let t = self.ops.len(k) / (self.kv_heads * self.head_dim).max(1);
        let parts = vec![self.head_dim; self.kv_heads];
        let ops = &self.ops;
        let rows = match &mut self.store {
            Store::F32 { k: kc, v: vc } => {
                let (kc, vc) = match (kc.get_mut(layer), vc.get_mut(layer)) {
                    (Some(k), Some(v)) => (k, v),
                    _ => return Err(Self::no_layer(layer)),
                };
                for (src, heads) in [(k, &mut *kc), (v, &mut *vc)] {
                    for (rows, cache) in ops.split_cols(src, t, &parts, 1)?.iter().zip(heads) {
                        cache.append(ops, rows)?;
                    }
                }
                kc.first().map_or(0, |c| c.rows())
            }
            Store::F16 { k: kc, v: vc } => {
                let (kc, vc) = match (kc.get_mut(layer), vc.get_mut(layer)) {
                    (Some(k), Some(v)) => (k, v),
                    _ => return Err(Self::no_layer(layer)),
                };
                for (src, heads) in [(k, &mut *kc), (v, &mut *vc)] {
                    for (rows, cache) in ops.split_cols(src, t, &parts, 1)?.iter().zip(heads) {
                        ops.half_append(cache, rows)?;
                    }
                }
                kc.first()
                    .map_or(0, |c| ops.half_len(c) / self.head_dim.max(1))
            }
        };
        if rows > self.max_len {
            return Err(EngineError::ContextOverflow {
                needed: rows,
                limit: self.max_len,
            });
        }
        Ok(self.layer_rows(layer))
    }

    /// [`KvCache::write`] for several sessions' caches of one layer at
    /// once (continuous batching): cache i takes rows `at_i .. at_i + t_i`
    /// of `k` and `v` (`[Σ t, kv_heads · head_dim]`, `at_i` = Σ_{j<i} t_j)
    /// through one [`Backend::append_head_rows`] (one launch on CUDA where
    /// the writes one by one were ~8 a session and layer). Every cache
    /// holds f32 rows of one geometry; it returns false, writing nothing,
    /// where one holds f16 rows (the caller writes them one by one).
    pub fn write_batch(
        ops: &B,
        caches: &mut [&mut KvCache<B>],
        layer: usize,
        k: &B::Buf,
        v: &B::Buf,
        ts: &[usize],
    ) -> Result<bool> {
        if caches.iter().any(|c| !matches!(c.store, Store::F32 { .. })) {
            return Ok(false);
        }
        let Some(first) = caches.first() else {
            return Ok(true);
        };
        let (heads, d) = (first.kv_heads, first.head_dim);
        for (c, &t) in caches.iter().zip(ts) {
            if c.kv_heads != heads || c.head_dim != d {
                return Err(EngineError::State(
                    "a batch's kv caches differ in heads or head size".into(),
                ));
            }
            if layer >= c.num_layers() {
                return Err(Self::no_layer(layer));
            }
            let rows = c.layer_len(layer) + t;
            if rows > c.max_len {
                return Err(EngineError::ContextOverflow {
                    needed: rows,
                    limit: c.max_len,
                });
            }
        }
        let mut targets = Vec::with_capacity(2 * caches.len());
        let mut at = 0;
        for (c, &t) in caches.iter_mut().zip(ts) {
            if let Store::F32 { k: kc, v: vc } = &mut c.store {
                for (src, heads) in [(k, &mut kc[layer]), (v, &mut vc[layer])] {
                    targets.push(HeadRows {
                        src,
                        first: at,
                        rows: t,
                        dsts: heads.iter_mut().map(RowCache::storage_mut).collect(),
                    });
                }
            }
            at += t;
        }
        let appended = ops.append_head_rows(d, &mut targets);
        drop(targets);
        if let Err(e) = appended {
            // Some buffers may hold their new rows: drop them, so the
            // caller's rollback finds every cache as it was.
            for c in caches.iter_mut() {
                if let Store::F32 { k: kc, v: vc } = &mut c.store {
                    for cache in kc[layer].iter_mut().chain(vc[layer].iter_mut()) {
                        cache.drop_unrecorded(ops)?;
                    }
                }
            }
            return Err(e);
        }
        for (c, &t) in caches.iter_mut().zip(ts) {
            if let Store::F32 { k: kc, v: vc } = &mut c.store {
                for cache in kc[layer].iter_mut().chain(vc[layer].iter_mut()) {
                    cache.appended(t);
                }
            }
        }
        Ok(true)
    }

    /// Rows of `layer` (its first head's keys; every head has as many).
    fn layer_len(&self, layer: usize) -> usize {
        match &self.store {
            Store::F32 { k, .. } => k[layer].first().map_or(0, |c| c.rows()),
            Store::F16 { k, .. } => k[layer]
                .first()
                .map_or(0, |c| self.ops.half_len(c) / self.head_dim.max(1)),
        }
    }

    /// `layer`'s keys and values per head, as [`KvCache::write`] returned
    /// them (continuous batching writes every session's rows first, then
    /// reads them all).
    pub fn written(&self, layer: usize) -> Result<KvRows<'_, B>> {
        if layer >= self.layers {
            return Err(Self::no_layer(layer));
        }
        Ok(self.layer_rows(layer))
    }

    /// `layer`'s keys and values per head (a layer that exists).
    fn layer_rows(&self, layer: usize) -> KvRows<'_, B> {
        match &self.store {
            Store::F32 { k, v } => KvRows::F32(
                k[layer].iter().map(|c| c.buf()).collect(),
                v[layer].iter().map(|c| c.buf()).collect(),
            ),
            Store::F16 { k, v } => {
                KvRows::F16(k[layer].iter().collect(), v[layer].iter().collect())
            }
        }
    }

    /// Step mode (graph replay) is for f32 caches: the backends that replay
    /// steps (CUDA) have no f16 cache, and the CPU never runs steps.
    fn f32_caches_mut(&mut self) -> Result<impl Iterator<Item = &mut RowCache<B>>> {
        match &mut self.store {
            Store::F32 { k, v } => Ok(k.iter_mut().chain(v.iter_mut()).flatten()),
            Store::F16 { .. } => Err(EngineError::Unsupported(
                "an f16 kv cache runs forwards eagerly (no step mode)".into(),
            )),
        }
    }

    /// Make room for a step of `t` rows: every cache covers `len + t` rows
    /// in storage of its own (grown by doubling, so the storage of
    /// successive steps stays the same between growth points); the rows
    /// are written by [`KvCache::write_step`]. Undone by
    /// [`KvCache::rollback`], kept by [`KvCache::advance`]. f32 caches only.
    pub fn prepare_step(&mut self, t: usize) -> Result<()> {
        let (ops, rows, max) = (self.ops.clone(), self.len + t, self.max_len);
        if rows > max {
            return Err(EngineError::ContextOverflow {
                needed: rows,
                limit: max,
            });
        }
        for c in self.f32_caches_mut()? {
            c.resize_rows(&ops, rows, max)?;
        }
        Ok(())
    }

    /// The storage of every cache (part of a step's key).
    pub fn storage_keys(&self) -> Vec<u64> {
        match &self.store {
            Store::F32 { k, v } => k
                .iter()
                .chain(v)
                .flatten()
                .flat_map(|c| self.ops.storage_key(c.buf()))
                .collect(),
            Store::F16 { .. } => Vec::new(),
        }
    }

    /// [`KvCache::write`] in a step prepared by [`KvCache::prepare_step`]:
    /// the rows go to the step's position.
    #[allow(clippy::type_complexity)]
    pub fn write_step(
        &mut self,
        layer: usize,
        k: &B::Buf,
        v: &B::Buf,
        step: &B::Step,
    ) -> Result<KvRows<'_, B>> {
        let t = self.ops.len(k) / (self.kv_heads * self.head_dim).max(1);
        let parts = vec![self.head_dim; self.kv_heads];
        let ops = self.ops.clone();
        let Store::F32 { k: kc, v: vc } = &mut self.store else {
            return Err(EngineError::Unsupported(
                "an f16 kv cache runs forwards eagerly (no step mode)".into(),
            ));
        };
        let (kc, vc) = match (kc.get_mut(layer), vc.get_mut(layer)) {
            (Some(k), Some(v)) => (k, v),
            _ => return Err(Self::no_layer(layer)),
        };
        for (src, heads) in [(k, &mut *kc), (v, &mut *vc)] {
            for (rows, cache) in ops.split_cols(src, t, &parts, 1)?.iter().zip(heads) {
                cache.write_step(&ops, rows, step)?;
            }
        }
        Ok(self.layer_rows(layer))
    }

    /// Rows held by every cache.
    fn cache_rows(&self) -> Vec<usize> {
        match &self.store {
            Store::F32 { k, v } => k.iter().chain(v).flatten().map(|c| c.rows()).collect(),
            Store::F16 { k, v } => k
                .iter()
                .chain(v)
                .flatten()
                .map(|c| self.ops.half_len(c) / self.head_dim.max(1))
                .collect(),
        }
    }

    /// Every layer was written `t` rows: the cache now covers them.
    pub fn advance(&mut self, t: usize) -> Result<()> {
        let end = self.len + t;
        if self.cache_rows().iter().any(|&r| r != end) {
            return Err(EngineError::State(format!(
                "kv cache advance to {end} with layers written unevenly"
            )));
        }
        self.len = end;
        Ok(())
    }

    /// Every cache to its first `n` rows.
    fn cut(&mut self, n: usize) -> Result<()> {
        let ops = &self.ops;
        match &mut self.store {
            Store::F32 { k, v } => {
                for c in k.iter_mut().chain(v.iter_mut()).flatten() {
                    c.truncate(ops, n)?;
                }
            }
            Store::F16 { k, v } => {
                for c in k.iter_mut().chain(v.iter_mut()).flatten() {
                    ops.half_truncate(c, n * self.head_dim)?;
                }
            }
        }
        Ok(())
    }

    /// Forget rows written after the last [`KvCache::advance`] (a forward
    /// that failed half way leaves the cache as it was).
    pub fn rollback(&mut self) -> Result<()> {
        self.cut(self.len)
    }

    /// Keep the first `n` positions.
    pub fn truncate(&mut self, n: usize) -> Result<()> {
        if n > self.len {
            return Err(EngineError::State(format!(
                "cannot truncate a kv cache of {} positions to {n}",
                self.len
            )));
        }
        self.cut(n)?;
        self.len = n;
        Ok(())
    }

    /// One head's valid rows on the host, f32 (f16 widened exactly).
    fn head_values(&self, layer: usize, value: bool, head: usize) -> Result<Vec<f32>> {
        let n = self.len * self.head_dim;
        let mut x = match &self.store {
            Store::F32 { k, v } => self
                .ops
                .download((if value { v } else { k })[layer][head].buf())?,
            Store::F16 { k, v } => self
                .ops
                .half_download(&(if value { v } else { k })[layer][head])?,
        };
        x.truncate(n);
        Ok(x)
    }

    /// The valid rows of every layer as host tensors `kv.{l}.k` / `kv.{l}.v`,
    /// `[kv_heads, len, head_dim]`.
    pub fn export(&self) -> Result<Vec<NamedTensor>> {
        let shape = vec![self.kv_heads, self.len, self.head_dim];
        let mut out = Vec::with_capacity(2 * self.num_layers());
        for l in 0..self.num_layers() {
            for (what, value) in [("k", false), ("v", true)] {
                let mut hm = Vec::with_capacity(self.kv_heads * self.len * self.head_dim);
                for h in 0..self.kv_heads {
                    hm.extend(self.head_values(l, value, h)?);
                }
                out.push(NamedTensor::f32(
                    format!("kv.{l}.{what}"),
                    shape.clone(),
                    hm,
                ));
            }
        }
        Ok(out)
    }

    /// Fill an empty cache from [`KvCache::export`]'s tensors.
    pub fn import(&mut self, tensors: Vec<NamedTensor>) -> Result<()> {
        if self.len != 0 {
            return Err(EngineError::State(
                "kv cache import needs an empty cache".into(),
            ));
        }
        let mut r = TableReader::new(tensors, "kv cache");
        // The position count is the middle dimension of every tensor.
        let rows = match r.peek_shape() {
            Some(s) if s.len() == 3 => s[1],
            _ => {
                return Err(EngineError::State(
                    "kv cache: `kv.0.k` is not `[kv_heads, len, head_dim]`".into(),
                ));
            }
        };
        if rows > self.max_len {
            return Err(EngineError::ContextOverflow {
                needed: rows,
                limit: self.max_len,
            });
        }
        let (h, d) = (self.kv_heads, self.head_dim);
        let n = h * rows * d;
        let mut layers = Vec::with_capacity(self.num_layers());
        for l in 0..self.num_layers() {
            let k = r.f32(&format!("kv.{l}.k"), n)?;
            let v = r.f32(&format!("kv.{l}.v"), n)?;
            layers.push((k, v));
        }
        r.finish()?;
        let per_head = rows * d;
        let ops = &self.ops;
        for (l, (k, v)) in layers.into_iter().enumerate() {
            match &mut self.store {
                Store::F32 { k: kc, v: vc } => {
                    for (hm, heads) in [(k, &mut kc[l]), (v, &mut vc[l])] {
                        for (chunk, c) in hm.chunks(per_head.max(1)).zip(heads.iter_mut()) {
                            c.append(ops, &ops.upload(chunk)?)?;
                        }
                    }
                }
                Store::F16 { k: kc, v: vc } => {
                    for (hm, heads) in [(k, &mut kc[l]), (v, &mut vc[l])] {
                        for (chunk, c) in hm.chunks(per_head.max(1)).zip(heads.iter_mut()) {
                            ops.half_append(c, &ops.upload(chunk)?)?;
                        }
                    }
                }
            }
        }
        self.len = rows;
        Ok(())
    }

    /// Bytes of cache memory held (valid rows, all layers, k and v).
    pub fn byte_size(&self) -> usize {
        match &self.store {
            Store::F32 { k, v } => k.iter().chain(v).flatten().map(|c| c.byte_size()).sum(),
            Store::F16 { k, v } => k
                .iter()
                .chain(v)
                .flatten()
                .map(|c| 2 * self.ops.half_len(c))
                .sum(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::CpuOps;

    fn rows(t: usize, w: usize, base: f32) -> Vec<f32> {
        (0..t * w).map(|i| base + i as f32).collect()
    }

    #[test]
    fn export_import_round_trip_is_head_major_and_exact() {
        let ops = CpuOps;
        let mut c = KvCache::new(&ops, 2, 2, 3, 64).unwrap();
        for (t, base) in [(3, 0.0), (2, 100.0)] {
            for l in 0..2 {
                c.write(l, &rows(t, 6, base), &rows(t, 6, base + 1000.0))
                    .unwrap();
            }
            c.advance(t).unwrap();
        }
        let table = c.export().unwrap();
        assert_eq!(table[0].shape, vec![2, 5, 3]);
        // Head 1 of position 0 follows head 0's five positions.
        let crate::state::table::TensorData::F32(k0) = &table[0].data else {
            panic!("f32 table")
        };
        assert_eq!(&k0[15..18], &[3.0, 4.0, 5.0]);
        let mut d = KvCache::new(&ops, 2, 2, 3, 64).unwrap();
        d.import(table.clone()).unwrap();
        assert_eq!(d.export().unwrap(), table);
        assert_eq!(d.len(), 5);
    }

    /// Several caches written at once equal each written alone; a batch
    /// that fails part way (the second session's rows past the source)
    /// leaves every cache as it was, so the next write is a fresh one's.
    #[test]
    fn batched_writes_equal_single_ones_and_a_failed_batch_leaves_no_rows() {
        let ops = CpuOps;
        let fresh = || {
            let mut c = KvCache::new(&ops, 2, 2, 3, 64).unwrap();
            for l in 0..2 {
                c.write(l, &rows(2, 6, 7.0), &rows(2, 6, 70.0)).unwrap();
            }
            c.advance(2).unwrap();
            c
        };
        let (k, v) = (rows(3, 6, 0.0), rows(3, 6, 500.0));
        let (mut a, mut b) = (fresh(), fresh());
        KvCache::write_batch(&ops, &mut [&mut a, &mut b], 1, &k, &v, &[1, 2]).unwrap();
        let (mut a1, mut b1) = (fresh(), fresh());
        a1.write(1, &k[..6].to_vec(), &v[..6].to_vec()).unwrap();
        b1.write(1, &k[6..].to_vec(), &v[6..].to_vec()).unwrap();
        for (x, y) in [(&a, &a1), (&b, &b1)] {
            let (KvRows::F32(xk, xv), KvRows::F32(yk, yv)) =
                (x.written(1).unwrap(), y.written(1).unwrap())
            else {
                panic!("f32 caches")
            };
            assert_eq!(xk, yk);
            assert_eq!(xv, yv);
        }
        // 1 + 3 rows asked of a 3-row source: the first cache's append
        // runs, the second's fails.
        let (mut a, mut b) = (fresh(), fresh());
        let err = KvCache::write_batch(&ops, &mut [&mut a, &mut b], 0, &k, &v, &[1, 3]);
        assert!(err.is_err());
        for c in [&mut a, &mut b] {
            c.rollback().unwrap();
            let KvRows::F32(ck, _) = c.write(0, &k[..6].to_vec(), &v[..6].to_vec()).unwrap() else {
                panic!("an f32 cache")
            };
            let mut expect = rows(2, 6, 7.0);
            expect.extend_from_slice(&k[..6]);
            // Head 0: each position's first 3 values.
            let head0: Vec<f32> = expect.chunks(6).flat_map(|r| r[..3].to_vec()).collect();
            assert_eq!(ck[0], &head0);
        }
    }

    #[test]
    fn truncate_and_rollback_keep_the_valid_prefix() {
        let ops = CpuOps;
        let mut c = KvCache::new(&ops, 1, 1, 2, 8).unwrap();
        c.write(0, &rows(3, 2, 0.0), &rows(3, 2, 0.0)).unwrap();
        c.advance(3).unwrap();
        let snap = c.clone();
        c.write(0, &rows(1, 2, 50.0), &rows(1, 2, 50.0)).unwrap();
        c.rollback().unwrap();
        assert_eq!(c.export().unwrap(), snap.export().unwrap());
        c.truncate(1).unwrap();
        let KvRows::F32(k, _) = c.write(0, &rows(1, 2, 9.0), &rows(1, 2, 9.0)).unwrap() else {
            panic!("an f32 cache")
        };
        assert_eq!(k, vec![&vec![0.0, 1.0, 9.0, 10.0]]);
        assert!(matches!(
            KvCache::new(&ops, 1, 1, 2, 2)
                .unwrap()
                .write(0, &rows(3, 2, 0.0), &rows(3, 2, 0.0)),
            Err(EngineError::ContextOverflow { .. })
        ));
    }

    #[test]
    fn f16_cache_rounds_to_nearest_even_and_round_trips_exactly() {
        let ops = CpuOps;
        let mut c = KvCache::with_type(&ops, 1, 1, 4, 8, KvType::F16).unwrap();
        // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even (1);
        // 1 + 3·2^-11 ties up to 1 + 2^-9; 1e5 overflows to +inf; a value
        // below f16's smallest subnormal goes to +0.
        let tie = 1.0 + 2f32.powi(-11);
        let k = vec![tie, 1.0 + 3.0 * 2f32.powi(-11), 1e5, 1e-9];
        c.write(0, &k, &k).unwrap();
        c.advance(1).unwrap();
        let table = c.export().unwrap();
        let crate::state::table::TensorData::F32(k0) = &table[0].data else {
            panic!("f32 table")
        };
        assert_eq!(k0, &vec![1.0, 1.0 + 2f32.powi(-9), f32::INFINITY, 0.0]);
        assert_eq!(c.byte_size(), 2 * 2 * 4);
        let mut d = KvCache::with_type(&ops, 1, 1, 4, 8, KvType::F16).unwrap();
        d.import(table.clone()).unwrap();
        assert_eq!(d.export().unwrap(), table);
        d.truncate(0).unwrap();
        assert_eq!(d.byte_size(), 0);
        assert_eq!(d.kv_type(), KvType::F16);
    }

    #[test]
    fn kv_type_parses_its_names_only() {
        for t in [KvType::F32, KvType::F16] {
            assert_eq!(t.name().parse::<KvType>(), Ok(t));
        }
        assert!("q8_0".parse::<KvType>().is_err());
    }
}
