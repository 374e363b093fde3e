"""`octlm serve`'s throughput on this CPU: new tokens per second for one client at a time, and for
8 and 32 concurrent clients, side by side; the latency to the first token and per token (p50,
p99); and the same model in `transformers`' `generate` at batch 1 and 8.

    .venv/bin/python -m bench.serve_throughput [--preset small] [--new 64] [--rounds 3]

The model is the preset's from its init (seed 0), fp32, served by `octlm serve`'s app (the
scheduler, Starlette, uvicorn) in a child process on a loopback port; the clients are threads
of this process sending streamed `/v1/completions` requests over HTTP, each a different prompt
of `--prompt-len` tokens, greedy, `--new` tokens. The EOS row of the (tied) embedding is zeroed,
so greedy decoding never picks EOS and every request makes all its tokens, in octlm and in
transformers alike. The tokenizer is a word-level one whose word `wN` is id N (any id decodes to
text, so every token is a chunk of the stream). The transformers model is the same weights
through `--format hf`'s conversion (`LlamaForCausalLM`, fp32, sdpa), timed with `generate`
(greedy, the same prompts and new tokens, its KV cache) while the server idles.
Both sides run with the same torch thread count (`--threads`; default torch's, one per core:
on a machine whose cores other work keeps busy, one thread per process avoids OpenMP's waits
on a busy core, which slow small matrix products by an order of magnitude).

Each round runs every setting once, in a rotated order; the result is each setting's median
tokens/s and the median of the per-round ratios (one at a time against 8 and 32 clients; octlm
one at a time against transformers at batch 1, octlm with 8 clients against batch 8).
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import socket
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from octlm.config.shape import PRESETS, preset
from octlm.model.gpt import GPT
from octlm.model.hf import hf_config, hf_state_dict

EOS = 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="small", choices=sorted(PRESETS))
    parser.add_argument("--clients", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--new", type=int, default=64, help="new tokens per request")
    parser.add_argument("--prompt-len", type=int, default=16, help="prompt tokens per request")
    parser.add_argument("--sequential", type=int, default=4, help="requests one at a time")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hf-batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--no-hf", action="store_true", help="skip transformers")
    parser.add_argument(
        "--seeded", action="store_true", help="requests give a seed: the exact path (docs/serve.md)"
    )
    parser.add_argument("--threads", type=int, help="torch threads, both sides (default: torch's)")
    return parser


def bench_model(name: str) -> GPT:
    """The preset's model from its init, fp32, its EOS embedding row zeroed (never greedy)."""
    torch.manual_seed(0)
    model = GPT(preset(name)).eval()
    with torch.no_grad():
        model.tok_embeddings.weight[EOS] = 0
    return model


def word_tokenizer(vocab_size: int):
    """octlm's specials at 0-2 and the word `wN` for every other id N."""
    import tokenizers

    from octlm.tokenizer.core import SPECIAL_TOKENS, Tokenizer

    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    vocab |= {f"w{i}": i for i in range(len(vocab), vocab_size)}
    hf = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token=SPECIAL_TOKENS[2]))
    hf.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    hf.add_special_tokens(list(SPECIAL_TOKENS))
    return Tokenizer(hf, "word-level")


def serve(name: str, port: int, threads: int) -> None:
    """The child process: `octlm serve`'s app for the bench model on 127.0.0.1:`port`."""
    from octlm.serve.app import Served, run_server
    from octlm.serve.batching import Scheduler

    torch.set_num_threads(threads)
    model = bench_model(name)
    tokenizer = word_tokenizer(model.config.vocab_size)
    run_server(Served("bench", tokenizer, Scheduler(model), chat=False), "127.0.0.1", port)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(name: str) -> tuple[multiprocessing.Process, int]:
    port, threads = free_port(), torch.get_num_threads()
    process = multiprocessing.get_context("spawn").Process(target=serve, args=(name, port, threads))
    process.start()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and process.is_alive():
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            connection.request("GET", "/health")
            if connection.getresponse().status == 200:
                return process, port
        except OSError:
            time.sleep(0.2)
    process.kill()
    raise SystemExit("the bench server did not answer /health")


def prompts(count: int, length: int, vocab_size: int, seed: int) -> list[list[int]]:
    """`count` prompts of BOS + `length` - 1 ordinary ids."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab_size, (count, length - 1), generator=gen).tolist()
    return [[0, *p] for p in ids]


def stream(port: int, prompt: list[int], new: int, seeded: bool) -> list[float]:
    """One streamed greedy completion: the times (from sending) of each token's chunk. With
    `seeded` the request gives a seed, so it decodes on the exact path (docs/serve.md)."""
    text = " ".join(f"w{i}" for i in prompt[1:])
    body = {"prompt": text, "max_tokens": new, "temperature": 0, "stream": True}
    if seeded:
        body["seed"] = 1
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    connection.request("POST", "/v1/completions", json.dumps(body))
    response = connection.getresponse()
    times = []
    for line in response:
        if line.startswith(b"data: {"):
            choice = json.loads(line[6:])["choices"][0]
            if choice["text"]:
                times.append(time.perf_counter() - t0)
    connection.close()
    if len(times) != new:
        raise SystemExit(f"a request made {len(times)} tokens, not {new}")
    return times


def clients(
    port: int, work: list[list[int]], new: int, concurrent: int, seeded: bool = False
) -> tuple[float, list]:
    """`work`'s prompts sent by `concurrent` clients: (seconds, each request's chunk times)."""
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrent) as pool:
        times = list(pool.map(lambda p: stream(port, p, new, seeded), work))
    return time.perf_counter() - t0, times


def hf_model(model: GPT):
    """The same weights as a transformers model, as `octlm export --format hf` converts them."""
    import transformers

    cfg = hf_config(model.config, torch.float32) | {"bos_token_id": 0, "eos_token_id": None}
    config_class = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    hf = transformers.AutoModelForCausalLM.from_config(config_class, attn_implementation="sdpa")
    weights = {k: v.detach() for k, v in model.state_dict().items()}
    tensors = hf_state_dict(weights, model.config.n_layers, model.config.qk_norm)
    missing, unexpected = hf.load_state_dict(tensors, strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise SystemExit(f"the transformers model does not take the weights: {missing}")
    hf.tie_weights()
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 2
    return hf.eval()


def hf_generate(hf, work: list[list[int]], new: int) -> tuple[float, list[list[int]]]:
    ids = torch.tensor(work)
    t0 = time.perf_counter()
    with torch.no_grad():
        out = hf.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False)
    return time.perf_counter() - t0, out[:, ids.shape[1] :].tolist()


def settings(args: argparse.Namespace) -> list[tuple[str, int]]:
    octlm_runs = [("octlm", 1)] + [("octlm", c) for c in args.clients]
    return octlm_runs + ([] if args.no_hf else [("hf", b) for b in args.hf_batch])


def run_rounds(args: argparse.Namespace, port: int, hf) -> tuple[dict, dict]:
    """Every setting once per round, rotated: (tokens/s per setting, octlm's chunk times)."""
    rates: dict[tuple[str, int], list[float]] = {s: [] for s in settings(args)}
    latencies: dict[int, list[list[float]]] = {s[1]: [] for s in rates if s[0] == "octlm"}
    vocab = hf.config.vocab_size if hf is not None else args.vocab
    for r in range(args.rounds):
        order = list(rates)[r % len(rates) :] + list(rates)[: r % len(rates)]
        for kind, k in order:
            count = args.sequential if (kind, k) == ("octlm", 1) else k
            work = prompts(count, args.prompt_len, vocab, seed=1000 * r + k)
            if kind == "hf":
                seconds, _ = hf_generate(hf, work, args.new)
            else:
                seconds, times = clients(port, work, args.new, k, args.seeded)
                latencies[k] += times
            rates[kind, k].append(count * args.new / seconds)
        print(f"round {r}: " + ", ".join(f"{n} {k}: {v[-1]:.0f}" for (n, k), v in rates.items()))
    return rates, latencies


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def latency_ms(times: list[list[float]]) -> list[str]:
    """p50 and p99 of the time to the first token, then of the time per later token (ms)."""
    first = [t[0] for t in times]
    per_token = [(t[-1] - t[0]) / (len(t) - 1) for t in times] if len(times[0]) > 1 else [0.0]
    return [f"{1000 * percentile(v, q):.1f}" for v in (first, per_token) for q in (0.5, 0.99)]


def report(args: argparse.Namespace, rates: dict, latencies: dict) -> None:
    def ratio(a: tuple[str, int], b: tuple[str, int]) -> str:
        per_round = [x / y for x, y in zip(rates[a], rates[b], strict=True)]
        return f"{statistics.median(per_round):.2f}x"

    print("| setting | tokens/s | vs one at a time | first token p50 / p99 ms | "
          "per token p50 / p99 ms |")  # fmt: skip
    print("|---|---|---|---|---|")
    for (kind, k), values in rates.items():
        median = statistics.median(values)
        if kind == "octlm":
            who = "one at a time" if k == 1 else f"{k} concurrent clients"
            first50, first99, tok50, tok99 = latency_ms(latencies[k])
            print(f"| octlm, {who} | {median:.0f} | {ratio((kind, k), ('octlm', 1))} | "
                  f"{first50} / {first99} | {tok50} / {tok99} |")  # fmt: skip
        else:
            print(f"| transformers generate, batch {k} | {median:.0f} | | | |")
    for k, c in ((1, 1), (8, 8)):
        if ("hf", k) in rates and ("octlm", c) in rates:
            who = "one at a time" if c == 1 else f"{c} clients"
            print(f"octlm ({who}) / transformers (batch {k}): {ratio(('octlm', c), ('hf', k))}")


def same_greedy(port: int, hf, args: argparse.Namespace) -> bool:
    """Whether octlm's served reply and transformers' greedy ids agree on one prompt."""
    work = prompts(1, args.prompt_len, hf.config.vocab_size, seed=7)
    text_ids = hf_generate(hf, work, args.new)[1][0]
    body = {"prompt": " ".join(f"w{i}" for i in work[0][1:]), "max_tokens": args.new,
            "temperature": 0}  # fmt: skip
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    connection.request("POST", "/v1/completions", json.dumps(body))
    reply = json.loads(connection.getresponse().read())["choices"][0]["text"]
    return reply.split() == [f"w{i}" for i in text_ids]


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = bench_model(args.preset)
    args.vocab = model.config.vocab_size
    hf = None if args.no_hf else hf_model(model)
    params, threads = model.num_params() / 1e6, torch.get_num_threads()
    print(f"{args.preset} ({params:.2f}M parameters, fp32, from init), threads {threads}; "
          f"prompts of {args.prompt_len} tokens, {args.new} new tokens each, greedy; "
          f"one at a time: {args.sequential} requests; {args.rounds} rounds; "
          f"{'seeded: the exact path' if args.seeded else 'no seed: the plain path'}")  # fmt: skip
    process, port = start_server(args.preset)
    try:
        warm = prompts(2, args.prompt_len, args.vocab, seed=1)
        clients(port, warm, args.new, 2, args.seeded)  # warm up (and the exact path's packing)
        if hf is not None:
            print(f"same greedy tokens in octlm and transformers: {same_greedy(port, hf, args)}")
        rates, latencies = run_rounds(args, port, hf)
    finally:
        process.terminate()
        process.join(30)
    report(args, rates, latencies)


if __name__ == "__main__":
    main()
