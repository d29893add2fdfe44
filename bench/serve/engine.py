"""The serving loop: scheduler -> step tensors -> backend.plan (once) ->
model forward (every layer's attend) -> next tokens, one step at a time.

Decode-only steps are padded to a batch bucket with dummy rows (page 0, one
key) and replayed from a CUDA graph captured per bucket when the backend
allows it (the whole forward, embedding to argmax, is in the graph; plan()
and the host-to-device copies of the step's indices are not). Steps with
prefill chunks run eagerly. Every index a captured graph reads lives in a
fixed device buffer refilled before each step.

Timing: the step's end is taken after torch.cuda.synchronize(), so each
token's timestamp is when the GPU finished the step that made it. TTFT =
first token time - arrival; ITL = gaps between a sample's tokens. Each step
also records the host time of backend.plan() and the GPU time of the
forward (CUDA events around the replay or the eager forward), which a
synchronous step adds up with the staging, and the host time of the staging
and of the launch (the replay or the eager forward's calls), so a step's
time splits into its parts.
"""
import dataclasses
import time
import types

import numpy as np
import torch

from .scheduler import Scheduler

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 96, 128, 160, 192, 256)  # 12 graphs (and flex decode compiles)


@dataclasses.dataclass
class StepData:
    kind: str  # "decode" (every row one query of a decoding sample) or "mixed"
    graph: bool
    bucket: int  # rows after padding (decode steps with padding), else the batch
    host: types.SimpleNamespace  # numpy: qo_indptr, kv_indptr, kv_indices, last_page_len, kv_lens, q_lens
    positions: torch.Tensor  # int32 [T]: each token's position (where append writes it)
    batch_indices: torch.Tensor  # int32 [T]: each token's row
    slots: torch.Tensor  # int64 [T]: each token's cache row (page * page_size + offset)
    kv_indices_full: torch.Tensor  # int32: the fixed page-id buffer (its first kv_indptr[-1] entries are the step's)
    kv_indptr: torch.Tensor  # int32 [rows + 1]
    last_page_len: torch.Tensor  # int32 [rows]


class Engine:
    def __init__(self, model, backend, pool, *, max_running, token_budget, max_prefill_reqs=16, graphs=True,
                 buckets=BUCKETS, record=False):
        self.model, self.backend, self.pool = model, backend, pool
        self.cfg, self.dev = model.cfg, model.device
        self.ps = pool.page_size
        self.max_running, self.token_budget = int(max_running), int(token_budget)
        self.max_prefill_reqs = int(max_prefill_reqs)
        self.buckets = sorted({b for b in buckets if b < max_running} | {int(max_running)})
        self.graphs_on = bool(graphs) and backend.supports_graphs and self.dev.type == "cuda"
        self.pad_decode = self.graphs_on or backend.pad_decode
        self.record = record  # keep logits and tokens of every step (the logits check)
        self.events = ((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                       if self.dev.type == "cuda" else None)
        self.plan_ms = self.launch_ms = float("nan")
        rows = max(self.buckets[-1], self.max_running)
        tokens = max(self.token_budget, rows)
        i32, i64 = dict(dtype=torch.int32, device=self.dev), dict(dtype=torch.int64, device=self.dev)
        self.buf = dict(ids=torch.zeros(tokens, **i64), positions=torch.zeros(tokens, **i32),
                        batch_indices=torch.zeros(tokens, **i32), slots=torch.zeros(tokens, **i64),
                        kv_indptr=torch.zeros(rows + 1, **i32), last_page_len=torch.ones(rows, **i32),
                        kv_indices=torch.zeros(self._table_cap(pool, rows), **i32),
                        dec_slots=torch.zeros(rows, **i64), logit_rows=torch.zeros(rows, **i64),
                        logit_slots=torch.zeros(rows, **i64))
        self.last_token = torch.zeros(self.max_running + 1, **i64)  # per slot; the last is the dummy rows'
        self.graphs = {}
        self.graph_pool = None
        self.log = []

    def _table_cap(self, pool, rows):
        """Page-table entries a step can list: forked samples list their shared pages each, so up to every
        running sample's longest table, and never fewer than the pool's pages (+ one per padded row)."""
        longest = -(-self.cfg.max_positions // pool.page_size)
        return max(pool.num_pages, self.max_running * longest) + rows

    # ------------------------------------------------------------------ staging
    _NP = {torch.int32: np.int32, torch.int64: np.int64}

    def _upload(self, name, arr):
        """Copies host values into the first entries of a fixed device buffer; returns that view. From
        pageable memory the copy is staged before copy_ returns (CUDA's rule), so the host array may go at
        once; non_blocking only spares a stream synchronization per buffer."""
        dst = self.buf[name][: len(arr)]
        if len(arr):
            dst.copy_(torch.from_numpy(np.ascontiguousarray(arr, dtype=self._NP[dst.dtype])), non_blocking=True)
        return dst

    def stage(self, step, sched):
        """(StepData, tokens T, decode rows, logit rows) for [(seq, tokens)] (decode samples first);
        decode-only steps are padded to a bucket when graphs or the backend want it."""
        ps = self.ps
        seqs = [s for s, _ in step]
        q = np.array([n for _, n in step], dtype=np.int64)
        n_dec = sum(1 for s in seqs if s.decoding)
        decode_only = n_dec == len(seqs) and bool(seqs)
        B = len(seqs)
        bucket = B
        if decode_only and self.pad_decode:
            bucket = next(b for b in self.buckets if b >= B)
        pad = bucket - B
        kv_before = np.array([s.kv_len for s in seqs] + [0] * pad, dtype=np.int64)
        q_lens = np.concatenate([q, np.ones(pad, np.int64)])
        kv_lens = kv_before + q_lens
        npages = -(-kv_lens // ps)
        qo_indptr = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
        kv_indptr = np.concatenate([[0], np.cumsum(npages)]).astype(np.int32)
        parts = [s.pages[:n] for s, n in zip(seqs, npages[:B].tolist())]
        kv_indices = np.concatenate(parts + [np.zeros(pad, np.int32)]) if bucket else np.zeros(0, np.int32)
        last = (kv_lens - (npages - 1) * ps).astype(np.int32)
        T = int(qo_indptr[-1])
        rows = np.repeat(np.arange(bucket), q_lens)
        pos = np.arange(T) - qo_indptr[:-1][rows] + kv_before[rows]
        slots = kv_indices[kv_indptr[:-1][rows] + pos // ps].astype(np.int64) * ps + pos % ps
        ids = np.zeros(T, np.int64)
        logit_rows, logit_slots = list(range(n_dec)), [s.slot for s in seqs[:n_dec]]
        for b in range(n_dec, B):
            s, n = seqs[b], int(q[b])
            a = int(qo_indptr[b])
            ids[a:a + n] = s.req.prompt_ids[s.prefilled:s.prefilled + n]
            if s.prefilled + n == s.prompt_len:
                logit_rows.append(a + n - 1)
                logit_slots.append(s.slot)
        dec_slots = [s.slot for s in seqs[:n_dec]] + [sched.dummy_slot] * pad
        if pad:
            logit_rows += list(range(B, bucket))
            logit_slots += [sched.dummy_slot] * pad
        host = types.SimpleNamespace(qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
                                     last_page_len=last, kv_lens=kv_lens, q_lens=q_lens)
        self._upload("kv_indices", kv_indices)
        sd = StepData(kind="decode" if decode_only else "mixed", graph=decode_only and self.graphs_on,
                      bucket=bucket, host=host, positions=self._upload("positions", pos),
                      batch_indices=self._upload("batch_indices", rows), slots=self._upload("slots", slots),
                      kv_indices_full=self.buf["kv_indices"], kv_indptr=self._upload("kv_indptr", kv_indptr),
                      last_page_len=self._upload("last_page_len", last))
        self._upload("ids", ids)
        self._upload("dec_slots", dec_slots)
        self._upload("logit_rows", logit_rows)
        self._upload("logit_slots", logit_slots)
        return sd, T, n_dec + pad if decode_only else n_dec, len(logit_rows)

    # ------------------------------------------------------------------ forward
    def _forward(self, T, n_dec, n_logits):
        """The step's forward on the staged buffers; returns the logits (captured as is by graphs)."""
        b = self.buf
        ids = b["ids"][:T]
        if n_dec:
            ids[:n_dec] = self.last_token.index_select(0, b["dec_slots"][:n_dec])
        rows = None if n_logits == T else b["logit_rows"][:n_logits]
        logits = self.model.forward(ids, b["positions"][:T], self.backend, rows, self.backend.rope_in_model)
        self.last_token.index_copy_(0, b["logit_slots"][:n_logits], logits.argmax(-1))
        return logits

    def capture_graphs(self, sched):
        """One graph per bucket, largest first (they share one memory pool), each captured after a plan of
        dummy rows and two warm-up runs on a side stream (torch's recipe)."""
        if not self.graphs_on:
            return
        self.graph_pool = torch.cuda.graph_pool_handle()
        for bucket in sorted(self.buckets, reverse=True):
            sd = self._dummy(bucket, sched)
            self.backend.prepare_graph(bucket)
            self.backend.plan(sd)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    self._forward(bucket, bucket, bucket)
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=self.graph_pool):
                out = self._forward(bucket, bucket, bucket)
            self.graphs[bucket] = (g, out)
        for g, _ in self.graphs.values():  # a graph's first launch also uploads it: keep that out of timed steps
            g.replay()  # on the last dummy plans: writes only page 0 and the dummy slot
        torch.cuda.synchronize()

    def try_capture_graphs(self, sched):
        """capture_graphs(), or, when the backend cannot be captured, no graphs: returns '' or why not."""
        try:
            self.capture_graphs(sched)
            return ""
        except Exception as e:
            self.graphs, self.graph_pool = {}, None
            self.graphs_on = False
            self.pad_decode = self.backend.pad_decode
            torch.cuda.synchronize()
            return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]

    def _dummy(self, bucket, sched):
        """A decode step of `bucket` dummy rows (page 0, one key, the dummy slot), as padding rows are."""
        ones = np.ones(bucket, np.int64)
        host = types.SimpleNamespace(qo_indptr=np.arange(bucket + 1, dtype=np.int32),
                                     kv_indptr=np.arange(bucket + 1, dtype=np.int32),
                                     kv_indices=np.zeros(bucket, np.int32), last_page_len=ones.astype(np.int32),
                                     kv_lens=ones, q_lens=ones)
        self._upload("kv_indices", host.kv_indices)
        self._upload("dec_slots", [sched.dummy_slot] * bucket)
        self._upload("logit_slots", [sched.dummy_slot] * bucket)
        return StepData(kind="decode", graph=self.graphs_on, bucket=bucket, host=host,
                        positions=self._upload("positions", np.zeros(bucket)),
                        batch_indices=self._upload("batch_indices", np.arange(bucket)),
                        slots=self._upload("slots", np.zeros(bucket)), kv_indices_full=self.buf["kv_indices"],
                        kv_indptr=self._upload("kv_indptr", host.kv_indptr),
                        last_page_len=self._upload("last_page_len", host.last_page_len))

    def step(self, sd, T, n_dec, n_logits):
        t = time.perf_counter()
        self.backend.plan(sd)
        t_planned = time.perf_counter()
        self.plan_ms = (t_planned - t) * 1e3
        if self.events:
            self.events[0].record()
        if sd.graph:
            g, out = self.graphs[sd.bucket]
            g.replay()
        else:
            out = self._forward(T, n_dec, n_logits)
        if self.events:
            self.events[1].record()
        self.launch_ms = (time.perf_counter() - t_planned) * 1e3
        return out

    def gpu_ms(self):
        """GPU time of the last step's forward (after sync()); nan without CUDA."""
        return self.events[0].elapsed_time(self.events[1]) if self.events else float("nan")

    # ------------------------------------------------------------------ the loop
    def new_scheduler(self):
        return Scheduler(self.pool, self.max_running, self.token_budget, self.max_prefill_reqs)

    def sync(self):
        if self.dev.type == "cuda":
            torch.cuda.synchronize(self.dev)

    @torch.no_grad()
    def run(self, requests, time_limit=None, sched=None, on_step=None):
        """Serves `requests` (trace.Request, any order) in real time; returns (finished + unfinished seqs,
        step log, whether the time limit cut the run). on_step(step, sd, logits, logit rows) is called after
        each step (the logits check records there)."""
        sched = sched or self.new_scheduler()
        pending = sorted(requests, key=lambda r: r.arrival)
        log, truncated = [], False
        self.sync()
        t0 = time.perf_counter()
        while pending or sched.busy():
            now = time.perf_counter() - t0
            while pending and pending[0].arrival <= now:
                sched.arrive(pending.pop(0))
            if not sched.busy():
                time.sleep(max(0.0, pending[0].arrival - now))
                continue
            step = sched.schedule()
            if not step:
                if sched.running:
                    raise RuntimeError("scheduler: running requests but an empty step")
                if sched.waiting and not pending:
                    raise RuntimeError(f"request {sched.waiting[0].rid} can never be admitted: it needs more pages "
                                       f"or slots than the pool / max_running hold")
                time.sleep(0.0005)
                continue
            t_start = time.perf_counter() - t0
            sd, T, n_dec, n_logits = self.stage(step, sched)
            stage_ms = (time.perf_counter() - t0 - t_start) * 1e3
            logits = self.step(sd, T, n_dec, n_logits)
            tokens = logits.argmax(-1)[:n_logits].cpu().numpy() if self.record else None
            self.sync()
            t_end = time.perf_counter() - t0
            if on_step is not None:
                on_step(step, sd, logits, n_logits)
            forks = sched.complete(step, t_end, tokens)
            for parent, kids in forks:
                src, dst = sched.fork_copies(parent, kids, self.ps)
                self.backend.cache.copy_pages(src, dst)
                kid_slots = torch.tensor([k.slot for k in kids], dtype=torch.long, device=self.dev)
                self.last_token[kid_slots] = self.last_token[parent.slot].clone()
            log.append((sd.kind, len(step), T, sd.bucket, t_start, t_end, len(sched.running), len(sched.waiting),
                        self.plan_ms, self.gpu_ms(), stage_ms, self.launch_ms))
            if time_limit is not None and t_end > time_limit:
                truncated = True
                break
        self.log = log
        seqs = sched.finished + [s for s in sched.running]
        if truncated:  # give back what the cut run still holds, so the pool can serve the next run
            for s in list(sched.running):
                sched._finish(s)
            sched.waiting.clear()
        return seqs, log, truncated
