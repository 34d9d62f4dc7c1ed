//! [`CudaOps`] as the op inventory: each op checks its shapes (typed errors,
//! so no kernel reads out of bounds) and queues its kernels; the work is in
//! the modules named per group.

use super::buf::{self, CudaBuf};
use super::graph::{self, CudaStep};
use super::select::{self, CudaRouting, CudaSelection};
use super::weights::{self, CudaExperts, CudaMatrix, CudaTable};
use super::{
    CudaOps, attention, elementwise, expert_slots, fused, hc_fn, linear, norms, recurrent,
    row_blocks,
};
use crate::backend::composed;
use crate::backend::{
    Backend, BackendId, CausalRows, EntryKeep, Epilogue, GateAct, GeluForm, HeadRows, Heads,
    HostWeight, IndexerShape, PureBody, RopeLayout, RouterSpec, ScanDims, ScanPart, StepBody,
    Unary,
};
use crate::error::Result;

impl Backend for CudaOps {
    type Buf = CudaBuf;
    type Matrix = CudaMatrix;
    type Experts = CudaExperts;
    type Table = CudaTable;
    type Selection = CudaSelection;
    type Routing = CudaRouting;
    type Step = CudaStep;
    /// No f16 KV cache on CUDA yet: `--kv-cache f16` is refused at load
    /// (`half_empty`), so no value of this type ever exists.
    type Half = std::convert::Infallible;

    fn id(&self) -> BackendId {
        self.backend_id()
    }

    // ---- memory ----

    fn upload(&self, host: &[f32]) -> Result<CudaBuf> {
        buf::upload(&self.dev, host)
    }

    fn download(&self, x: &CudaBuf) -> Result<Vec<f32>> {
        buf::download(&self.dev, x)
    }

    fn download_parts(&self, x: &CudaBuf, lens: &[usize]) -> Result<Vec<Vec<f32>>> {
        buf::download_parts(&self.dev, x, lens)
    }

    fn zeros(&self, n: usize) -> Result<CudaBuf> {
        buf::zeros(&self.dev, n)
    }

    fn len(&self, x: &CudaBuf) -> usize {
        x.len()
    }

    fn rows(&self, x: &CudaBuf, width: usize, first: usize, count: usize) -> Result<CudaBuf> {
        buf::rows(&self.dev, x, width, first, count)
    }

    fn append(&self, dst: &mut CudaBuf, src: &CudaBuf) -> Result<()> {
        buf::append(&self.dev, dst, src)
    }

    fn truncate(&self, dst: &mut CudaBuf, n: usize) -> Result<()> {
        buf::truncate(dst, n)
    }

    fn concat_cols(&self, parts: &[(&CudaBuf, usize)], rows: usize) -> Result<CudaBuf> {
        buf::concat_cols(&self.dev, parts, rows)
    }

    fn split_cols(
        &self,
        x: &CudaBuf,
        rows: usize,
        parts: &[usize],
        repeats: usize,
    ) -> Result<Vec<CudaBuf>> {
        buf::split_cols(&self.dev, x, rows, parts, repeats)
    }

    // ---- weights ----

    fn matrix(&self, w: HostWeight, out: usize, inp: usize) -> Result<CudaMatrix> {
        weights::matrix(&self.dev, w, out, inp)
    }

    fn experts(&self, w: HostWeight, e: usize, out: usize, inp: usize) -> Result<CudaExperts> {
        weights::experts(&self.dev, w, e, out, inp)
    }

    fn table(&self, w: HostWeight, rows: usize, width: usize) -> Result<CudaTable> {
        weights::table(&self.dev, w, rows, width)
    }

    fn gather_rows(&self, table: &CudaTable, ids: &[u32]) -> Result<CudaBuf> {
        elementwise::gather_rows(&self.dev, table, ids)
    }

    // ---- linear algebra ----

    fn matmul(&self, x: &CudaBuf, rows: usize, w: &CudaMatrix) -> Result<CudaBuf> {
        linear::matmul(&self.dev, x, rows, w, &[])
    }

    fn matmul_unary(
        &self,
        x: &CudaBuf,
        rows: usize,
        w: &CudaMatrix,
        chain: &[Unary],
    ) -> Result<CudaBuf> {
        linear::matmul(&self.dev, x, rows, w, chain)
    }

    fn matmul_many(
        &self,
        x: &CudaBuf,
        rows: usize,
        parts: &[(&CudaMatrix, Epilogue<'_>)],
    ) -> Result<Vec<CudaBuf>> {
        linear::matmul_many(&self.dev, x, rows, parts)
    }

    fn matmul_gated_mean(
        &self,
        x: &CudaBuf,
        rows: usize,
        w: &CudaMatrix,
        streams: &CudaBuf,
        c: usize,
        h: usize,
    ) -> Result<CudaBuf> {
        linear::matmul_gated_mean(&self.dev, x, rows, w, streams, c, h)
    }

    fn matmul_grouped(&self, x: &CudaBuf, rows: usize, parts: &[&CudaMatrix]) -> Result<CudaBuf> {
        match linear::matmul_grouped(&self.dev, x, rows, parts)? {
            Some(y) => Ok(y),
            None => composed::matmul_grouped(self, x, rows, parts),
        }
    }

    fn experts_swiglu(
        &self,
        x: &CudaBuf,
        rows: usize,
        routing: &CudaRouting,
        gate_up: &CudaExperts,
        down: &CudaExperts,
        limit: Option<f32>,
    ) -> Result<CudaBuf> {
        linear::experts_swiglu(&self.dev, x, rows, routing, gate_up, down, limit, None)
    }

    fn experts_swiglu_gated(
        &self,
        x: &CudaBuf,
        rows: usize,
        routing: &CudaRouting,
        gate_up: &CudaExperts,
        down: &CudaExperts,
        limit: Option<f32>,
        shared: &CudaBuf,
        gate: &CudaBuf,
    ) -> Result<CudaBuf> {
        let gated = Some((shared, gate));
        linear::experts_swiglu(&self.dev, x, rows, routing, gate_up, down, limit, gated)
    }

    fn experts_slots(
        &self,
        x: &CudaBuf,
        rows: usize,
        routing: &CudaRouting,
        gate_up: &CudaExperts,
        down: &CudaExperts,
        limit: Option<f32>,
        first: usize,
    ) -> Result<CudaBuf> {
        expert_slots::experts_slots(&self.dev, x, rows, routing, gate_up, down, limit, first)
    }

    fn sum_slots(
        &self,
        ys: &CudaBuf,
        rows: usize,
        routing: &CudaRouting,
        width: usize,
    ) -> Result<CudaBuf> {
        expert_slots::sum_slots(&self.dev, ys, rows, routing, width)
    }

    fn routing_upload(&self, experts: &[usize], weights: &[f32], k: usize) -> Result<CudaRouting> {
        expert_slots::routing_upload(&self.dev, experts, weights, k)
    }

    // ---- routing ----

    fn route_softmax_topk(
        &self,
        logits: &CudaBuf,
        rows: usize,
        experts: usize,
        k: usize,
        renormalise: bool,
    ) -> Result<CudaRouting> {
        select::route_softmax_topk(&self.dev, logits, rows, experts, k, renormalise)
    }

    fn route_scored(
        &self,
        logits: &CudaBuf,
        rows: usize,
        bias: Option<&CudaBuf>,
        fixed: Option<&[u32]>,
        spec: &RouterSpec,
    ) -> Result<CudaRouting> {
        select::route_scored(&self.dev, logits, rows, bias, fixed, spec)
    }

    fn routing_to_host(&self, r: &CudaRouting) -> Result<(Vec<usize>, Vec<f32>)> {
        select::routing_to_host(&self.dev, r)
    }

    // ---- norms ----

    fn rms_norm(&self, x: &CudaBuf, width: usize, w: &CudaBuf, eps: f32) -> Result<CudaBuf> {
        norms::rms_norm(&self.dev, x, width, w, eps)
    }

    fn rms_matmul(
        &self,
        x: &CudaBuf,
        rows: usize,
        ones: &CudaBuf,
        w: &CudaMatrix,
        eps: f32,
    ) -> Result<CudaBuf> {
        match hc_fn::rms_matmul(&self.dev, x, rows, w, eps)? {
            Some(y) => Ok(y),
            None => composed::rms_matmul(self, x, rows, ones, w, eps),
        }
    }

    fn rms_norm_grouped(
        &self,
        x: &CudaBuf,
        width: usize,
        group: usize,
        scale: &CudaBuf,
        eps: f64,
    ) -> Result<CudaBuf> {
        norms::rms_norm_grouped(&self.dev, x, width, group, scale, eps)
    }

    fn rms_norm_heads(&self, x: &mut CudaBuf, dim: usize, scale: &CudaBuf, eps: f32) -> Result<()> {
        norms::rms_norm_heads(&self.dev, x, dim, scale, eps)
    }

    fn l2_norm_heads(&self, x: &mut CudaBuf, dim: usize, scale: f32) -> Result<()> {
        norms::l2_norm_heads(&self.dev, x, dim, scale)
    }

    fn gated_rms_norm(
        &self,
        o: &CudaBuf,
        z: &CudaBuf,
        w: &CudaBuf,
        eps: f32,
        act: GateAct,
    ) -> Result<CudaBuf> {
        norms::gated_rms_norm(&self.dev, o, z, w, eps, act)
    }

    fn layer_norm(
        &self,
        x: &CudaBuf,
        width: usize,
        w: &CudaBuf,
        b: &CudaBuf,
        eps: f32,
    ) -> Result<CudaBuf> {
        norms::layer_norm(&self.dev, x, width, w, b, eps)
    }

    // ---- position ----

    fn rope(
        &self,
        x: &mut CudaBuf,
        head_dim: usize,
        cos: &CudaBuf,
        sin: &CudaBuf,
        half: usize,
        layout: RopeLayout,
    ) -> Result<()> {
        norms::rope(&self.dev, x, head_dim, cos, sin, half, layout)
    }

    // ---- recurrent ----

    fn causal_conv_silu(
        &self,
        u: &CudaBuf,
        window: &mut CudaBuf,
        w: &CudaBuf,
        channels: usize,
        kernel: usize,
        dilation: usize,
    ) -> Result<CudaBuf> {
        recurrent::causal_conv_silu(&self.dev, u, window, w, channels, kernel, dilation)
    }

    fn delta_inputs(
        &self,
        d: ScanDims,
        u: &CudaBuf,
        window: &mut CudaBuf,
        w: &CudaBuf,
        kernel: usize,
        q_scale: f32,
        a: &CudaBuf,
        neg_a: &CudaBuf,
        dt_bias: &CudaBuf,
    ) -> Result<[CudaBuf; 4]> {
        match fused::delta_inputs(
            &self.dev, d, u, window, w, kernel, q_scale, a, neg_a, dt_bias,
        )? {
            Some(out) => Ok(out),
            None => {
                composed::delta_inputs(self, d, u, window, w, kernel, q_scale, a, neg_a, dt_bias)
            }
        }
    }

    fn delta_rule_scan(
        &self,
        d: ScanDims,
        q: &CudaBuf,
        k: &CudaBuf,
        v: &CudaBuf,
        g: &CudaBuf,
        beta: &CudaBuf,
        s: &mut CudaBuf,
    ) -> Result<CudaBuf> {
        recurrent::delta_rule_scan(&self.dev, d, q, k, v, g, beta, s)
    }

    fn delta_rule_scan_parts(
        &self,
        d: ScanDims,
        parts: &mut [ScanPart<'_, CudaBuf>],
    ) -> Result<CudaBuf> {
        match recurrent::delta_rule_scan_parts(&self.dev, d, parts)? {
            Some(o) => Ok(o),
            None => composed::delta_rule_scan_parts(self, d, parts),
        }
    }

    fn kda_gate(
        &self,
        f: &CudaBuf,
        a: &CudaBuf,
        dt_bias: &CudaBuf,
        dim: usize,
        lower_bound: Option<f32>,
    ) -> Result<CudaBuf> {
        elementwise::kda_gate(&self.dev, f, a, dt_bias, dim, lower_bound)
    }

    // ---- attention ----

    fn attention_causal(
        &self,
        q: &CudaBuf,
        k: &[&CudaBuf],
        v: &[&CudaBuf],
        offset: usize,
        q_heads: usize,
        kv: Heads,
    ) -> Result<CudaBuf> {
        attention::attention_causal(&self.dev, q, k, v, offset, q_heads, kv)
    }

    fn attention_causal_rows(
        &self,
        q: &CudaBuf,
        parts: &[CausalRows<'_, CudaBuf>],
        q_heads: usize,
        kv: Heads,
    ) -> Result<CudaBuf> {
        attention::attention_causal_rows(&self.dev, q, parts, q_heads, kv)
    }

    fn row_runs(&self, x: &CudaBuf, width: usize, runs: &[(usize, usize)]) -> Result<CudaBuf> {
        buf::row_runs(&self.dev, x, width, runs)
    }

    fn split_rows(&self, x: &CudaBuf, width: usize, counts: &[usize]) -> Result<Vec<CudaBuf>> {
        row_blocks::split_rows(&self.dev, x, width, counts)
    }

    fn concat_rows(&self, parts: Vec<CudaBuf>, width: usize) -> Result<CudaBuf> {
        row_blocks::concat_rows(&self.dev, parts, width)
    }

    fn append_head_rows(&self, width: usize, targets: &mut [HeadRows<'_, CudaBuf>]) -> Result<()> {
        buf::append_head_rows(&self.dev, width, targets)
    }

    fn block_keys(
        &self,
        raw: &CudaBuf,
        dim: usize,
        ratio: usize,
        first: usize,
        last: usize,
    ) -> Result<CudaBuf> {
        attention::block_keys(&self.dev, raw, dim, ratio, first, last)
    }

    fn indexer_select(
        &self,
        q: &CudaBuf,
        blocks: &CudaBuf,
        base: usize,
        shape: IndexerShape,
    ) -> Result<CudaSelection> {
        select::indexer_select(&self.dev, q, blocks, base, shape)
    }

    fn selection_to_host(&self, s: &CudaSelection) -> Result<Vec<Vec<u32>>> {
        select::selection_to_host(&self.dev, s)
    }

    fn selection_from_host(&self, rows: &[Vec<u32>], bound: usize) -> Result<CudaSelection> {
        select::selection_from_host(&self.dev, rows, bound)
    }

    fn expand_pools(
        &self,
        pools: &CudaSelection,
        base: usize,
        pool: usize,
        tail: bool,
    ) -> Result<CudaSelection> {
        select::expand_pools(&self.dev, pools, base, pool, tail)
    }

    fn attention_gathered(
        &self,
        q: &CudaBuf,
        k: &CudaBuf,
        v: &CudaBuf,
        keep: &CudaSelection,
        q_heads: usize,
        kv: Heads,
        sinks: Option<&CudaBuf>,
    ) -> Result<CudaBuf> {
        attention::attention_gathered(&self.dev, q, k, v, keep, q_heads, kv, sinks)
    }

    fn attention_window(
        &self,
        q: &CudaBuf,
        heads: usize,
        dim: usize,
        query_first: usize,
        window: &CudaBuf,
        window_first: usize,
        span: usize,
        entries: &CudaBuf,
        keep: EntryKeep<'_, CudaSelection>,
        sinks: &CudaBuf,
    ) -> Result<CudaBuf> {
        attention::attention_window(
            &self.dev,
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

    // ---- compression ----

    fn softmax_pool(
        &self,
        kv: &CudaBuf,
        gate: &CudaBuf,
        slots: usize,
        dim: usize,
    ) -> Result<CudaBuf> {
        elementwise::softmax_pool(&self.dev, kv, gate, slots, dim)
    }

    fn index_scores(
        &self,
        q: &CudaBuf,
        weights: &CudaBuf,
        keys: &CudaBuf,
        rows: usize,
        heads: usize,
        dim: usize,
        scale: f32,
        w_scale: f32,
    ) -> Result<CudaBuf> {
        elementwise::index_scores(
            &self.dev, q, weights, keys, rows, heads, dim, scale, w_scale,
        )
    }

    fn select_topk(
        &self,
        scores: &CudaBuf,
        rows: usize,
        width: usize,
        limits: &[usize],
        k: usize,
    ) -> Result<CudaSelection> {
        select::select_topk(&self.dev, scores, rows, width, limits, k)
    }

    // ---- element-wise ----

    fn add(&self, a: &CudaBuf, b: &CudaBuf) -> Result<CudaBuf> {
        elementwise::add(&self.dev, a, b)
    }

    fn mul(&self, a: &CudaBuf, b: &CudaBuf) -> Result<CudaBuf> {
        elementwise::mul(&self.dev, a, b)
    }

    fn affine(&self, x: &CudaBuf, mul: f32, add: f32) -> Result<CudaBuf> {
        elementwise::affine(&self.dev, x, mul, add)
    }

    fn add_bias(&self, x: &CudaBuf, b: &CudaBuf, width: usize) -> Result<CudaBuf> {
        elementwise::add_bias(&self.dev, x, b, width)
    }

    fn gelu(&self, x: &CudaBuf, form: GeluForm) -> Result<CudaBuf> {
        elementwise::gelu(&self.dev, x, form)
    }

    fn silu(&self, x: &CudaBuf) -> Result<CudaBuf> {
        elementwise::silu(&self.dev, x)
    }

    fn sigmoid(&self, x: &CudaBuf) -> Result<CudaBuf> {
        elementwise::sigmoid(&self.dev, x)
    }

    fn unary_chain(&self, x: &CudaBuf, chain: &[Unary]) -> Result<CudaBuf> {
        elementwise::unary_chain(&self.dev, x, chain)
    }

    fn swiglu(&self, gu: &CudaBuf, inter: usize, limit: Option<f32>) -> Result<CudaBuf> {
        elementwise::swiglu(&self.dev, gu, inter, limit)
    }

    fn softplus_decay(&self, a: &CudaBuf, neg_a: &CudaBuf, dt_bias: &CudaBuf) -> Result<CudaBuf> {
        elementwise::softplus_decay(&self.dev, a, neg_a, dt_bias)
    }

    fn scale_rows(&self, x: &CudaBuf, s: &CudaBuf, width: usize) -> Result<CudaBuf> {
        elementwise::scale_rows(&self.dev, x, s, width)
    }

    fn add_gated_rows(
        &self,
        base: &CudaBuf,
        x: &CudaBuf,
        g: &CudaBuf,
        width: usize,
    ) -> Result<CudaBuf> {
        elementwise::add_gated_rows(&self.dev, base, x, g, width)
    }

    fn ple_gate(
        &self,
        key: &CudaBuf,
        qry: &CudaBuf,
        val: &CudaBuf,
        c: usize,
        h: usize,
    ) -> Result<CudaBuf> {
        elementwise::ple_gate(&self.dev, key, qry, val, c, h)
    }

    fn hc_sinkhorn(
        &self,
        z: &CudaBuf,
        base: &CudaBuf,
        scale: &CudaBuf,
        n: usize,
        iters: usize,
        eps: f32,
    ) -> Result<CudaBuf> {
        elementwise::hc_sinkhorn(&self.dev, z, base, scale, n, iters, eps)
    }

    fn hc_pre(&self, xs: &CudaBuf, mix: &CudaBuf, n: usize) -> Result<CudaBuf> {
        elementwise::hc_pre(&self.dev, xs, mix, n)
    }

    fn hc_post(&self, xs: &CudaBuf, y: &CudaBuf, mix: &CudaBuf, n: usize) -> Result<CudaBuf> {
        elementwise::hc_post(&self.dev, xs, y, mix, n)
    }

    fn tile_streams(&self, x: &CudaBuf, c: usize, h: usize) -> Result<CudaBuf> {
        elementwise::tile_streams(&self.dev, x, c, h)
    }

    fn mean_streams(&self, x: &CudaBuf, c: usize, h: usize) -> Result<CudaBuf> {
        elementwise::mean_streams(&self.dev, x, c, h)
    }

    fn gated_mean_streams(&self, g: &CudaBuf, x: &CudaBuf, c: usize, h: usize) -> Result<CudaBuf> {
        elementwise::gated_mean_streams(&self.dev, g, x, c, h)
    }

    fn inject_streams(
        &self,
        xs: &CudaBuf,
        y: &CudaBuf,
        inj: &CudaBuf,
        c: usize,
    ) -> Result<CudaBuf> {
        elementwise::inject_streams(&self.dev, xs, y, inj, c)
    }

    fn inject_streams_norm(
        &self,
        xs: &CudaBuf,
        y: &CudaBuf,
        inj: &CudaBuf,
        c: usize,
        scale: &CudaBuf,
        eps: f64,
    ) -> Result<[CudaBuf; 2]> {
        match fused::inject_streams_norm(&self.dev, xs, y, inj, c, scale, eps)? {
            Some(out) => Ok(out),
            None => composed::inject_streams_norm(self, xs, y, inj, c, scale, eps),
        }
    }

    // ---- steps (graph mode) ----

    fn step_graphs(&self) -> bool {
        self.dev.graphs.enabled()
    }

    fn storage_key(&self, x: &CudaBuf) -> [u64; 2] {
        buf::storage_key(x)
    }

    fn run_step(
        &self,
        key: &[u64],
        pos: usize,
        ids: &[u32],
        body: &mut StepBody<'_, CudaStep, CudaBuf>,
    ) -> Result<Vec<CudaBuf>> {
        graph::run_step(&self.dev, key, pos, ids, body)
    }

    fn run_pure(
        &self,
        key: &[u64],
        inputs: &[&CudaBuf],
        body: &mut PureBody<'_, CudaBuf>,
    ) -> Result<Vec<CudaBuf>> {
        graph::run_pure(&self.dev, key, inputs, body)
    }

    fn resize(&self, dst: &mut CudaBuf, n: usize, grow_to: usize) -> Result<()> {
        buf::resize(&self.dev, dst, n, grow_to)
    }

    fn gather_rows_step(&self, table: &CudaTable, step: &CudaStep) -> Result<CudaBuf> {
        elementwise::gather_rows_step(&self.dev, table, step)
    }

    fn rows_step(
        &self,
        x: &CudaBuf,
        width: usize,
        step: &CudaStep,
        count: usize,
    ) -> Result<CudaBuf> {
        buf::rows_step(&self.dev, x, width, step, count)
    }

    fn write_rows_step(
        &self,
        dst: &mut CudaBuf,
        src: &CudaBuf,
        width: usize,
        step: &CudaStep,
    ) -> Result<()> {
        buf::write_rows_step(&self.dev, dst, src, width, step)
    }

    fn attention_causal_step(
        &self,
        q: &CudaBuf,
        k: &[&CudaBuf],
        v: &[&CudaBuf],
        step: &CudaStep,
        q_heads: usize,
        kv: Heads,
    ) -> Result<CudaBuf> {
        attention::attention_causal_step(&self.dev, q, k, v, step, q_heads, kv)
    }

    fn half_empty(&self) -> Result<Self::Half> {
        Err(crate::error::EngineError::Unsupported(
            "the CUDA backend has no f16 KV cache: use `--kv-cache f32` with `--device cuda`"
                .into(),
        ))
    }

    fn half_len(&self, x: &Self::Half) -> usize {
        match *x {}
    }

    fn half_append(&self, dst: &mut Self::Half, _src: &CudaBuf) -> Result<()> {
        match *dst {}
    }

    fn half_truncate(&self, dst: &mut Self::Half, _n: usize) -> Result<()> {
        match *dst {}
    }

    fn half_download(&self, x: &Self::Half) -> Result<Vec<f32>> {
        match *x {}
    }

    fn attention_causal_half(
        &self,
        _q: &CudaBuf,
        k: &[&Self::Half],
        _v: &[&Self::Half],
        _offset: usize,
        _q_heads: usize,
        _kv: Heads,
    ) -> Result<CudaBuf> {
        match k.first() {
            Some(x) => match **x {},
            None => self.half_empty().map(|never| match never {}),
        }
    }
}
