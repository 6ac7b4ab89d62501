"""Token counts and latencies of the OpenAI-compatible API, per model version, on the metrics port.

What an operator of a generative model watches, named beside vLLM's (whose names a dashboard for
an OpenAI-compatible server usually has):

    kernel_openai_prompt_tokens_total               counter    vllm:prompt_tokens_total
    kernel_openai_generation_tokens_total           counter    vllm:generation_tokens_total
    kernel_openai_time_to_first_token_seconds       histogram  vllm:time_to_first_token_seconds
    kernel_openai_inter_token_latency_seconds       histogram  vllm:inter_token_latency_seconds
    kernel_openai_e2e_request_latency_seconds       histogram  vllm:e2e_request_latency_seconds

labelled `model` and `version` as the nv_* families are. One observation per choice (a call with
n choices makes n requests): time to first token from when the call's body was read to the
choice's first response with text (or tool calls); inter-token latency between two such responses
(a model that streams one token per response: per token); end to end until its last response.
Tokens are the model's counts (num_input_tokens, num_output_tokens), or, for a model that reports
none, the pieces of text it sent as generated tokens and no prompt tokens. A choice that fails or
is cancelled adds to neither the end-to-end histogram nor the token counters.

The transport (transports/openai) records; the metrics collector (metrics.py) reads at scrape time.
Per token this costs a clock read and a bucket search, on the event loop, nothing more.
"""

from __future__ import annotations

import time
import weakref
from typing import Optional

from kernel.observe.distributions import Histogram, add_histogram

PROMPT_TOKENS = "kernel_openai_prompt_tokens_total"
GENERATION_TOKENS = "kernel_openai_generation_tokens_total"
TTFT = "kernel_openai_time_to_first_token_seconds"
ITL = "kernel_openai_inter_token_latency_seconds"
E2E = "kernel_openai_e2e_request_latency_seconds"
TTFT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0)
ITL_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4,
               0.5, 0.75, 1.0, 2.5)
E2E_BUCKETS = (0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
               120.0, 240.0)
_now = time.monotonic


class ModelTokens:
    """One model version's counters and histograms."""

    __slots__ = ("prompt_tokens", "generation_tokens", "ttft", "itl", "e2e", "__weakref__")

    def __init__(self) -> None:
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)


class CallWatch:
    """The choices of one call: when it began, when each choice last sent text."""

    __slots__ = ("tokens", "start", "last", "n")

    def __init__(self, tokens: ModelTokens, choices: int, n: int, start: Optional[float] = None) -> None:
        self.tokens = tokens
        self.start = _now() if start is None else start
        self.last: list = [None] * choices
        self.n = n

    def response(self, index: int, choice, produced: bool, final: bool) -> None:
        """A response of choice `index` (convention.ChoiceText `choice`, after it read it);
        `produced`: it carried text or tool calls."""
        if produced:
            now = _now()
            last = self.last[index]
            if last is None:
                self.tokens.ttft.observe(now - self.start)
            else:
                self.tokens.itl.observe(now - last)
            self.last[index] = now
        if final:
            tokens = self.tokens
            tokens.e2e.observe(_now() - self.start)
            tokens.generation_tokens += choice.completion_tokens if choice.counted else choice.pieces
            if index % self.n == 0 and choice.prompt_tokens:
                tokens.prompt_tokens += choice.prompt_tokens


class OpenAIMetrics:
    """The server's OpenAI metrics, per loaded model version (dropped with it)."""

    def __init__(self) -> None:
        self.models: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

    @classmethod
    def of(cls, server) -> "OpenAIMetrics":
        """The server's (made on first use: the OpenAI listener's start)."""
        found = getattr(server, "openai_metrics", None)
        if found is None:
            found = cls()
            server.openai_metrics = found
        return found

    def watch(self, model, choices: int, n: int) -> CallWatch:
        tokens = self.models.get(model)
        if tokens is None:
            tokens = self.models[model] = ModelTokens()
        return CallWatch(tokens, choices, n)


def families(server, labels_of):
    """The families for /metrics (prometheus_client Metrics), empty until an OpenAI call was made;
    `labels_of(model)`: the nv_* families' labels of a model version."""
    found: Optional[OpenAIMetrics] = getattr(server, "openai_metrics", None)
    if found is None or not found.models:
        return []
    from prometheus_client.metrics_core import Metric

    prompt = Metric(PROMPT_TOKENS, "Number of prompt tokens processed (OpenAI-compatible API)", "counter")
    generated = Metric(GENERATION_TOKENS, "Number of generation tokens processed (OpenAI-compatible API)",
                       "counter")
    ttft = Metric(TTFT, "Histogram of time to first token in seconds (OpenAI-compatible API)", "histogram")
    itl = Metric(ITL, "Histogram of time between two tokens in seconds (OpenAI-compatible API)", "histogram")
    e2e = Metric(E2E, "Histogram of end to end request latency in seconds (OpenAI-compatible API)", "histogram")
    for model, tokens in list(found.models.items()):
        labels = labels_of(model)
        prompt.add_sample(PROMPT_TOKENS, labels, tokens.prompt_tokens)
        generated.add_sample(GENERATION_TOKENS, labels, tokens.generation_tokens)
        add_histogram(ttft, TTFT, labels, tokens.ttft)
        add_histogram(itl, ITL, labels, tokens.itl)
        add_histogram(e2e, E2E, labels, tokens.e2e)
    return [prompt, generated, ttft, itl, e2e]
