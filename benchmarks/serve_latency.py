"""`bertforge serve` latency: how long short requests take alone and while long requests run.

The service runs the model one forward pass (one batch) at a time, requests taking turns batch by
batch in arrival order (`bertforge.serving.predictor.take_turns`), and caps the tokens of a request
(``--max-request-tokens``). This measures what a client with a short request sees:

* ``alone``: ``--requests`` short requests (one input of ``--short-words`` words), one after the
  other, nothing else running;
* ``with long``: the same short requests while another client sends long requests back to back
  (one input of ``--long-words`` words, just under the token cap by default: the largest request
  the service accepts), until the short ones are done;
* ``rejected``: one request of 1 MiB of text, over the token cap: the time to its 413.

A short request waits for about one batch of a long one: ``--batch-size`` (the server's) sets
that batch. ``--max-request-tokens 0`` leaves the flag out, for a server without it.

Each row gives the p50 / p99 / max latency in milliseconds, measured by the client from sending the
request to reading the whole answer.

The server is ``bertforge serve`` in a subprocess on 127.0.0.1 (a free port), serving a random
classification model of a bertforge preset (``--preset``, default mini: 4 layers, hidden 256) with a
made-up vocabulary (every lower-case letter, as a word and as a ``##`` piece, plus 2,000 words), on
the CPU with torch's default threads. Traffic goes to 127.0.0.1 only; every request has a timeout;
the script stops the server when done.

    .venv/bin/python benchmarks/serve_latency.py --preset mini --requests 100 [--batch-size 8]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import socket
import statistics
import string
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_time import cpu_model  # noqa: E402

TIMEOUT = 120.0
"""Seconds a request (and the server's start) may take before the script gives up."""


def build_checkpoint(folder: Path, preset: str, seed: int) -> list[str]:
    """A random classification checkpoint with its tokenizer in ``folder``; returns the whole-word tokens."""
    import torch

    from bertforge.model.config import BertConfig
    from bertforge.model.heads import BertForSequenceClassification
    from bertforge.text.tokenizer import BertTokenizer

    rng = random.Random(seed)
    letters = list(string.ascii_lowercase)
    words = sorted({"".join(rng.choices(letters, k=rng.randint(3, 9))) for _ in range(2000)} - set(letters))
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *letters, *(f"##{c}" for c in letters), *words]
    torch.manual_seed(seed)
    config = BertConfig.preset(preset, vocab_size=len(tokens), id2label={0: "neg", 1: "pos"})
    BertForSequenceClassification(config).save_pretrained(folder)
    BertTokenizer(tokens).save_pretrained(folder)
    return words


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port: int, inputs: list[str]) -> tuple[int, float]:
    """(status, seconds) of one POST /predict."""
    body = json.dumps({"inputs": inputs}).encode()
    started = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
    try:
        conn.request("POST", "/predict", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        return response.status, time.perf_counter() - started
    finally:
        conn.close()


def wait_ready(port: int, server: subprocess.Popen) -> None:
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the server stopped (exit code {server.returncode})")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"the server did not answer within {TIMEOUT:.0f} s")


def summary(seconds: list[float]) -> dict[str, float]:
    ms = sorted(1000 * s for s in seconds)
    p99 = ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]
    return {"n": len(ms), "p50_ms": round(statistics.median(ms), 1), "p99_ms": round(p99, 1),
            "max_ms": round(ms[-1], 1)}


def short_requests(port: int, text: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        status, seconds = post(port, [text])
        if status != 200:
            raise SystemExit(f"a short request got {status}")
        out.append(seconds)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="mini", help="model size (a bertforge preset); default %(default)s")
    p.add_argument("--requests", type=int, default=100, help="short requests per case; default %(default)s")
    p.add_argument("--short-words", type=int, default=20, help="words of a short request; default %(default)s")
    p.add_argument("--long-words", type=int, default=16000,
                   help="words of a long request (one token each); default %(default)s, under the 16,384-token cap")
    p.add_argument("--max-request-tokens", type=int, default=16384,
                   help="the server's cap; default %(default)s (0: the server's default, and no 1 MiB request)")
    p.add_argument("--batch-size", type=int, default=32,
                   help="the server's sequences per forward pass: a short request waits for one such batch of a "
                        "long one; default %(default)s")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="also write the results to this file")
    args = p.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"
        words = build_checkpoint(folder, args.preset, args.seed)
        rng = random.Random(args.seed)
        short = " ".join(rng.choices(words, k=args.short_words))
        long = " ".join(rng.choices(words, k=args.long_words))
        huge = " ".join(rng.choices(words, k=(1 << 20) // 7))[: (1 << 20) - 100]  # just under 1 MiB of body
        port = free_port()
        command = [sys.executable, "-c", "import sys; from bertforge.cli import main; sys.exit(main(sys.argv[1:]))",
                   "serve", str(folder), "--port", str(port), "--device", "cpu", "--batch-size", str(args.batch_size)]
        if args.max_request_tokens:
            command += ["--max-request-tokens", str(args.max_request_tokens)]
        server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_ready(port, server)
            short_requests(port, short, 5)  # warm-up
            alone = short_requests(port, short, args.requests)

            stop = threading.Event()
            long_times: list[float] = []

            def send_long() -> None:
                while not stop.is_set():
                    status, seconds = post(port, [long])
                    if status != 200:
                        raise SystemExit(f"a long request got {status}")
                    long_times.append(seconds)

            sender = threading.Thread(target=send_long, daemon=True)
            sender.start()
            time.sleep(0.2)  # the first long request is running
            with_long = short_requests(port, short, args.requests)
            stop.set()
            sender.join(TIMEOUT)
            status, rejected = post(port, [huge]) if args.max_request_tokens else (0, 0.0)
        finally:
            server.terminate()
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()

    import torch

    results = {
        "preset": args.preset, "cpu": cpu_model(), "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(), "batch_size": args.batch_size, "short_tokens": args.short_words + 2,
        "long_tokens": args.long_words + 2, "max_request_tokens": args.max_request_tokens,
        "alone": summary(alone), "with_long": summary(with_long), "long": summary(long_times),
        "rejected_1MiB": {"status": status, "ms": round(1000 * rejected, 1)},
    }
    print(f"# {args.preset}, {results['cpu']}, {results['cores']} cores, {results['torch_threads']} torch threads, "
          f"batch size {args.batch_size}, short request {results['short_tokens']} tokens, "
          f"long request {results['long_tokens']} tokens")
    print("| case | n | p50 ms | p99 ms | max ms |")
    print("|---|---|---|---|---|")
    for name, key in (("short, alone", "alone"), ("short, with long requests running", "with_long"),
                      ("long", "long")):
        r = results[key]
        print(f"| {name} | {r['n']} | {r['p50_ms']} | {r['p99_ms']} | {r['max_ms']} |")
    if args.max_request_tokens:
        print(f"1 MiB of text: {status} in {results['rejected_1MiB']['ms']} ms")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
