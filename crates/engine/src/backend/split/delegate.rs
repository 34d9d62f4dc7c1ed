//! [`Split`]'s op inventory: every op on the home device, except the
//! routed experts ([`super::exchange`]). The delegating methods are
//! mechanical: one per op of [`Backend`], defaults included, so the home
//! backend's own overrides run (not the trait's composed defaults), except
//! `experts_swiglu_gated`, whose default composes the group's
//! `experts_swiglu` with the home's `add_gated_rows`, and `experts_slots`
//! (a group is not itself a shard). A new
//! op without a default fails to compile here; a new op with one must be
//! added by hand, or a group runs the composed default (same bits by the
//! op's contract, but not the home's fused kernel).

use super::Split;
use super::exchange::{self, SplitExperts};
use crate::backend::*;
use crate::error::Result;

impl<B: Backend> Backend for Split<B> {
    type Buf = B::Buf;
    type Matrix = B::Matrix;
    type Experts = SplitExperts<B>;
    type Table = B::Table;
    type Selection = B::Selection;
    type Routing = B::Routing;
    type Step = B::Step;
    type Half = B::Half;

    fn experts(&self, w: HostWeight, e: usize, out: usize, inp: usize) -> Result<SplitExperts<B>> {
        self.place_experts(w, e, out, inp)
    }

    fn experts_swiglu(
        &self,
        x: &B::Buf,
        rows: usize,
        routing: &B::Routing,
        gate_up: &SplitExperts<B>,
        down: &SplitExperts<B>,
        limit: Option<f32>,
    ) -> Result<B::Buf> {
        exchange::experts_swiglu(&self.group(), x, rows, routing, gate_up, down, limit)
    }

    fn id(&self) -> BackendId {
        self.home().id()
    }

    fn upload(&self, host: &[f32]) -> Result<B::Buf> {
        self.home().upload(host)
    }

    fn download(&self, x: &B::Buf) -> Result<Vec<f32>> {
        self.home().download(x)
    }

    fn download_parts(&self, x: &B::Buf, lens: &[usize]) -> Result<Vec<Vec<f32>>> {
        self.home().download_parts(x, lens)
    }

    fn zeros(&self, n: usize) -> Result<B::Buf> {
        self.home().zeros(n)
    }

    fn len(&self, x: &B::Buf) -> usize {
        self.home().len(x)
    }

    fn rows(&self, x: &B::Buf, width: usize, first: usize, count: usize) -> Result<B::Buf> {
        self.home().rows(x, width, first, count)
    }

    fn append(&self, dst: &mut B::Buf, src: &B::Buf) -> Result<()> {
        self.home().append(dst, src)
    }

    fn truncate(&self, dst: &mut B::Buf, n: usize) -> Result<()> {
        self.home().truncate(dst, n)
    }

    fn concat_cols(&self, parts: &[(&B::Buf, usize)], rows: usize) -> Result<B::Buf> {
        self.home().concat_cols(parts, rows)
    }

    fn split_cols(
        &self,
        x: &B::Buf,
        rows: usize,
        parts: &[usize],
        repeats: usize,
    ) -> Result<Vec<B::Buf>> {
        self.home().split_cols(x, rows, parts, repeats)
    }

    fn matrix(&self, w: HostWeight, out: usize, inp: usize) -> Result<B::Matrix> {
        self.home().matrix(w, out, inp)
    }

    fn table(&self, w: HostWeight, rows: usize, width: usize) -> Result<B::Table> {
        self.home().table(w, rows, width)
    }

    fn gather_rows(&self, table: &B::Table, ids: &[u32]) -> Result<B::Buf> {
        self.home().gather_rows(table, ids)
    }

    fn matmul(&self, x: &B::Buf, rows: usize, w: &B::Matrix) -> Result<B::Buf> {
        self.home().matmul(x, rows, w)
    }

    fn matmul_unary(
        &self,
        x: &B::Buf,
        rows: usize,
        w: &B::Matrix,
        chain: &[Unary],
    ) -> Result<B::Buf> {
        self.home().matmul_unary(x, rows, w, chain)
    }

    fn matmul_many(
        &self,
        x: &B::Buf,
        rows: usize,
        parts: &[(&B::Matrix, Epilogue<'_>)],
    ) -> Result<Vec<B::Buf>> {
        self.home().matmul_many(x, rows, parts)
    }

    fn matmul_grouped(&self, x: &B::Buf, rows: usize, parts: &[&B::Matrix]) -> Result<B::Buf> {
        self.home().matmul_grouped(x, rows, parts)
    }

    fn sum_slots(
        &self,
        ys: &B::Buf,
        rows: usize,
        routing: &B::Routing,
        width: usize,
    ) -> Result<B::Buf> {
        self.home().sum_slots(ys, rows, routing, width)
    }

    fn routing_upload(&self, experts: &[usize], weights: &[f32], k: usize) -> Result<B::Routing> {
        self.home().routing_upload(experts, weights, k)
    }

    fn route_softmax_topk(
        &self,
        logits: &B::Buf,
        rows: usize,
        experts: usize,
        k: usize,
        renormalise: bool,
    ) -> Result<B::Routing> {
        self.home()
            .route_softmax_topk(logits, rows, experts, k, renormalise)
    }

    fn route_scored(
        &self,
        logits: &B::Buf,
        rows: usize,
        bias: Option<&B::Buf>,
        fixed: Option<&[u32]>,
        spec: &RouterSpec,
    ) -> Result<B::Routing> {
        self.home().route_scored(logits, rows, bias, fixed, spec)
    }

    fn routing_to_host(&self, r: &B::Routing) -> Result<(Vec<usize>, Vec<f32>)> {
        self.home().routing_to_host(r)
    }

    fn rms_norm(&self, x: &B::Buf, width: usize, w: &B::Buf, eps: f32) -> Result<B::Buf> {
        self.home().rms_norm(x, width, w, eps)
    }

    fn rms_norm_grouped(
        &self,
        x: &B::Buf,
        width: usize,
        group: usize,
        scale: &B::Buf,
        eps: f64,
    ) -> Result<B::Buf> {
        self.home().rms_norm_grouped(x, width, group, scale, eps)
    }

    fn rms_norm_heads(&self, x: &mut B::Buf, dim: usize, scale: &B::Buf, eps: f32) -> Result<()> {
        self.home().rms_norm_heads(x, dim, scale, eps)
    }

    fn l2_norm_heads(&self, x: &mut B::Buf, dim: usize, scale: f32) -> Result<()> {
        self.home().l2_norm_heads(x, dim, scale)
    }

    fn gated_rms_norm(
        &self,
        o: &B::Buf,
        z: &B::Buf,
        w: &B::Buf,
        eps: f32,
        act: GateAct,
    ) -> Result<B::Buf> {
        self.home().gated_rms_norm(o, z, w, eps, act)
    }

    fn layer_norm(
        &self,
        x: &B::Buf,
        width: usize,
        w: &B::Buf,
        b: &B::Buf,
        eps: f32,
    ) -> Result<B::Buf> {
        self.home().layer_norm(x, width, w, b, eps)
    }

    fn rope(
        &self,
        x: &mut B::Buf,
        head_dim: usize,
        cos: &B::Buf,
        sin: &B::Buf,
        half: usize,
        layout: RopeLayout,
    ) -> Result<()> {
        self.home().rope(x, head_dim, cos, sin, half, layout)
    }

    fn causal_conv_silu(
        &self,
        u: &B::Buf,
        window: &mut B::Buf,
        w: &B::Buf,
        channels: usize,
        kernel: usize,
        dilation: usize,
    ) -> Result<B::Buf> {
        self.home()
            .causal_conv_silu(u, window, w, channels, kernel, dilation)
    }

    fn delta_inputs(
        &self,
        d: ScanDims,
        u: &B::Buf,
        window: &mut B::Buf,
        w: &B::Buf,
        kernel: usize,
        q_scale: f32,
        a: &B::Buf,
        neg_a: &B::Buf,
        dt_bias: &B::Buf,
    ) -> Result<[B::Buf; 4]> {
        self.home()
            .delta_inputs(d, u, window, w, kernel, q_scale, a, neg_a, dt_bias)
    }

    fn delta_rule_scan(
        &self,
        d: ScanDims,
        q: &B::Buf,
        k: &B::Buf,
        v: &B::Buf,
        g: &B::Buf,
        beta: &B::Buf,
        s: &mut B::Buf,
    ) -> Result<B::Buf> {
        self.home().delta_rule_scan(d, q, k, v, g, beta, s)
    }

    fn kda_gate(
        &self,
        f: &B::Buf,
        a: &B::Buf,
        dt_bias: &B::Buf,
        dim: usize,
        lower_bound: Option<f32>,
    ) -> Result<B::Buf> {
        self.home().kda_gate(f, a, dt_bias, dim, lower_bound)
    }

    fn attention_causal(
        &self,
        q: &B::Buf,
        k: &[&B::Buf],
        v: &[&B::Buf],
        offset: usize,
        q_heads: usize,
        kv: Heads,
    ) -> Result<B::Buf> {
        self.home().attention_causal(q, k, v, offset, q_heads, kv)
    }

    fn attention_causal_batch(
        &self,
        parts: &[CausalPart<'_, B::Buf, B::Buf>],
        q_heads: usize,
        kv: Heads,
    ) -> Result<B::Buf> {
        self.home().attention_causal_batch(parts, q_heads, kv)
    }

    fn attention_causal_rows(
        &self,
        q: &B::Buf,
        parts: &[CausalRows<'_, B::Buf>],
        q_heads: usize,
        kv: Heads,
    ) -> Result<B::Buf> {
        self.home().attention_causal_rows(q, parts, q_heads, kv)
    }

    fn append_head_rows(&self, width: usize, targets: &mut [HeadRows<'_, B::Buf>]) -> Result<()> {
        self.home().append_head_rows(width, targets)
    }

    fn block_keys(
        &self,
        raw: &B::Buf,
        dim: usize,
        ratio: usize,
        first: usize,
        last: usize,
    ) -> Result<B::Buf> {
        self.home().block_keys(raw, dim, ratio, first, last)
    }

    fn indexer_select(
        &self,
        q: &B::Buf,
        blocks: &B::Buf,
        base: usize,
        shape: IndexerShape,
    ) -> Result<B::Selection> {
        self.home().indexer_select(q, blocks, base, shape)
    }

    fn selection_to_host(&self, s: &B::Selection) -> Result<Vec<Vec<u32>>> {
        self.home().selection_to_host(s)
    }

    fn selection_from_host(&self, rows: &[Vec<u32>], bound: usize) -> Result<B::Selection> {
        self.home().selection_from_host(rows, bound)
    }

    fn expand_pools(
        &self,
        pools: &B::Selection,
        base: usize,
        pool: usize,
        tail: bool,
    ) -> Result<B::Selection> {
        self.home().expand_pools(pools, base, pool, tail)
    }

    fn attention_gathered(
        &self,
        q: &B::Buf,
        k: &B::Buf,
        v: &B::Buf,
        keep: &B::Selection,
        q_heads: usize,
        kv: Heads,
        sinks: Option<&B::Buf>,
    ) -> Result<B::Buf> {
        self.home()
            .attention_gathered(q, k, v, keep, q_heads, kv, sinks)
    }

    fn attention_window(
        &self,
        q: &B::Buf,
        heads: usize,
        dim: usize,
        query_first: usize,
        window: &B::Buf,
        window_first: usize,
        span: usize,
        entries: &B::Buf,
        keep: EntryKeep<'_, B::Selection>,
        sinks: &B::Buf,
    ) -> Result<B::Buf> {
        self.home().attention_window(
            q,
            heads,
            dim,
            query_first,
            window,
            window_first,
            span,
            entries,
            keep,
            sinks,
        )
    }

    fn softmax_pool(&self, kv: &B::Buf, gate: &B::Buf, slots: usize, dim: usize) -> Result<B::Buf> {
        self.home().softmax_pool(kv, gate, slots, dim)
    }

    fn index_scores(
        &self,
        q: &B::Buf,
        weights: &B::Buf,
        keys: &B::Buf,
        rows: usize,
        heads: usize,
        dim: usize,
        scale: f32,
        w_scale: f32,
    ) -> Result<B::Buf> {
        self.home()
            .index_scores(q, weights, keys, rows, heads, dim, scale, w_scale)
    }

    fn select_topk(
        &self,
        scores: &B::Buf,
        rows: usize,
        width: usize,
        limits: &[usize],
        k: usize,
    ) -> Result<B::Selection> {
        self.home().select_topk(scores, rows, width, limits, k)
    }

    fn add(&self, a: &B::Buf, b: &B::Buf) -> Result<B::Buf> {
        self.home().add(a, b)
    }

    fn add_bias(&self, x: &B::Buf, b: &B::Buf, width: usize) -> Result<B::Buf> {
        self.home().add_bias(x, b, width)
    }

    fn gelu(&self, x: &B::Buf, form: GeluForm) -> Result<B::Buf> {
        self.home().gelu(x, form)
    }

    fn mul(&self, a: &B::Buf, b: &B::Buf) -> Result<B::Buf> {
        self.home().mul(a, b)
    }

    fn affine(&self, x: &B::Buf, mul: f32, add: f32) -> Result<B::Buf> {
        self.home().affine(x, mul, add)
    }

    fn silu(&self, x: &B::Buf) -> Result<B::Buf> {
        self.home().silu(x)
    }

    fn sigmoid(&self, x: &B::Buf) -> Result<B::Buf> {
        self.home().sigmoid(x)
    }

    fn unary_chain(&self, x: &B::Buf, chain: &[Unary]) -> Result<B::Buf> {
        self.home().unary_chain(x, chain)
    }

    fn swiglu(&self, gu: &B::Buf, inter: usize, limit: Option<f32>) -> Result<B::Buf> {
        self.home().swiglu(gu, inter, limit)
    }

    fn softplus_decay(&self, a: &B::Buf, neg_a: &B::Buf, dt_bias: &B::Buf) -> Result<B::Buf> {
        self.home().softplus_decay(a, neg_a, dt_bias)
    }

    fn scale_rows(&self, x: &B::Buf, s: &B::Buf, width: usize) -> Result<B::Buf> {
        self.home().scale_rows(x, s, width)
    }

    fn add_gated_rows(
        &self,
        base: &B::Buf,
        x: &B::Buf,
        g: &B::Buf,
        width: usize,
    ) -> Result<B::Buf> {
        self.home().add_gated_rows(base, x, g, width)
    }

    fn ple_gate(
        &self,
        key: &B::Buf,
        qry: &B::Buf,
        val: &B::Buf,
        c: usize,
        h: usize,
    ) -> Result<B::Buf> {
        self.home().ple_gate(key, qry, val, c, h)
    }

    fn hc_sinkhorn(
        &self,
        z: &B::Buf,
        base: &B::Buf,
        scale: &B::Buf,
        n: usize,
        iters: usize,
        eps: f32,
    ) -> Result<B::Buf> {
        self.home().hc_sinkhorn(z, base, scale, n, iters, eps)
    }

    fn hc_pre(&self, xs: &B::Buf, mix: &B::Buf, n: usize) -> Result<B::Buf> {
        self.home().hc_pre(xs, mix, n)
    }

    fn hc_post(&self, xs: &B::Buf, y: &B::Buf, mix: &B::Buf, n: usize) -> Result<B::Buf> {
        self.home().hc_post(xs, y, mix, n)
    }

    fn tile_streams(&self, x: &B::Buf, c: usize, h: usize) -> Result<B::Buf> {
        self.home().tile_streams(x, c, h)
    }

    fn mean_streams(&self, x: &B::Buf, c: usize, h: usize) -> Result<B::Buf> {
        self.home().mean_streams(x, c, h)
    }

    fn gated_mean_streams(&self, gates: &B::Buf, x: &B::Buf, c: usize, h: usize) -> Result<B::Buf> {
        self.home().gated_mean_streams(gates, x, c, h)
    }

    fn matmul_gated_mean(
        &self,
        x: &B::Buf,
        rows: usize,
        w: &B::Matrix,
        streams: &B::Buf,
        c: usize,
        h: usize,
    ) -> Result<B::Buf> {
        self.home().matmul_gated_mean(x, rows, w, streams, c, h)
    }

    fn rms_matmul(
        &self,
        x: &B::Buf,
        rows: usize,
        ones: &B::Buf,
        w: &B::Matrix,
        eps: f32,
    ) -> Result<B::Buf> {
        self.home().rms_matmul(x, rows, ones, w, eps)
    }

    fn inject_streams(&self, xs: &B::Buf, y: &B::Buf, inj: &B::Buf, c: usize) -> Result<B::Buf> {
        self.home().inject_streams(xs, y, inj, c)
    }

    fn inject_streams_norm(
        &self,
        xs: &B::Buf,
        y: &B::Buf,
        inj: &B::Buf,
        c: usize,
        scale: &B::Buf,
        eps: f64,
    ) -> Result<[B::Buf; 2]> {
        self.home().inject_streams_norm(xs, y, inj, c, scale, eps)
    }

    fn step_graphs(&self) -> bool {
        self.home().step_graphs()
    }

    fn storage_key(&self, x: &B::Buf) -> [u64; 2] {
        self.home().storage_key(x)
    }

    fn run_step(
        &self,
        key: &[u64],
        pos: usize,
        ids: &[u32],
        body: &mut StepBody<'_, B::Step, B::Buf>,
    ) -> Result<Vec<B::Buf>> {
        self.home().run_step(key, pos, ids, body)
    }

    fn run_pure(
        &self,
        key: &[u64],
        inputs: &[&B::Buf],
        body: &mut PureBody<'_, B::Buf>,
    ) -> Result<Vec<B::Buf>> {
        // A unit holding an exchange reads the routing back on the host,
        // which a captured graph cannot: a group runs its units eagerly
        // (the same launches, so the same bits); a group of one replays.
        if self.devices.len() > 1 {
            return body(inputs);
        }
        self.home().run_pure(key, inputs, body)
    }

    fn resize(&self, dst: &mut B::Buf, n: usize, grow_to: usize) -> Result<()> {
        self.home().resize(dst, n, grow_to)
    }

    fn gather_rows_step(&self, table: &B::Table, step: &B::Step) -> Result<B::Buf> {
        self.home().gather_rows_step(table, step)
    }

    fn rows_step(&self, x: &B::Buf, width: usize, step: &B::Step, count: usize) -> Result<B::Buf> {
        self.home().rows_step(x, width, step, count)
    }

    fn write_rows_step(
        &self,
        dst: &mut B::Buf,
        src: &B::Buf,
        width: usize,
        step: &B::Step,
    ) -> Result<()> {
        self.home().write_rows_step(dst, src, width, step)
    }

    fn attention_causal_step(
        &self,
        q: &B::Buf,
        k: &[&B::Buf],
        v: &[&B::Buf],
        step: &B::Step,
        q_heads: usize,
        kv: Heads,
    ) -> Result<B::Buf> {
        self.home()
            .attention_causal_step(q, k, v, step, q_heads, kv)
    }

    fn half_empty(&self) -> Result<B::Half> {
        self.home().half_empty()
    }

    fn half_len(&self, x: &B::Half) -> usize {
        self.home().half_len(x)
    }

    fn half_append(&self, dst: &mut B::Half, src: &B::Buf) -> Result<()> {
        self.home().half_append(dst, src)
    }

    fn half_truncate(&self, dst: &mut B::Half, n: usize) -> Result<()> {
        self.home().half_truncate(dst, n)
    }

    fn half_download(&self, x: &B::Half) -> Result<Vec<f32>> {
        self.home().half_download(x)
    }

    fn attention_causal_half(
        &self,
        q: &B::Buf,
        k: &[&B::Half],
        v: &[&B::Half],
        offset: usize,
        q_heads: usize,
        kv: Heads,
    ) -> Result<B::Buf> {
        self.home()
            .attention_causal_half(q, k, v, offset, q_heads, kv)
    }

    fn attention_causal_half_batch(
        &self,
        parts: &[CausalPart<'_, B::Buf, B::Half>],
        q_heads: usize,
        kv: Heads,
    ) -> Result<B::Buf> {
        self.home().attention_causal_half_batch(parts, q_heads, kv)
    }
}
