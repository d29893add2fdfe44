"""The paged KV cache's host side: a page allocator with reference counts, and
sequences (a request's sample) with their page lists.

Page 0 is never handed out: CUDA-graph steps pad their batch with dummy
requests whose single token lives there, so padded rows append and attend
somewhere harmless.

A request reserves every page it can ever need when it is admitted (prompt +
output - 1 tokens, for each of its samples), so a running request never waits
for memory and nothing is preempted: the scheduler admits only what fits.
Parallel samples share the prompt's full pages (reference count = samples);
the prompt's partly filled last page is copied once per extra sample when
the prompt is forked (copy-on-write at the only page that will be written).
"""
import numpy as np


def cdiv(a, b):
    return -(-a // b)


class PagePool:
    def __init__(self, num_pages, page_size):
        if num_pages < 2:
            raise ValueError(f"num_pages: expected >= 2 (page 0 is reserved), got {num_pages}")
        self.num_pages, self.page_size = int(num_pages), int(page_size)
        self.refs = np.zeros(self.num_pages, dtype=np.int32)
        self.refs[0] = 1  # the dummy page, never freed
        self._free = list(range(self.num_pages - 1, 0, -1))  # pop() hands out low ids first

    @property
    def free(self):
        return len(self._free)

    def alloc(self, n):
        if n > len(self._free):
            raise MemoryError(f"page pool: {n} pages asked, {len(self._free)} free")
        out = [self._free.pop() for _ in range(n)]
        self.refs[out] += 1
        return out

    def share(self, pages):
        np.add.at(self.refs, np.asarray(pages, dtype=np.int64), 1)

    def release(self, pages):
        pages = np.asarray(pages, dtype=np.int64)
        np.subtract.at(self.refs, pages, 1)
        if len(pages) and self.refs[pages].min() < 0:
            raise AssertionError("page pool: a page released more often than held")
        self._free.extend(int(p) for p in np.unique(pages[self.refs[pages] == 0])[::-1])

    def in_use(self):
        return self.num_pages - 1 - len(self._free)


class Seq:
    """One sample of a request: its pages (the first kv_len tokens are in the cache), what it has produced,
    and when (token_times, seconds after the run's start)."""

    def __init__(self, req, sid, slot, output_len, pages=None):
        self.req, self.sid, self.slot = req, sid, slot
        self.prompt_len, self.output_len = req.prompt_len, int(output_len)
        self.pages = np.zeros(0, np.int32) if pages is None else np.asarray(pages, dtype=np.int32)
        self.kv_len = 0  # tokens whose K / V are in the cache
        self.prefilled = 0  # prompt tokens processed
        self.n_out = 0  # tokens generated
        self.token_times = []
        self.finished = False
        self.pending_children = []  # (slot, output_len, own pages) of the samples forked when the prefill ends
        self.tokens = []  # generated token ids (kept only when the engine records them: the logits check)

    @property
    def decoding(self):
        return self.prefilled == self.prompt_len and not self.finished

    @property
    def max_kv_len(self):
        """Tokens the cache ever holds for this sample: the last generated token is never appended."""
        return self.prompt_len + self.output_len - 1


def reserve_for(req, page_size):
    """Pages a request needs over its life: the prompt's full pages once, then each sample's own."""
    n = req.n_samples
    outs = req.sample_output_lens or (req.output_len,)
    if n == 1:
        return cdiv(req.prompt_len + req.output_len - 1, page_size)
    shared = req.prompt_len // page_size
    return shared + sum(cdiv(req.prompt_len + o - 1, page_size) - shared for o in outs)
