//! The QSA indexer (`self_attn.indexer`): which cached tokens each query of
//! an attention layer may attend to.
//!
//! ```text
//! [q (nI×dI) | k (dI)] = index_qk_proj·x
//! qI_h   = RoPE_R( N1(q_h; q_layernorm), pos_t )     rotates the first R of dI dims
//! kraw   = k                                         cached raw: [P, dI]
//! kb_j   = RoPE_R( N1( mean(kraw[j·ratio .. (j+1)·ratio]); k_layernorm ), pos of the block's first token )
//! score_j = Σ_h relu(qI_h · kb_j) / √dI              fp32
//! keep   = tokens of the top min(block_topk, nb) blocks ∪ the incomplete tail
//! ```
//!
//! For a query at index `t` (batch 1, no padding) the visible tokens are
//! `0..=t`, `nb = ⌊(t+1)/ratio⌋` blocks are complete and the tail is
//! `nb·ratio..=t`. Nothing is pruned until a query sees `budget + ratio`
//! tokens; the query's own token can be dropped (its block may be complete
//! and not chosen) — the diagonal is *not* forced.
//!
//! Block keys depend only on their own complete block, so they are computed
//! once when the block completes and cached ([`AttnCache::blocks`]). The
//! selection ([`select_blocks`]) is a host kernel: a score per block and a
//! partial sort; it is the seam for an accelerator kernel.

use candle_core::Tensor;

use super::gated_attention::MRope;
use super::kernels::Dense;
use super::norms::{ZcNorm, load, to_vec};
use super::state::AttnCache;
use crate::error::Result;
use crate::load::safetensors::SafetensorsDir;

#[derive(Debug, Clone)]
pub struct Indexer {
    qk: Dense,
    q_norm: ZcNorm,
    k_norm: ZcNorm,
    pub n_heads: usize,
    pub dim: usize,
    pub ratio: usize,
    pub block_topk: usize,
}

/// Score every complete block for one query and return the kept token
/// indices (ascending): the top `block_topk` blocks plus the tail.
///
/// `q: [nI, dI]`, `blocks: [≥nb, dI]`, `visible` tokens `0..visible`;
/// `scores` is scratch space reused across queries.
#[allow(clippy::too_many_arguments)] // a kernel over flat slices
pub fn select_blocks(
    q: &[f32],
    blocks: &[f32],
    visible: usize,
    n_heads: usize,
    dim: usize,
    ratio: usize,
    block_topk: usize,
    scores: &mut Vec<(f32, usize)>,
) -> Vec<u32> {
    let nb = visible / ratio;
    let scale = 1.0 / (dim as f32).sqrt();
    scores.clear();
    for j in 0..nb {
        let kb = &blocks[j * dim..(j + 1) * dim];
        let mut sum = 0f32;
        for h in 0..n_heads {
            let qh = &q[h * dim..(h + 1) * dim];
            let dot: f32 = qh.iter().zip(kb).map(|(a, b)| a * b).sum();
            sum += dot.max(0.0);
        }
        scores.push((sum * scale, j));
    }
    let k = block_topk.min(nb);
    if k < nb {
        // Highest scores first; exact ties (e.g. several all-zero blocks)
        // resolve to the lower block index. torch.topk leaves that order
        // unspecified, so fixtures are built without boundary ties.
        scores.select_nth_unstable_by(k - 1, |a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        scores.truncate(k);
    }
    let mut chosen: Vec<usize> = scores.iter().map(|&(_, j)| j).collect();
    chosen.sort_unstable();
    let mut keep = Vec::with_capacity(k * ratio + ratio);
    for j in chosen {
        keep.extend((j * ratio..(j + 1) * ratio).map(|i| i as u32));
    }
    keep.extend((nb * ratio..visible).map(|i| i as u32));
    keep
}

impl Indexer {
    #[allow(clippy::too_many_arguments)]
    pub fn load(
        st: &mut SafetensorsDir,
        prefix: &str,
        h: usize,
        n_heads: usize,
        dim: usize,
        budget: usize,
        ratio: usize,
        eps: f64,
    ) -> Result<Self> {
        Ok(Self {
            qk: Dense::new(load(
                st,
                prefix,
                "index_qk_proj.weight",
                &[(n_heads + 1) * dim, h],
            )?)?,
            q_norm: ZcNorm::load(st, prefix, "q_layernorm.weight", dim, dim, eps)?,
            k_norm: ZcNorm::load(st, prefix, "k_layernorm.weight", dim, dim, eps)?,
            n_heads,
            dim,
            ratio,
            block_topk: budget / ratio,
        })
    }

    /// Append the new tokens' raw keys (and any newly complete block keys) to
    /// `cache`, then select for every new query. `x: [T, H]`; `positions`
    /// covers every cached token including the new ones; the new queries are
    /// the last `T`. Returns, per query, the kept token indices (ascending).
    pub fn forward(
        &self,
        x: &Tensor,
        cache: &mut AttnCache,
        positions: &[[u32; 3]],
        rope: &MRope,
    ) -> Result<Vec<Vec<u32>>> {
        let t_len = x.dim(0)?;
        let (nh, d) = (self.n_heads, self.dim);
        let qk = to_vec(&self.qk.forward(x)?)?;
        let row = (nh + 1) * d;
        for r in qk.chunks_exact(row) {
            cache.idx_raw.extend_from_slice(&r[nh * d..]);
        }
        let total = cache.idx_raw.len() / d;
        let base = total - t_len;
        let mut kb = vec![0f32; d];
        for j in cache.blocks.len() / d..total / self.ratio {
            kb.fill(0.0);
            for i in j * self.ratio..(j + 1) * self.ratio {
                for (a, b) in kb.iter_mut().zip(&cache.idx_raw[i * d..(i + 1) * d]) {
                    *a += b;
                }
            }
            for a in kb.iter_mut() {
                *a /= self.ratio as f32;
            }
            self.k_norm.apply_host(&mut kb);
            rope.apply(&mut kb, positions[j * self.ratio]);
            cache.blocks.extend_from_slice(&kb);
        }
        let mut out = Vec::with_capacity(t_len);
        let mut q = vec![0f32; nh * d];
        let mut scores = Vec::new();
        for (i, r) in qk.chunks_exact(row).enumerate() {
            q.copy_from_slice(&r[..nh * d]);
            let pos = positions[base + i];
            for h in 0..nh {
                let qh = &mut q[h * d..(h + 1) * d];
                self.q_norm.apply_host(qh);
                rope.apply(qh, pos);
            }
            out.push(select_blocks(
                &q,
                &cache.blocks,
                base + i + 1,
                nh,
                d,
                self.ratio,
                self.block_topk,
                &mut scores,
            ));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qwen4_select_keeps_tail_and_may_drop_diagonal() {
        // 2 heads of dim 2, ratio 2, top 1 block, 5 visible tokens: blocks
        // 0 and 1 complete, token 4 is the tail.
        let q = [1.0, 0.0, 0.0, 1.0];
        let blocks = [1.0, 0.0, -1.0, -1.0];
        let mut s = Vec::new();
        assert_eq!(
            select_blocks(&q, &blocks, 5, 2, 2, 2, 1, &mut s),
            vec![0, 1, 4]
        );
        // With 4 visible (query at index 3) the query's own block 1 is
        // complete and loses: the diagonal is dropped.
        assert_eq!(
            select_blocks(&q, &blocks, 4, 2, 2, 2, 1, &mut s),
            vec![0, 1]
        );
        // No pruning while nb <= block_topk.
        assert_eq!(
            select_blocks(&q, &blocks, 4, 2, 2, 2, 2, &mut s),
            vec![0, 1, 2, 3]
        );
    }
}
