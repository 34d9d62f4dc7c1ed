//! Several sessions' causal attention in one pool dispatch (continuous
//! batching).
//!
//! A batched decode step attends once per session: alone, each session is
//! a dispatch of its own (a barrier per session and layer), and its few
//! tiles (3 kv heads of one decode row for the default model) split
//! unevenly over the threads. Here the tiles of every session that needs
//! no key transposition share one dispatch, each tile taking its kv head's
//! whole query group (which then reads each key once for the group).
//! Which rows share a tile and which thread runs it decide no bit (the
//! module docs of [`super`]), so every session's rows equal its attention
//! alone, bit for bit.

use super::{
    Grid, Isa, KvElem, KvHeads, Plan, TRANSPOSE_FROM_ROWS, View, causal_attention_planned,
    pool_threads, tile,
};
use crate::backend::cpu::SendPtr;

/// One session's share of [`causal_attention_batch`]: its query rows per
/// kv head (`group · t`, as [`super::causal_attention`] takes them), its
/// keys and values, its window and where its output rows go in the shared
/// output.
pub(crate) struct Session<'a, E> {
    pub q: View<'a>,
    pub k: View<'a, E>,
    pub v: View<'a, E>,
    pub t: usize,
    pub offset: usize,
    pub out_row: &'a (dyn Fn(usize, usize) -> usize + Sync),
}

/// Every session's [`super::causal_attention`] into `y`, with the same
/// bits. `kvh` kv heads of `d` dimensions and `group` query heads per kv
/// head, shared by the sessions (one model).
pub(crate) fn causal_attention_batch<E: KvElem>(
    kvh: usize,
    group: usize,
    d: usize,
    sessions: &[Session<'_, E>],
    y: &mut [f32],
) {
    causal_attention_batch_planned(
        crate::backend::cpu::block_matmul::isa(),
        super::plan(),
        pool_threads(),
        kvh,
        group,
        d,
        sessions,
        y,
    );
}

/// [`causal_attention_batch`] with the kernel set and plan named. Sessions
/// whose windows want transposed keys (prefill chunks, long verify
/// windows), and every session when too few tiles would share the
/// dispatch or a plan other than [`Plan::Auto`] is asked for, run alone.
/// `threads`: the pool's (a dispatch of fewer than four tiles a thread
/// is not worth sharing). Returns how many sessions shared the dispatch.
#[allow(clippy::too_many_arguments)]
pub(crate) fn causal_attention_batch_planned<E: KvElem>(
    isa: Isa,
    plan: Plan,
    threads: usize,
    kvh: usize,
    group: usize,
    d: usize,
    sessions: &[Session<'_, E>],
    y: &mut [f32],
) -> usize {
    let joins = |s: &Session<'_, E>| s.t > 0 && group * s.t < TRANSPOSE_FROM_ROWS;
    let grids: Vec<Option<Grid>> = sessions
        .iter()
        .map(|s| joins(s).then(|| Grid::new(group, s.t, s.offset, false)))
        .collect();
    let joined: Vec<(usize, Grid)> = grids
        .iter()
        .enumerate()
        .filter_map(|(i, g)| g.map(|g| (i, g)))
        .collect();
    let items: usize = joined.iter().map(|(_, g)| kvh * g.per_head()).sum();
    let together = plan == Plan::Auto && kvh > 0 && joined.len() > 1 && items >= 4 * threads.max(1);
    for (i, s) in sessions.iter().enumerate() {
        if !(together && grids[i].is_some()) {
            causal_attention_planned(
                isa,
                plan,
                &s.q,
                &s.k,
                &s.v,
                kvh,
                group * s.t,
                s.t,
                s.offset,
                d,
                y,
                s.out_row,
            );
        }
    }
    if !together {
        return 0;
    }
    for (i, _) in &joined {
        let s = &sessions[*i];
        assert!(
            s.k.stride == d && s.v.stride == d,
            "attention: rows must be packed"
        );
    }
    // Item `n` of the dispatch: session `joined[j]`'s item `n - starts[j]`.
    let starts: Vec<usize> = joined
        .iter()
        .scan(0, |at, (_, g)| {
            let start = *at;
            *at += kvh * g.per_head();
            Some(start)
        })
        .collect();
    let heads: Vec<KvHeads<'_, '_, E>> = joined
        .iter()
        .map(|(i, _)| KvHeads {
            k: &sessions[*i].k,
            v: &sessions[*i].v,
            transposed: None,
        })
        .collect();
    let y_ptr = SendPtr(y.as_mut_ptr());
    let y_len = y.len();
    candle_core::utils::barrier_pool().execute_chunked(items, |range| {
        let mut scratch = tile::Scratch::default();
        for item in range {
            let j = starts.partition_point(|&s| s <= item) - 1;
            let (i, grid) = joined[j];
            let s = &sessions[i];
            // SAFETY: `y` outlives the pool's join; every (session, kv
            // head, row) is in one item and owns its output row (the
            // sessions' `out_row`s are disjoint: the caller's layout).
            unsafe {
                grid.run_item(
                    isa,
                    item - starts[j],
                    &s.q,
                    &heads[j],
                    d,
                    (&y_ptr, y_len),
                    s.out_row,
                    &mut scratch,
                )
            };
        }
    });
    joined.len()
}
