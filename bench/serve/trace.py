"""Synthetic ShareGPT-like request traces (fixed seed).

Lengths are log-normal, fitted to ShareGPT's published medians (about 250
prompt tokens and 200 output tokens with the Llama tokenizer) with sigmas
chosen so that the 99th percentile lands near the caps (prompt 2048, output
1024): ShareGPT's long tails, without a few requests that dominate a short
run. Arrivals are a Poisson process (exponential gaps) at the given rate, or
all at time 0 for rate = inf. Output lengths come from the trace, not from
sampled tokens: a request stops after exactly output_len tokens.
"""
import dataclasses
import math

import numpy as np

PROMPT_MEDIAN, PROMPT_SIGMA, PROMPT_CAP = 250, 0.9, 2048
OUTPUT_MEDIAN, OUTPUT_SIGMA, OUTPUT_CAP = 200, 0.8, 1024


@dataclasses.dataclass
class Request:
    rid: int
    arrival: float  # seconds after the start of the run
    prompt_len: int
    output_len: int  # tokens to generate per sample (>= 1)
    prompt_ids: np.ndarray  # int64 [prompt_len]
    n_samples: int = 1  # parallel samples sharing the prompt's pages (forked after the prefill)
    sample_output_lens: tuple = ()  # per-sample output lengths when n_samples > 1


def lognormal_lengths(rng, n, median, sigma, lo, hi):
    x = np.exp(rng.normal(math.log(median), sigma, size=n))
    return np.clip(np.round(x), lo, hi).astype(np.int64)


def sharegpt_like(n, rate, seed=0, vocab=128256, prompt_cap=PROMPT_CAP, output_cap=OUTPUT_CAP,
                  prompt_median=PROMPT_MEDIAN, output_median=OUTPUT_MEDIAN, n_samples=1, min_prompt=4):
    """n requests arriving at `rate` per second (inf: all at 0). With n_samples > 1 each request's
    samples get their own output lengths from the same distribution."""
    rng = np.random.default_rng(seed)
    prompts = lognormal_lengths(rng, n, prompt_median, PROMPT_SIGMA, min_prompt, prompt_cap)
    outputs = lognormal_lengths(rng, n * max(n_samples, 1), output_median, OUTPUT_SIGMA, 1, output_cap)
    if math.isinf(rate):
        arrivals = np.zeros(n)
    else:
        arrivals = np.cumsum(rng.exponential(1.0 / rate, size=n))
        arrivals -= arrivals[0]  # the first request arrives when the run starts
    reqs = []
    for i in range(n):
        ids = rng.integers(0, vocab, size=int(prompts[i]), dtype=np.int64)
        outs = outputs[i * n_samples:(i + 1) * n_samples] if n_samples > 1 else outputs[i:i + 1]
        reqs.append(Request(rid=i, arrival=float(arrivals[i]), prompt_len=int(prompts[i]),
                            output_len=int(outs.max()), prompt_ids=ids, n_samples=max(n_samples, 1),
                            sample_output_lens=tuple(int(x) for x in outs) if n_samples > 1 else ()))
    return reqs


def fixed_requests(prompt_lens, output_lens, seed=0, vocab=128256, n_samples=None):
    """Requests with given lengths, all arriving at 0 (the logits check and tests). n_samples: a list
    (one per request) or None; a forked request's samples all get the request's output length."""
    rng = np.random.default_rng(seed)
    reqs = []
    for i, (p, o) in enumerate(zip(prompt_lens, output_lens)):
        n = 1 if n_samples is None else int(n_samples[i])
        reqs.append(Request(rid=i, arrival=0.0, prompt_len=int(p), output_len=int(o),
                            prompt_ids=rng.integers(0, vocab, size=int(p), dtype=np.int64), n_samples=n,
                            sample_output_lens=(int(o),) * n if n > 1 else ()))
    return reqs


def describe(reqs):
    p = np.array([r.prompt_len for r in reqs])
    o = np.array([x for r in reqs for x in (r.sample_output_lens or (r.output_len,))])
    span = max(r.arrival for r in reqs) if reqs else 0.0
    return dict(requests=len(reqs), samples=int(o.size), arrival_span_s=round(span, 3),
                prompt_median=float(np.median(p)), prompt_mean=float(p.mean()), prompt_max=int(p.max()),
                output_median=float(np.median(o)), output_mean=float(o.mean()), output_max=int(o.max()))
