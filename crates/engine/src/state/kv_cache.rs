//! Per-layer key/value caches for softmax attention: one [`RowCache`] of
//! `[P, head_dim]` rows per layer and kv head for keys and one for values,
//! on the backend's device, so each head's keys are contiguous for the
//! attention kernel. A decode step appends one row per head (amortised
//! O(1)); snapshots are deep copies of the valid rows.
//!
//! The exported table is the checkpoint format of the first releases:
//! `kv.{l}.k` / `kv.{l}.v` as `[kv_heads, len, head_dim]` (head-major).

use crate::backend::Backend;
use crate::error::{EngineError, Result};
use crate::state::rows::RowCache;
use crate::state::table::{NamedTensor, TableReader};

#[derive(Debug, Clone)]
pub struct KvCache<B: Backend> {
    ops: B,
    /// `[layer][kv head]`.
    k: Vec<Vec<RowCache<B>>>,
    v: Vec<Vec<RowCache<B>>>,
    len: usize,
    max_len: usize,
    kv_heads: usize,
    head_dim: usize,
}

impl<B: Backend> KvCache<B> {
    /// An empty cache.
    pub fn new(
        ops: &B,
        num_layers: usize,
        kv_heads: usize,
        head_dim: usize,
        max_len: usize,
    ) -> Result<Self> {
        let rows = |_| {
            (0..kv_heads)
                .map(|_| RowCache::new(ops, head_dim))
                .collect::<Result<Vec<_>>>()
        };
        Ok(Self {
            ops: ops.clone(),
            k: (0..num_layers).map(rows).collect::<Result<_>>()?,
            v: (0..num_layers).map(rows).collect::<Result<_>>()?,
            len: 0,
            max_len,
            kv_heads,
            head_dim,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn num_layers(&self) -> usize {
        self.k.len()
    }

    /// Append this forward's `k, v: [t, kv_heads·head_dim]` to `layer` and
    /// return the layer's keys and values per head, `[len + t, head_dim]`.
    /// The length advances through [`KvCache::advance`] once every layer is
    /// done.
    #[allow(clippy::type_complexity)]
    pub fn write(
        &mut self,
        layer: usize,
        k: &B::Buf,
        v: &B::Buf,
    ) -> Result<(Vec<&B::Buf>, Vec<&B::Buf>)> {
        let (kc, vc) = match (self.k.get_mut(layer), self.v.get_mut(layer)) {
            (Some(k), Some(v)) => (k, v),
            _ => return Err(EngineError::State(format!("kv cache has no layer {layer}"))),
        };
        let t = self.ops.len(k) / (self.kv_heads * self.head_dim).max(1);
        let parts = vec![self.head_dim; self.kv_heads];
        for (src, heads) in [(k, &mut *kc), (v, &mut *vc)] {
            for (rows, cache) in self.ops.split_cols(src, t, &parts, 1)?.iter().zip(heads) {
                cache.append(&self.ops, rows)?;
            }
        }
        let rows = kc.first().map_or(0, |c| c.rows());
        if rows > self.max_len {
            return Err(EngineError::ContextOverflow {
                needed: rows,
                limit: self.max_len,
            });
        }
        Ok((
            kc.iter().map(|c| c.buf()).collect(),
            vc.iter().map(|c| c.buf()).collect(),
        ))
    }

    /// Make room for a step of `t` rows: every cache covers `len + t` rows
    /// in storage of its own (grown by doubling, so the storage of
    /// successive steps stays the same between growth points); the rows
    /// are written by [`KvCache::write_step`]. Undone by
    /// [`KvCache::rollback`], kept by [`KvCache::advance`].
    pub fn prepare_step(&mut self, t: usize) -> Result<()> {
        let (ops, rows, max) = (self.ops.clone(), self.len + t, self.max_len);
        if rows > max {
            return Err(EngineError::ContextOverflow {
                needed: rows,
                limit: max,
            });
        }
        for c in self.caches_mut() {
            c.resize_rows(&ops, rows, max)?;
        }
        Ok(())
    }

    /// The storage of every cache (part of a step's key).
    pub fn storage_keys(&self) -> Vec<u64> {
        self.caches()
            .flat_map(|c| self.ops.storage_key(c.buf()))
            .collect()
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
    ) -> Result<(Vec<&B::Buf>, Vec<&B::Buf>)> {
        let (kc, vc) = match (self.k.get_mut(layer), self.v.get_mut(layer)) {
            (Some(k), Some(v)) => (k, v),
            _ => return Err(EngineError::State(format!("kv cache has no layer {layer}"))),
        };
        let t = self.ops.len(k) / (self.kv_heads * self.head_dim).max(1);
        let parts = vec![self.head_dim; self.kv_heads];
        for (src, heads) in [(k, &mut *kc), (v, &mut *vc)] {
            for (rows, cache) in self.ops.split_cols(src, t, &parts, 1)?.iter().zip(heads) {
                cache.write_step(&self.ops, rows, step)?;
            }
        }
        Ok((
            kc.iter().map(|c| c.buf()).collect(),
            vc.iter().map(|c| c.buf()).collect(),
        ))
    }

    /// Every layer was written `t` rows: the cache now covers them.
    pub fn advance(&mut self, t: usize) -> Result<()> {
        let end = self.len + t;
        if self.caches().any(|c| c.rows() != end) {
            return Err(EngineError::State(format!(
                "kv cache advance to {end} with layers written unevenly"
            )));
        }
        self.len = end;
        Ok(())
    }

    fn caches(&self) -> impl Iterator<Item = &RowCache<B>> {
        self.k.iter().chain(&self.v).flatten()
    }

    fn caches_mut(&mut self) -> impl Iterator<Item = &mut RowCache<B>> {
        self.k.iter_mut().chain(self.v.iter_mut()).flatten()
    }

    /// Forget rows written after the last [`KvCache::advance`] (a forward
    /// that failed half way leaves the cache as it was).
    pub fn rollback(&mut self) -> Result<()> {
        let (ops, len) = (self.ops.clone(), self.len);
        for c in self.caches_mut() {
            c.truncate(&ops, len)?;
        }
        Ok(())
    }

    /// Keep the first `n` positions.
    pub fn truncate(&mut self, n: usize) -> Result<()> {
        if n > self.len {
            return Err(EngineError::State(format!(
                "cannot truncate a kv cache of {} positions to {n}",
                self.len
            )));
        }
        let ops = self.ops.clone();
        for c in self.caches_mut() {
            c.truncate(&ops, n)?;
        }
        self.len = n;
        Ok(())
    }

    /// The valid rows of every layer as host tensors `kv.{l}.k` / `kv.{l}.v`,
    /// `[kv_heads, len, head_dim]`.
    pub fn export(&self) -> Result<Vec<NamedTensor>> {
        let shape = vec![self.kv_heads, self.len, self.head_dim];
        let mut out = Vec::with_capacity(2 * self.num_layers());
        for l in 0..self.num_layers() {
            for (what, heads) in [("k", &self.k[l]), ("v", &self.v[l])] {
                let mut hm = Vec::with_capacity(self.kv_heads * self.len * self.head_dim);
                for c in heads {
                    hm.extend(self.ops.download(c.buf())?);
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
        for (l, (k, v)) in layers.into_iter().enumerate() {
            for (hm, heads) in [(k, &mut self.k[l]), (v, &mut self.v[l])] {
                for (chunk, c) in hm.chunks(per_head.max(1)).zip(heads.iter_mut()) {
                    c.append(&self.ops, &self.ops.upload(chunk)?)?;
                }
            }
        }
        self.len = rows;
        Ok(())
    }

    /// Bytes of cache memory held (valid rows, all layers, k and v).
    pub fn byte_size(&self) -> usize {
        self.caches().map(|c| c.byte_size()).sum()
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
        let (k, _) = c.write(0, &rows(1, 2, 9.0), &rows(1, 2, 9.0)).unwrap();
        assert_eq!(k, vec![&vec![0.0, 1.0, 9.0, 10.0]]);
        assert!(matches!(
            KvCache::new(&ops, 1, 1, 2, 2)
                .unwrap()
                .write(0, &rows(3, 2, 0.0), &rows(3, 2, 0.0)),
            Err(EngineError::ContextOverflow { .. })
        ));
    }
}
