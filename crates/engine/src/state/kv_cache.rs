//! Per-layer key/value caches for softmax attention.
//!
//! Each layer holds `k` and `v` buffers of shape `[kv_heads, capacity,
//! head_dim]`; the first `len` positions are valid. New rows are written in
//! place with `slice_set`, so a decode step costs no copy of the past; when
//! a forward needs more room every buffer is reallocated at twice the size
//! (capped at the context length) and the valid prefix copied once —
//! amortised O(1) per token, where `Tensor::cat` per step would be O(len).
//!
//! Writing in place means the buffers must never be shared between two
//! states: candle tensors share storage on `clone`, so [`KvCache::snapshot`]
//! copies the valid prefix into fresh storage.

use candle_core::{DType, Device, Tensor};

use crate::error::{EngineError, Result};

#[derive(Debug)]
struct LayerKv {
    k: Tensor,
    v: Tensor,
}

#[derive(Debug)]
pub struct KvCache {
    /// Empty until the first reservation, then `num_layers` entries.
    layers: Vec<LayerKv>,
    num_layers: usize,
    len: usize,
    capacity: usize,
    max_len: usize,
    kv_heads: usize,
    head_dim: usize,
    device: Device,
}

/// First allocation: enough for a short chat turn without regrowing.
const MIN_CAPACITY: usize = 256;

impl KvCache {
    /// An empty cache (no memory until the first [`KvCache::reserve`]).
    pub fn new(
        num_layers: usize,
        kv_heads: usize,
        head_dim: usize,
        max_len: usize,
        device: &Device,
    ) -> Self {
        Self {
            layers: Vec::new(),
            num_layers,
            len: 0,
            capacity: 0,
            max_len,
            kv_heads,
            head_dim,
            device: device.clone(),
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn num_layers(&self) -> usize {
        self.num_layers
    }

    /// Make room for `total` positions in every layer.
    pub fn reserve(&mut self, total: usize) -> Result<()> {
        if total <= self.capacity {
            return Ok(());
        }
        if total > self.max_len {
            return Err(EngineError::ContextOverflow {
                needed: total,
                limit: self.max_len,
            });
        }
        let cap = total
            .max(2 * self.capacity)
            .max(MIN_CAPACITY)
            .min(self.max_len);
        if self.layers.is_empty() {
            for _ in 0..self.num_layers {
                let shape = (self.kv_heads, cap, self.head_dim);
                self.layers.push(LayerKv {
                    k: Tensor::zeros(shape, DType::F32, &self.device)?,
                    v: Tensor::zeros(shape, DType::F32, &self.device)?,
                });
            }
            self.capacity = cap;
            return Ok(());
        }
        for layer in &mut self.layers {
            for buf in [&mut layer.k, &mut layer.v] {
                let fresh = Tensor::zeros(
                    (self.kv_heads, cap, self.head_dim),
                    DType::F32,
                    &self.device,
                )?;
                if self.len > 0 {
                    fresh.slice_set(&buf.narrow(1, 0, self.len)?.contiguous()?, 1, 0)?;
                }
                *buf = fresh;
            }
        }
        self.capacity = cap;
        Ok(())
    }

    /// Write `k, v: [kv_heads, t, head_dim]` for positions `len .. len + t`
    /// of `layer` (capacity must have been reserved) and return views of
    /// positions `0 .. len + t`, `[kv_heads, len + t, head_dim]`. The length
    /// advances only through [`KvCache::advance`], once every layer is done,
    /// so a forward that fails half way leaves the cache as it was.
    pub fn write(&mut self, layer: usize, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let t = k.dim(1)?;
        let end = self.len + t;
        if end > self.capacity {
            return Err(EngineError::State(format!(
                "kv cache write of {t} rows at {} exceeds reserved capacity {}",
                self.len, self.capacity
            )));
        }
        let l = self
            .layers
            .get(layer)
            .ok_or_else(|| EngineError::State(format!("kv cache has no layer {layer}")))?;
        l.k.slice_set(k, 1, self.len)?;
        l.v.slice_set(v, 1, self.len)?;
        Ok((l.k.narrow(1, 0, end)?, l.v.narrow(1, 0, end)?))
    }

    /// Commit `t` positions written to every layer.
    pub fn advance(&mut self, t: usize) -> Result<()> {
        if self.len + t > self.capacity {
            return Err(EngineError::State(format!(
                "cannot advance kv cache of {} by {t} beyond capacity {}",
                self.len, self.capacity
            )));
        }
        self.len += t;
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
        self.len = n;
        Ok(())
    }

    /// An independent copy holding exactly the valid positions.
    pub fn snapshot(&self) -> Result<Self> {
        let mut layers = Vec::with_capacity(self.layers.len());
        for l in &self.layers {
            // `force_contiguous` always allocates; `contiguous` would return
            // a storage-sharing view when the narrow happens to be contiguous.
            layers.push(LayerKv {
                k: l.k.narrow(1, 0, self.len)?.force_contiguous()?,
                v: l.v.narrow(1, 0, self.len)?.force_contiguous()?,
            });
        }
        Ok(Self {
            layers,
            num_layers: self.num_layers,
            len: self.len,
            capacity: self.len,
            max_len: self.max_len,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
            device: self.device.clone(),
        })
    }

    /// The valid rows of every layer as host tensors `kv.{l}.k` / `kv.{l}.v`,
    /// `[kv_heads, len, head_dim]`.
    pub fn export(&self) -> Result<Vec<crate::table::NamedTensor>> {
        use crate::table::NamedTensor;
        let shape = vec![self.kv_heads, self.len, self.head_dim];
        let mut out = Vec::with_capacity(2 * self.num_layers);
        for l in 0..self.num_layers {
            let (k, v) = match self.layers.get(l) {
                Some(layer) if self.len > 0 => (
                    layer.k.narrow(1, 0, self.len)?.flatten_all()?.to_vec1()?,
                    layer.v.narrow(1, 0, self.len)?.flatten_all()?.to_vec1()?,
                ),
                _ => (Vec::new(), Vec::new()),
            };
            out.push(NamedTensor::f32(format!("kv.{l}.k"), shape.clone(), k));
            out.push(NamedTensor::f32(format!("kv.{l}.v"), shape.clone(), v));
        }
        Ok(out)
    }

    /// Fill an empty cache from [`KvCache::export`]'s tensors.
    pub fn import(&mut self, tensors: Vec<crate::table::NamedTensor>) -> Result<()> {
        use crate::table::TableReader;
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
        let n = self.kv_heads * rows * self.head_dim;
        let mut layers = Vec::with_capacity(self.num_layers);
        for l in 0..self.num_layers {
            let k = r.f32(&format!("kv.{l}.k"), n)?;
            let v = r.f32(&format!("kv.{l}.v"), n)?;
            layers.push((k, v));
        }
        r.finish()?;
        if rows == 0 {
            return Ok(());
        }
        self.reserve(rows)?;
        let shape = (self.kv_heads, rows, self.head_dim);
        for (l, (k, v)) in layers.into_iter().enumerate() {
            let k = Tensor::from_vec(k, shape, &self.device)?;
            let v = Tensor::from_vec(v, shape, &self.device)?;
            self.write(l, &k, &v)?;
        }
        self.advance(rows)
    }

    /// Bytes of cache memory held (allocated capacity, all layers, k and v).
    pub fn byte_size(&self) -> usize {
        2 * self.num_layers
            * self.kv_heads
            * self.capacity
            * self.head_dim
            * DType::F32.size_in_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(kv_heads: usize, t: usize, d: usize, base: f32) -> Tensor {
        let v: Vec<f32> = (0..kv_heads * t * d).map(|i| base + i as f32).collect();
        Tensor::from_vec(v, (kv_heads, t, d), &Device::Cpu).unwrap()
    }

    fn write_all(c: &mut KvCache, k: &Tensor, v: &Tensor) -> (Tensor, Tensor) {
        let t = k.dim(1).unwrap();
        c.reserve(c.len() + t).unwrap();
        let mut out = None;
        for l in 0..c.num_layers() {
            out = Some(c.write(l, k, v).unwrap());
        }
        c.advance(t).unwrap();
        out.unwrap()
    }

    #[test]
    fn growth_keeps_the_valid_prefix() {
        let mut c = KvCache::new(2, 2, 4, 1000, &Device::Cpu);
        let a = rows(2, 200, 4, 0.0);
        write_all(&mut c, &a, &a);
        assert_eq!(c.capacity(), 256);
        let b = rows(2, 100, 4, 1e5);
        let (k, v) = write_all(&mut c, &b, &b);
        assert_eq!(c.capacity(), 512);
        assert_eq!(c.len(), 300);
        let want = Tensor::cat(&[&a, &b], 1).unwrap();
        assert_eq!(k.to_vec3::<f32>().unwrap(), want.to_vec3::<f32>().unwrap());
        assert_eq!(v.to_vec3::<f32>().unwrap(), want.to_vec3::<f32>().unwrap());
        // Capped at the context length.
        write_all(&mut c, &rows(2, 650, 4, 0.0), &rows(2, 650, 4, 0.0));
        assert_eq!(c.capacity(), 1000);
        assert!(matches!(
            c.reserve(1001),
            Err(EngineError::ContextOverflow { .. })
        ));
    }

    #[test]
    fn snapshot_is_independent_of_later_writes() {
        let mut c = KvCache::new(1, 1, 2, 64, &Device::Cpu);
        write_all(&mut c, &rows(1, 3, 2, 0.0), &rows(1, 3, 2, 0.0));
        let snap = c.snapshot().unwrap();
        c.truncate(1).unwrap();
        write_all(&mut c, &rows(1, 2, 2, 50.0), &rows(1, 2, 2, 50.0));
        let mut s2 = snap;
        let (k, _) = write_all(&mut s2, &rows(1, 1, 2, 9.0), &rows(1, 1, 2, 9.0));
        assert_eq!(
            k.to_vec3::<f32>().unwrap(),
            vec![vec![
                vec![0.0, 1.0],
                vec![2.0, 3.0],
                vec![4.0, 5.0],
                vec![9.0, 10.0]
            ]]
        );
        // k and v, 1 layer, 1 kv head, head_dim 2, f32.
        assert_eq!(s2.byte_size(), 2 * s2.capacity() * 2 * 4);
    }
}
