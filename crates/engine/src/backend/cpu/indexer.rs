//! QSA block selection on the CPU: a score per complete block and a
//! partial sort per query.

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn select_keeps_tail_and_may_drop_diagonal() {
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
