"""``tracetool serve``, ``probe`` and ``merge``: the serving path on the command line."""

from __future__ import annotations

import tempfile
from pathlib import Path

import click

from tracetool import units
from tracetool.cli.attach_cmd import live_config, live_options
from tracetool.cli.common import emit_json, json_option, old_spelling, sigterm_as_ctrl_c, warn
from tracetool.cli.metrics_options import metrics_options
from tracetool.cli.samplers import chosen_samplers, sampler_options
from tracetool.errors import UsageError
from tracetool.glyphs import NOT_MEASURED
from tracetool.serving.probe_types import default as probe_default
from tracetool.untrusted import echo


# -- serve ------------------------------------------------------------------------------------------
@click.command()
@old_spelling("--model", "--model-dir", "model_path", type=click.Path(path_type=Path))
@click.option("--model-dir", "model_path", type=click.Path(path_type=Path), default=None,
              help="Local Hugging Face model directory (never a hub id: nothing is downloaded). "
                   "Default: the demo model.")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None,
              help="Trace directory to write (default: a new temporary directory, printed).")
@click.option("--force", is_flag=True, help="Replace the trace in a non-empty output directory.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True,
              help="Port; 0 picks a free one (the URL is printed on stderr).")
@click.option("--served-model-name", default=None, help="Model name in the API (default: the model's).")
@click.option("--max-batch", type=click.IntRange(1, 1024), default=8, show_default=True,
              help="Requests generated concurrently; more wait in the queue.")
@click.option("--max-queue", type=click.IntRange(0), default=256, show_default=True,
              help="Requests allowed to wait; beyond it requests get HTTP 503.")
@click.option("--max-prompt-tokens", type=click.IntRange(1), default=4096, show_default=True,
              help="Longest prompt accepted, in tokens.")
@click.option("--max-output-tokens", type=click.IntRange(1), default=1024, show_default=True,
              help="Largest max_tokens accepted.")
@click.option("--max-body-bytes", type=click.IntRange(1024), default=1 << 20, show_default=True,
              help="Largest request body accepted (HTTP 413 beyond).")
@click.option("--device", default="auto", show_default=True, help="cpu, cuda, cuda:N or auto.")
@click.option("--threads", type=click.IntRange(1), default=None,
              help="torch CPU threads (default: torch's choice).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the demo model's weights.")
@click.option("--graceful-timeout", type=click.FloatRange(0), default=5.0, show_default=True,
              help="Seconds running requests get to finish on SIGINT/SIGTERM.")
@click.option("--no-record", is_flag=True,
              help="Collectors installed but switched off (nothing recorded): the baseline their cost is "
                   "measured against (benchmarks/soak.py).")
@sampler_options
@live_options
@metrics_options(auto=False)
def serve(model_path: Path | None, output: Path | None, force: bool, host: str, port: int,
          served_model_name: str | None, max_batch: int, max_queue: int, max_prompt_tokens: int,
          max_output_tokens: int, max_body_bytes: int, device: str, threads: int | None, seed: int,
          graceful_timeout: float, live: str | None, live_token: str | None, live_tls_cert: Path | None,
          live_tls_key: Path | None, live_flush_s: float | None, no_record: bool, metrics_url: str | None = None,
          metrics_interval: float = 1.0, **samplers: float | None) -> int:
    """Run an OpenAI-compatible server with tracetool's collectors on.

    \b
        tracetool serve -o server-trace --port 8000
        tracetool serve --model-dir /models/llama-3.2-1b -o trace --port 0

    Serves GET /v1/models, POST /v1/completions and POST /v1/chat/completions
    (streamed as SSE or not) with the demo model (a small random-init Llama:
    gibberish text, real timings) or a local Hugging Face model directory.
    Every request gets server.request, preprocess, tokenize, queue, prefill,
    decode and detokenize spans, a row per token (kv_len, step) and a row per
    forward pass, written to the trace while it runs; responses carry the
    server's timing (Server-Timing header, or a server_timing field in the last
    SSE event). With --live HOST:PORT the trace is also streamed to
    `tracetool attach` viewers as it is written (docs/live.md). Binds
    127.0.0.1 unless --host says otherwise. With --metrics-url URL it also
    scrapes another server's Prometheus metrics (an engine beside it) into
    the trace on the server clock. Ctrl-C or SIGTERM
    stops it and closes the trace (exit 0). Malformed requests get
    OpenAI-style JSON errors (400, 404 unknown model, 413 body too large,
    503 queue full).
    """
    from tracetool.serving.openai_api import Limits
    from tracetool.serving.runner import ServeConfig, run_server

    if not (device in ("auto", "cpu") or device.startswith("cuda")):
        raise UsageError(f"--device must be cpu, cuda, cuda:N or auto, not {device!r}")
    chosen = chosen_samplers(samplers)
    live_cfg = live_config(live, live_token, live_tls_cert, live_tls_key, live_flush_s)
    out = output or Path(tempfile.mkdtemp(prefix="tracetool-serve-"))
    limits = Limits(max_body_bytes=max_body_bytes, max_prompt_tokens=max_prompt_tokens,
                    max_output_tokens=max_output_tokens)
    cfg = ServeConfig(out=out, model_path=model_path, host=host, port=port, served_name=served_model_name,
                      max_batch=max_batch, max_waiting=max_queue, limits=limits, device=device, seed=seed,
                      threads=threads,
                      graceful_s=graceful_timeout, force=force or output is None,
                      samplers=chosen, live=live_cfg, record=not no_record)
    if metrics_url is not None:
        from collectors.prometheus import metrics_url as checked

        cfg.metrics = (checked(metrics_url), metrics_interval)
    return run_server(cfg)


# -- probe -------------------------------------------------------------------------------------------
@click.command()
@click.argument("url")
@click.option("-n", "--requests", "n", type=click.IntRange(1), default=None,
              help="Requests to send (conversations with --turns); default 16, or every prompt of "
                   "--dataset / line of --replay.")
@click.option("--concurrency", default=str(probe_default("concurrency")), show_default=True, metavar="C[,C...]",
              help="Requests in flight at most; a list (1,4,16) sweeps them, one run each into OUT/<level>.")
@click.option("--rate", default=None, metavar="R[,R...]",
              help="Poisson arrivals at this many requests/s, latency counted from each intended send time "
                   "(default: as fast as --concurrency allows); a list (1,2,4) sweeps them.")
@click.option("--duration", "duration_s", type=click.FloatRange(0, min_open=True), default=None,
              help="Send for this many seconds (with --rate: every arrival within it; else closed loop).")
@click.option("--warmup", "warmup_s", type=click.FloatRange(0), default=probe_default("warmup_s"), show_default=True,
              help="Requests due in the first S seconds are warm-up: recorded in OUT/warmup, left out of "
                   "the figures and the analysis.")
@click.option("--ramp", "ramp_s", type=click.FloatRange(0), default=probe_default("ramp_s"), show_default=True,
              help="With --rate: ramp the arrival rate linearly from 0 over the first S seconds.")
@click.option("--slo", default=None, metavar="KEY=MS,...",
              help="Service-level objectives (ttft_ms, tpot_ms, itl_ms, e2e_ms; attainment=0.99): goodput, "
                   "attainment, and in a sweep the highest level that meets them.")
@click.option("--burstiness", type=click.FloatRange(0, min_open=True), default=probe_default("burstiness"),
              show_default=True,
              help="With --rate: shape of the gamma-distributed gaps between arrivals (1 = Poisson, "
                   "as vLLM's; inf = evenly spaced; below 1 burstier).")
@click.option("--prompt-tokens", type=click.IntRange(1), default=probe_default("prompt_tokens"), show_default=True,
              help="Approximate prompt length: this many random common words (~1 token each).")
@click.option("--prompt-file", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Prompts to send, one per line (cycled); replaces --prompt-tokens.")
@click.option("--dataset", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Prompts from a file: ShareGPT JSON, JSONL (prompt or messages per line) or plain text, "
                   "one prompt per line (docs/workloads.md).")
@click.option("--replay", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Replay a timestamped trace: vLLM timed-trace or Mooncake JSONL (docs/workloads.md).")
@click.option("--time-scale", type=click.FloatRange(0, min_open=True), default=probe_default("time_scale"),
              show_default=True,
              help="With --replay: multiply the file's gaps by this (0.5 = twice as fast).")
@click.option("--input-len", default=None, metavar="N[:STD]",
              help="Synthetic prompts of N tokens (normal with STD), exact with --tokenizer, else approximate.")
@click.option("--output-len", default=None, metavar="N[:STD]",
              help="max_tokens per request drawn as N tokens (normal with STD); replaces --max-tokens.")
@click.option("--prefix-len", type=click.IntRange(0), default=probe_default("prefix_len"), show_default=True,
              help="Put one shared N-token prefix before every prompt (exercises prefix caches).")
@click.option("--turns", type=click.IntRange(1), default=probe_default("turns"), show_default=True,
              help="Multi-turn: each request starts a conversation of K turns carrying its history (chat).")
@click.option("--max-tokens", type=click.IntRange(1), default=probe_default("max_tokens"), show_default=True,
              help="max_tokens of each request.")
@click.option("--tokenizer", type=click.Path(path_type=Path), default=None,
              help="Local tokenizer (a model directory or tokenizer.json; never downloaded): prompt tokens "
                   "where the server's usage gives none.")
@click.option("--chat/--completions", "chat", default=None,
              help="Endpoint: /v1/chat/completions (default) or /v1/completions.")
@old_spelling("--model", "--served-model-name", "model")
@click.option("--served-model-name", "model", default=None,
              help="Model name in the API, as the server serves it (default: the first from GET /v1/models).")
@click.option("--api-key", envvar="OPENAI_API_KEY", default=None,
              help="Bearer token (default: $OPENAI_API_KEY).")
@click.option("--timeout", type=click.FloatRange(0, min_open=True), default=probe_default("timeout_s"),
              show_default=True,
              help="Seconds one request may take before it counts as failed.")
@click.option("--ignore-eos", is_flag=True, help="Ask for exactly --max-tokens (vLLM/SGLang's ignore_eos).")
@click.option("--no-usage", is_flag=True,
              help="Do not send stream_options.include_usage nor include_metrics (old servers).")
@click.option("--seed", type=int, default=probe_default("seed"), show_default=True,
              help="Seeds prompts and arrival times.")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None,
              help="Write the client trace here.")
@click.option("--force", is_flag=True, help="Replace the trace in a non-empty output directory.")
@click.option("-q", "--quiet", is_flag=True, help="No progress on stderr.")
@metrics_options(auto=True)
@json_option
def probe(url: str, n: int, concurrency: str, rate: str | None, duration_s: float | None, warmup_s: float,
          ramp_s: float, slo: str | None, burstiness: float, prompt_tokens: int,
          prompt_file: Path | None, dataset: Path | None, replay: Path | None, time_scale: float,
          input_len: str | None, output_len: str | None, prefix_len: int, turns: int,
          max_tokens: int, tokenizer: Path | None, chat: bool | None, model: str | None,
          api_key: str | None, timeout: float, ignore_eos: bool, no_usage: bool, seed: int,
          output: Path | None, force: bool, quiet: bool, as_json: bool, metrics_url: str | None = None,
          metrics_interval: float = 1.0) -> int:
    """Load-test an OpenAI-compatible endpoint and record what the client saw.

    \b
        tracetool probe http://127.0.0.1:8000 -n 64 --concurrency 8 -o client-trace
        tracetool probe https://host/v1 --served-model-name m --rate 2 --prompt-tokens 512 --max-tokens 128
        tracetool probe URL --dataset sharegpt.json -n 200 --rate 4 --tokenizer /models/llama
        tracetool probe URL --replay mooncake.jsonl --time-scale 0.5 -o trace

    Works with vLLM, SGLang, TGI, llama.cpp server or tracetool serve. Streams
    each request, sends its id as X-Request-ID (and traceparent), and prints
    TTFT, TPOT, ITL and e2e (mean, p50, p90, p99) with vLLM bench serve's
    definitions (AIPerf calls TPOT "inter-token latency"), plus network time
    when the server reports its total time, and queue/prefill/decode when it
    reports phases (llama.cpp's timings, vLLM's per-request metrics). With -o
    it writes a v1 trace: client.request and client.connect spans, each
    token's client receipt time, one requests row per request with its
    outcome. Failed requests, broken streams included (no content token, no
    finish_reason, an error event, cut mid-message), are recorded and counted;
    a request on a pooled connection closed before any response byte is sent
    again once on a new one. With --metrics-url auto (or a URL) and -o it also
    scrapes the server's Prometheus metrics every --metrics-interval seconds
    into the trace (server_metrics: requests waiting/running, KV-cache usage,
    queue/prefill/decode histograms, on this host's clock); a bad metrics
    endpoint gets one warning and never costs the probe its results. The exit
    code is 0 when the run completed, 3 when nothing could be reached.
    """
    from tracetool.serving.probe import ProbeConfig, run_probe
    from tracetool.serving.report import print_probe_report, probe_report
    from tracetool.serving.sweep import parse_levels, print_sweep, run_sweep
    from tracetool.serving.workloads import parse_len
    from tracetool.slo import parse_slo
    from tracetool.writer.output import prepare_output

    slo_spec = parse_slo(slo)
    conc = parse_levels(concurrency, "--concurrency", integer=True)
    rates = parse_levels(rate, "--rate", integer=False) if rate is not None else None
    if len(conc) > 1 and rates is not None and len(rates) > 1:
        raise UsageError("sweep one of --concurrency and --rate, not both")
    if output is not None:
        prepare_output(output, force, create=False)
    cfg = ProbeConfig(url=url, n=n, concurrency=int(conc[0]), rate=rates[0] if rates else None,
                      burstiness=burstiness, duration_s=duration_s, warmup_s=warmup_s, ramp_s=ramp_s,
                      prompt_tokens=prompt_tokens,
                      prompt_file=prompt_file, max_tokens=max_tokens, chat=chat, model=model, api_key=api_key,
                      timeout_s=timeout, seed=seed, ignore_eos=ignore_eos, include_usage=not no_usage,
                      out=output, progress=not quiet, tokenizer=tokenizer, dataset=dataset, replay=replay,
                      time_scale=time_scale, prefix_len=prefix_len, turns=turns,
                      input_len=parse_len(input_len, "--input-len") if input_len else None,
                      output_len=parse_len(output_len, "--output-len") if output_len else None,
                      metrics_url=metrics_url, metrics_interval_s=metrics_interval)
    if len(conc) > 1 or (rates is not None and len(rates) > 1):
        axis, levels = ("concurrency", conc) if len(conc) > 1 else ("rate", rates or [])
        with sigterm_as_ctrl_c():
            doc = run_sweep(cfg, axis, levels, slo_spec)
        if as_json:
            emit_json(doc)
        else:
            print_sweep(doc)
        return 0
    with sigterm_as_ctrl_c():  # stopped early either way, the trace is closed first
        result = run_probe(cfg)
    report = probe_report(result, slo=slo_spec)
    if as_json:
        emit_json(report)
    else:
        print_probe_report(report)
    if output is not None:
        warn(f"trace written to {output}")
        if metrics_url is not None:
            from tracetool.meta import read_meta

            info = read_meta(output).get("server_metrics") or {}
            warn(f"engine metrics: {info.get('scrapes', 0)} scrape(s) of {info.get('url')}, "
                 f"{info.get('rows', 0):,} samples in server_metrics"
                 + (f"; stopped: {info['stopped']}" if info.get("stopped") else ""))
    return 0


# -- merge -------------------------------------------------------------------------------------------
@click.command()
@click.argument("client_trace", type=click.Path(path_type=Path))
@click.argument("server_trace", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True, help="Joined trace to write.")
@click.option("--force", is_flag=True, help="Replace table files in a non-empty output directory.")
@json_option
def merge(client_trace: Path, server_trace: Path, output: Path, force: bool, as_json: bool) -> int:
    """Join a client trace (tracetool probe) and a server trace of the same run.

    \b
        tracetool merge client-trace server-trace -o joined

    Joins on request id (the probe sends it as X-Request-ID; tracetool's
    middleware adopts it), else, for servers that keep their own ids (a
    trace from `tracetool receive`), on the W3C trace id of the traceparent
    the probe sends, and says on stderr how many joined each way and why the
    rest did not. It fills each token's client receipt time, and
    estimates each request's clock offset under the symmetric-delay
    assumption (as NTP) into a clock_offsets table, only to draw a joined
    timeline, never to measure network. Network is a difference of
    durations: client.request minus the server's span where that span is
    the server's whole request (tracetool's middleware); where it is an
    engine's (vLLM's llm_request) the difference is split into network,
    round trips from the probe's TCP handshakes, and the server's frontend
    (docs/findings.md, server-frontend). Every other table of both traces is kept (the
    probe's server_metrics included); what cannot be (two hosts' rows with
    no clock to tell them apart) is said on stderr and in meta.json's notes.
    Prints how many requests joined.
    """
    from tracetool.merge import merge_traces
    from tracetool.otlp.join import IdJoin

    rep = merge_traces(client_trace, server_trace, output, force=force)
    for line in [*IdJoin(**(rep.id_join or {})).lines(), *rep.not_kept]:
        warn(line)
    if as_json:
        emit_json({"version": 1, **rep.as_dict()})
        return 0
    pct = 100.0 * rep.joined / rep.client_requests if rep.client_requests else 0.0
    off = NOT_MEASURED if rep.offset_ns_median is None else units.ms(rep.offset_ns_median / 1e6, 3)
    echo(f"joined {rep.joined}/{rep.client_requests} client requests ({pct:.0f} %) with the server trace; "
         f"{rep.server_only} server-only, {rep.client_only} client-only; "
         f"{rep.tokens_with_recv:,} tokens with client receipt times; median clock offset {off}")
    warn(f"merged trace written to {output}")
    return 0
