"""Continuous batching with chunked prefill (vLLM / Sarathi style).

Every step holds all running decode samples (one token each) first, then
prompt chunks up to a token budget: unfinished prompts first (admission
order), then newly admitted requests while slots, pages and budget last. A
prompt longer than what is left of the budget is cut into chunks over
several steps; a step may mix decode rows and chunks.

Admission reserves a request's pages for its whole life (pages.reserve_for)
and one slot per sample, so running requests never stall or get preempted.
A request with n_samples > 1 is prefilled once; when its prompt's last chunk
runs it is forked (fork()): the other samples start decoding from the same
first token, sharing the prompt's full pages, placed right after the parent
in the running list so the samples of one prompt are adjacent rows (what
shared-prefix detection groups best).
"""
import collections

import numpy as np

from .pages import Seq, cdiv, reserve_for


class Scheduler:
    def __init__(self, pool, max_running, token_budget, max_prefill_reqs=16):
        if token_budget < max_running + 1:
            raise ValueError(f"token_budget ({token_budget}) must exceed max_running ({max_running}): every "
                             "running decode sample takes one token of each step")
        self.pool, self.max_running = pool, int(max_running)
        self.budget, self.max_prefill_reqs = int(token_budget), int(max_prefill_reqs)
        self.waiting = collections.deque()
        self.running = []  # Seqs, decode-ready or prefilling, in admission order (forks beside their parent)
        self.finished = []
        self.free_slots = list(range(self.max_running - 1, -1, -1))
        self._sid = 0

    @property
    def dummy_slot(self):
        return self.max_running  # where padded graph rows write their token

    def busy(self):
        return bool(self.waiting or self.running)

    def arrive(self, req):
        self.waiting.append(req)

    def _admit(self, req):
        ps = self.pool.page_size
        outs = req.sample_output_lens or (req.output_len,)
        seq = Seq(req, self._new_sid(), self.free_slots.pop(), outs[0])
        seq.pages = np.array(self.pool.alloc(cdiv(seq.max_kv_len, ps)), dtype=np.int32)
        shared = req.prompt_len // ps
        for o in outs[1:]:
            own = self.pool.alloc(cdiv(req.prompt_len + o - 1, ps) - shared)
            seq.pending_children.append((self.free_slots.pop(), o, own))
        self.running.append(seq)
        return seq

    def _new_sid(self):
        self._sid += 1
        return self._sid - 1

    def schedule(self):
        """The next step: [(seq, tokens)], decode samples first. Empty when nothing can run."""
        decode = [s for s in self.running if s.decoding]
        budget = self.budget - len(decode)
        chunks = []
        for s in self.running:
            if not s.decoding and len(chunks) < self.max_prefill_reqs and budget > 0:
                n = min(s.prompt_len - s.prefilled, budget)
                chunks.append((s, n))
                budget -= n
        while self.waiting and budget > 0 and len(chunks) < self.max_prefill_reqs:
            req = self.waiting[0]
            if len(self.free_slots) < req.n_samples or self.pool.free < reserve_for(req, self.pool.page_size):
                break  # first come, first served: a later, smaller request does not overtake
            self.waiting.popleft()
            s = self._admit(req)
            n = min(s.prompt_len, budget)
            chunks.append((s, n))
            budget -= n
        return [(s, 1) for s in decode] + chunks

    def complete(self, step, now, tokens=None):
        """Books a step that ran (its tokens appended, one new token per decode sample and per finished
        prompt) at time `now`. tokens: the new token id of each logit row in step order, when recorded.
        Returns the forks made: [(parent, [children])] (the engine copies pages and first tokens)."""
        forks, done = [], []
        it = iter(tokens) if tokens is not None else None
        for s, n in step:
            if s.decoding:
                s.kv_len += n
            else:
                s.kv_len += n
                s.prefilled += n
                if s.prefilled < s.prompt_len:
                    continue  # an inner chunk produces no token
            s.n_out += 1
            s.token_times.append(now)
            if it is not None:
                s.tokens.append(int(next(it)))
            if s.n_out == 1 and s.pending_children:
                forks.append((s, self._fork(s, now)))
            if s.n_out >= s.output_len:
                done.append(s)
        for s in done:
            self._finish(s)
        for _, kids in forks:
            for k in kids:
                if k.n_out >= k.output_len:
                    self._finish(k)
        return forks

    def _fork(self, parent, now):
        ps = self.pool.page_size
        shared = parent.prompt_len // ps
        kids = []
        for slot, out_len, own in parent.pending_children:
            k = Seq(parent.req, self._new_sid(), slot, out_len,
                    np.concatenate([parent.pages[:shared], np.asarray(own, dtype=np.int32)]))
            self.pool.share(parent.pages[:shared])
            k.kv_len = k.prefilled = parent.prompt_len
            k.n_out = 1
            k.token_times.append(now)
            k.tokens = list(parent.tokens)
            kids.append(k)
        parent.pending_children = []
        i = self.running.index(parent)
        self.running[i + 1:i + 1] = kids
        return kids

    def _finish(self, s):
        s.finished = True
        self.pool.release(s.pages)
        for _, _, own in s.pending_children:  # never forked (cannot happen once the prompt ran); keep the pool whole
            self.pool.release(own)
        self.free_slots.append(s.slot)
        self.running.remove(s)
        self.finished.append(s)

    @staticmethod
    def fork_copies(parent, kids, page_size):
        """(src pages, dst pages) to copy when forking: the prompt's partly filled last page, once per child."""
        if parent.prompt_len % page_size == 0:
            return [], []
        i = parent.prompt_len // page_size
        return [parent.pages[i]] * len(kids), [k.pages[i] for k in kids]
