//! GLM-5's DSA selection from pools to tokens on the CPU: every selected
//! pool becomes its tokens, then the query's incomplete tail pool joins
//! (`index_kpool_always_select_tail`).

/// See [`crate::backend::Backend::expand_pools`]. A pool that is not
/// complete and visible for its query is refused (it would break
/// causality).
pub fn expand_pools(
    pools: &[Vec<u32>],
    base: usize,
    pool: usize,
    tail: bool,
) -> Result<Vec<Vec<u32>>, String> {
    if pool == 0 {
        return Err("pools of 0 tokens".into());
    }
    pools
        .iter()
        .enumerate()
        .map(|(r, ps)| {
            let t = base + r;
            let complete = (t + 1) / pool;
            let mut out = Vec::with_capacity(ps.len() * pool + pool - 1);
            for &p in ps {
                let p = p as usize;
                if p >= complete {
                    return Err(format!(
                        "pool {p} is not complete for the query at token {t} (pools of {pool})"
                    ));
                }
                out.extend((p * pool..(p + 1) * pool).map(|i| i as u32));
            }
            if tail {
                out.extend((complete * pool..=t).map(|i| i as u32));
            }
            Ok(out)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pools_expand_with_the_tail_and_refuse_the_future() {
        // Queries at tokens 9, 10, 11 with pools of 4.
        let sel = vec![vec![0, 1], vec![1], vec![0, 2]];
        let out = expand_pools(&sel, 9, 4, true).unwrap();
        assert_eq!(out[0], vec![0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
        assert_eq!(out[1], vec![4, 5, 6, 7, 8, 9, 10]);
        // Token 11 completes pool 2: no tail.
        assert_eq!(out[2], vec![0, 1, 2, 3, 8, 9, 10, 11]);
        assert_eq!(
            expand_pools(&sel, 9, 4, false).unwrap()[1],
            vec![4, 5, 6, 7]
        );
        // Pool 2 is incomplete for the query at token 9.
        assert!(expand_pools(&[vec![2]], 9, 4, true).is_err());
        // A query before its first complete pool sees only its tail.
        assert_eq!(
            expand_pools(&[vec![]], 2, 4, true).unwrap()[0],
            vec![0, 1, 2]
        );
    }
}
