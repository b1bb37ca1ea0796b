"""Throughput and memory of ``bertforge prepare`` against the bare ``tokenizers`` encode rate.

What it measures, on the real corpus (the 10,033 English Wikipedia leads of
``bertforge.resources.wikipedia_leads_file()``) with the real uncased vocab of
``bertforge.resources.minilm_folder()`` (30,522 WordPieces):

1. **Bare tokenizer rate.** The leads are read once through
   ``bertforge.data.corpus.iter_documents(...)`` and split with ``RawDocument.sentences()``
   (exactly the sentences ``prepare`` tokenizes). They are encoded, in this process, by

   * the stock BERT pipeline of ``tokenizers``: ``Tokenizer(WordPiece.from_file(vocab.txt))`` +
     ``BertNormalizer(lowercase=True)`` + ``BertPreTokenizer()``, with ``encode_batch_fast``
     (no offsets) and ``encode_batch`` (with offsets), no special tokens;
   * bertforge's ``BertTokenizer.encode_batch_ids`` (what ``prepare`` calls);

   each with 1 thread (``TOKENIZERS_PARALLELISM=false``, as in a ``prepare`` worker) and with
   tokenizers' own thread pool (all cores). Rate = WordPieces / wall second, median (and best) of
   ``--repeats`` runs after a warm-up; ``cpu/wall`` shows how many cores were really used (on a
   shared machine "all" may get fewer than nproc: check it, and the ``load`` columns). Measured
   before the prepare runs and again after them (``--bare-passes``); ratios use the faster pass.

2. **prepare rate.** ``python -m bertforge prepare INPUT --out DIR --tokenizer MINILM
   --workers W --dupe-factor D`` in a subprocess under ``/usr/bin/time -v``, for W in
   ``--workers`` and D in ``--dupe``, defaults otherwise (max_seq_length 128, NSP, static masks,
   shard_chars 2,000,000), on three inputs:

   * ``leads.json``: the leads file itself (wiki-json: sentence splitting happens in the workers);
   * ``leads.txt``: the same sentences written once in Google's format (one sentence per line,
     a blank line between documents) -- the exact text the bare tokenizer sees;
   * ``leads-200MB.txt``: ``leads.txt`` repeated until the file holds >= ``--big-mb`` MB
     (written once into ``--cache-dir``, reused afterwards). Only with ``--big-workers`` x
     ``--big-dupe`` (default: 2 workers, dupe_factor 1 and 10; the dupe 10 run is the longest
     part of the benchmark, about 5 minutes on 2 idle cores: ``--big-dupe 1`` skips it).

   Rate = the manifest's ``totals.input_tokens`` (WordPieces of the input) / wall seconds, both
   end to end (the whole command: interpreter start, CLI imports, spawning workers) and as
   ``prepare()`` itself reports it (its last line, "... in X s"). ``tok/cpu-s`` divides by the
   user+sys CPU seconds of the whole process tree instead (less sensitive to other load).
   ``vs bare`` = prepare's end-to-end rate / the stock ``encode_batch_fast`` rate, with 1 thread
   and with all cores (the issue's target: >= 50 %).

3. **Memory.** ``/usr/bin/time``'s "Maximum resident set size" is the peak of the *largest single
   process* of the tree. So a sampler also walks the process tree every ``--interval`` s
   (``/proc/<pid>/stat`` for parents, ``status`` for VmRSS/VmHWM, ``smaps_rollup`` for Pss) and
   reports the peak of the summed RSS (counts shared library pages once per process: an upper
   bound), the peak of the summed PSS (shared pages divided among the processes: the honest
   total), and each role's peak (main process, each worker). Target: < 1 GB at 200 MB, flat in
   corpus size.

4. **Where a shard's time goes** (``--phases``, default on): the steps of
   ``bertforge.data.prepare.build_shard`` timed one by one on the first window of the leads
   (wiki-json, so sentence splitting is included), single-threaded like a worker, at each dupe
   factor. The steps are re-assembled here from the module's own functions
   (``DocumentPool.from_sentences``, ``create_instances``, ``mask_batch``, ``_instance_stats``,
   ``write_shard``, with the same generators); if ``build_shard`` changes, update
   ``shard_phases``. ``--profile`` adds a cProfile of the real ``build_shard`` on that window (top
   functions by own time).

Run from the repository root (about 10 minutes on 2 idle cores with the defaults)::

    .venv/bin/python benchmarks/prepare.py --json /tmp/prepare-bench.json
    .venv/bin/python benchmarks/prepare.py --no-big                  # small inputs only (~3 min)
    .venv/bin/python benchmarks/prepare.py --big-dupe 1                   # skip the 200 MB dupe-10 run (~5 min)
    .venv/bin/python benchmarks/prepare.py --inputs txt --workers 2 --dupe 1 --no-bare --profile

Outputs of ``prepare`` go to a temporary folder and are deleted after each run (``--keep``).
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as _dt
import io
import json
import math
import os
import platform
import pstats
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

try:
    import bertforge  # noqa: F401
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from bertforge.data import prepare as P
from bertforge.data.corpus import iter_documents
from bertforge.data.instances import DocumentPool, create_instances, mask_batch
from bertforge.data.shards import write_shard
from bertforge.resources import minilm_folder, wikipedia_leads_file

_CLK = os.sysconf("SC_CLK_TCK")
_MB = 1024 * 1024


# ---------------------------------------------------------------------------- machine
def machine_info() -> dict[str, Any]:
    import numpy
    import tokenizers

    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).resolve().parent).stdout.strip()
    except OSError:
        commit = ""
    try:
        import blingfire  # noqa: F401
        splitter = "blingfire"
    except (ImportError, OSError):
        splitter = "regex fallback"
    mem_total = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_total = int(line.split()[1]) // 1024
    except OSError:
        pass
    return {
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "nproc": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu": cpu,
        "mem_total_mb": mem_total,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "tokenizers": tokenizers.__version__,
        "numpy": numpy.__version__,
        "sentence_splitter": splitter,
        "bertforge_commit": commit,
        "loadavg_start": os.getloadavg(),
    }


# ---------------------------------------------------------------------------- inputs
def leads_documents() -> tuple[list[list[str]], float]:
    """The leads as prepare sees them: documents of sentences (one read, one split)."""
    t0 = time.perf_counter()
    docs = [d.sentences() for d in iter_documents([wikipedia_leads_file()], fmt="wiki-json")]
    return docs, time.perf_counter() - t0


def google_text(docs: list[list[str]]) -> str:
    """Google's format: one sentence per line, a blank line after each document."""
    return "".join("\n".join(doc) + "\n\n" for doc in docs if doc)


def write_replicated(block: str, path: Path, min_bytes: int) -> dict[str, Any]:
    """``block`` repeated until the file holds >= ``min_bytes``; written once (atomically), reused."""
    data = block.encode("utf-8")
    copies = max(1, math.ceil(min_bytes / len(data)))
    size = copies * len(data)
    if not (path.is_file() and path.stat().st_size == size):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        with open(tmp, "wb") as f:
            for _ in range(copies):
                f.write(data)
        os.replace(tmp, path)
    return {"path": str(path), "copies": copies, "bytes": size}


# ---------------------------------------------------------------------------- bare tokenizers
def stock_bert_tokenizer(vocab_txt: Path):
    """tokenizers' own BERT pipeline (what ``BertWordPieceTokenizer(vocab, lowercase=True)`` builds)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    tok = Tokenizer(models.WordPiece.from_file(str(vocab_txt), unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                strip_accents=None, lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    return tok


def bare_rates(sentences: list[str], tokenizer_dir: Path, repeats: int, when: str) -> list[dict[str, Any]]:
    from bertforge.text.tokenizer import BertTokenizer

    stock = stock_bert_tokenizer(tokenizer_dir / "vocab.txt")
    ours = BertTokenizer.from_pretrained(tokenizer_dir)
    variants = {
        "tokenizers BERT encode_batch_fast": lambda xs: [e.ids for e in stock.encode_batch_fast(xs, add_special_tokens=False)],
        "tokenizers BERT encode_batch": lambda xs: [e.ids for e in stock.encode_batch(xs, add_special_tokens=False)],
        "bertforge encode_batch_ids": ours.encode_batch_ids,
    }
    saved = os.environ.get("TOKENIZERS_PARALLELISM")
    rows = []
    try:
        for threads, flag in (("1", "false"), ("all", "true")):
            # tokenizers reads the variable at every call (the thread pool is sized by the cores).
            os.environ["TOKENIZERS_PARALLELISM"] = flag
            for name, encode in variants.items():
                encode(sentences[:2000])  # warm-up
                walls, cpus, n, load = [], [], 0, os.getloadavg()[0]
                for _ in range(repeats):
                    c0, t0 = time.process_time(), time.perf_counter()
                    ids = encode(sentences)
                    walls.append(time.perf_counter() - t0)
                    cpus.append(time.process_time() - c0)
                    n = sum(map(len, ids))
                    del ids
                wall, cpu = statistics.median(walls), statistics.median(cpus)
                rows.append({"pass": when, "encoder": name, "threads": threads, "tokens": n, "seconds": wall,
                             "tokens_per_s": n / wall, "best_tokens_per_s": n / min(walls),
                             "cpu_per_wall": cpu / wall, "tokens_per_cpu_s": n / cpu,
                             "all_seconds": walls, "loadavg_1min_before": load})
                print(f"  bare {name:36s} threads={threads:3s} {n:>10,} tok  {n / wall:>10,.0f} tok/s  "
                      f"cpu/wall {cpu / wall:.2f}", flush=True)
    finally:
        if saved is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = saved
    return rows


# ---------------------------------------------------------------------------- process-tree sampler
def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _field_kb(text: str | None, name: str) -> int:
    if not text:
        return 0
    m = re.search(rf"^{name}:\s+(\d+) kB", text, re.M)
    return int(m.group(1)) if m else 0


class TreeSampler(threading.Thread):
    """Every ``interval`` s: all descendants of ``root`` (and root), their summed VmRSS and Pss."""

    def __init__(self, root: int, interval: float) -> None:
        super().__init__(daemon=True)
        self.root, self.interval = root, interval
        self.stop = threading.Event()
        self.samples = 0
        self.max_rss_kb = self.max_pss_kb = self.max_procs = 0
        self.procs: dict[int, dict[str, Any]] = {}  # pid -> role, parent, hwm_kb, max_rss_kb, cpu_s

    def run(self) -> None:
        while not self.stop.is_set():
            self.sample()
            self.stop.wait(self.interval)
        self.sample()

    def _tree(self) -> list[tuple[int, int]]:
        children: dict[int, list[int]] = {}
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            stat = _read(f"/proc/{name}/stat")
            if stat is None:
                continue
            ppid = int(stat[stat.rfind(")") + 2:].split()[1])
            children.setdefault(ppid, []).append(int(name))
        out, todo = [], [(self.root, 0)]
        while todo:
            pid, parent = todo.pop()
            out.append((pid, parent))
            todo.extend((c, pid) for c in children.get(pid, ()))
        return out

    def _role(self, pid: int, parent: int) -> str:
        cmd = (_read(f"/proc/{pid}/cmdline") or "").replace("\0", " ")
        if pid == self.root:
            return "root" if cmd.split(" ", 1)[0].endswith("time") else "main"
        if "resource_tracker" in cmd:
            return "resource_tracker"
        if "multiprocessing" in cmd or "spawn_main" in cmd:
            return "worker"
        return "main" if parent == self.root or self.procs.get(parent, {}).get("role") == "root" else "other"

    def sample(self) -> None:
        total_rss = total_pss = n = 0
        for pid, parent in self._tree():
            status = _read(f"/proc/{pid}/status")
            if status is None:
                continue
            rss, hwm = _field_kb(status, "VmRSS"), _field_kb(status, "VmHWM")
            pss = _field_kb(_read(f"/proc/{pid}/smaps_rollup"), "Pss")
            stat = _read(f"/proc/{pid}/stat")
            cpu = 0.0
            if stat:
                f = stat[stat.rfind(")") + 2:].split()
                cpu = (int(f[11]) + int(f[12])) / _CLK  # utime, stime
            p = self.procs.get(pid)
            if p is None:
                p = self.procs[pid] = {"role": self._role(pid, parent), "parent": parent, "hwm_kb": 0,
                                       "max_rss_kb": 0, "cpu_s": 0.0}
            p["hwm_kb"] = max(p["hwm_kb"], hwm)
            p["max_rss_kb"] = max(p["max_rss_kb"], rss)
            p["cpu_s"] = max(p["cpu_s"], cpu)
            total_rss += rss
            total_pss += pss
            n += 1
        self.samples += 1
        self.max_rss_kb = max(self.max_rss_kb, total_rss)
        self.max_pss_kb = max(self.max_pss_kb, total_pss)
        self.max_procs = max(self.max_procs, n)


# ---------------------------------------------------------------------------- one prepare run
_TIME_FIELDS = {
    "Maximum resident set size (kbytes)": "time_max_rss_kb",
    "User time (seconds)": "user_s",
    "System time (seconds)": "sys_s",
    "Percent of CPU this job got": "cpu_percent",
    "Exit status": "exit_status",
}


def run_prepare(label: str, inputs: list[Path], tokenizer_dir: Path, workers: int, dupe: int, work: Path,
                interval: float, keep: bool, timeout: float | None) -> dict[str, Any]:
    out = work / f"out-{label}-w{workers}-d{dupe}"
    shutil.rmtree(out, ignore_errors=True)
    log_out, log_err = work / f"{out.name}.stdout", work / f"{out.name}.stderr"
    cmd = [sys.executable, "-m", "bertforge", "prepare", *map(str, inputs), "--out", str(out),
           "--tokenizer", str(tokenizer_dir), "--workers", str(workers), "--dupe-factor", str(dupe)]
    timed = shutil.which("time") and Path("/usr/bin/time").is_file()
    if timed:
        cmd = ["/usr/bin/time", "-v", *cmd]
    env = os.environ.copy()
    env.pop("TOKENIZERS_PARALLELISM", None)  # as a user would run it
    load0 = os.getloadavg()[0]
    with open(log_out, "w") as so, open(log_err, "w") as se:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=so, stderr=se, env=env)
        sampler = TreeSampler(proc.pid, interval)
        sampler.start()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        wall = time.perf_counter() - t0
        sampler.stop.set()
        sampler.join()
    stdout, stderr = log_out.read_text(errors="replace"), log_err.read_text(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{stdout[-2000:]}\n{stderr[-3000:]}")
    r: dict[str, Any] = {"label": label, "inputs": [str(p) for p in inputs],
                         "input_bytes": sum(p.stat().st_size for p in inputs), "workers": workers,
                         "dupe_factor": dupe, "wall_s": wall, "command": " ".join(cmd),
                         "loadavg_1min_before": load0, "loadavg_1min_after": os.getloadavg()[0]}
    for line in stderr.splitlines():
        key, _, value = line.strip().partition(": ")
        if key in _TIME_FIELDS:
            r[_TIME_FIELDS[key]] = float(value.rstrip("%")) if value.rstrip("%").replace(".", "").isdigit() else value
    m = re.search(r"input tokens in ([\d.]+) s", stdout)
    r["prepare_s"] = float(m.group(1)) if m else None
    manifest = json.loads((out / P.MANIFEST).read_text())
    t = manifest["totals"]
    r.update({k: t[k] for k in ("shards", "instances", "tokens", "input_tokens", "documents", "sentences")})
    r["output_bytes"] = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    r["tokens_per_s"] = t["input_tokens"] / wall
    r["tokens_per_s_prepare"] = t["input_tokens"] / r["prepare_s"] if r["prepare_s"] else None
    cpu = (r.get("user_s") or 0) + (r.get("sys_s") or 0)
    r["cpu_s"] = cpu or None
    r["tokens_per_cpu_s"] = t["input_tokens"] / cpu if cpu else None
    procs = sampler.procs.values()
    by_role: dict[str, list[dict[str, Any]]] = {}
    for p in procs:
        by_role.setdefault(p["role"], []).append(p)
    r["sampler"] = {
        "samples": sampler.samples, "interval_s": interval, "max_procs": sampler.max_procs,
        "max_total_rss_mb": sampler.max_rss_kb / 1024, "max_total_pss_mb": sampler.max_pss_kb / 1024,
        "main_hwm_mb": max((p["hwm_kb"] for p in by_role.get("main", [])), default=0) / 1024,
        "worker_hwm_mb": [p["hwm_kb"] / 1024 for p in by_role.get("worker", [])],
        "main_cpu_s": sum(p["cpu_s"] for p in by_role.get("main", [])),
        "worker_cpu_s": [p["cpu_s"] for p in by_role.get("worker", [])],
        "sum_hwm_mb": sum(p["hwm_kb"] for p in procs) / 1024,
    }
    r["time_max_rss_mb"] = r.get("time_max_rss_kb", 0) / 1024 if timed else None
    if not keep:
        shutil.rmtree(out, ignore_errors=True)
        log_out.unlink(missing_ok=True)
        log_err.unlink(missing_ok=True)
    s = r["sampler"]
    print(f"  prepare {label:14s} w={workers} dupe={dupe:<2d} {t['input_tokens']:>11,} tok  wall {wall:7.1f} s  "
          f"{r['tokens_per_s']:>9,.0f} tok/s (prepare() {r['tokens_per_s_prepare'] or 0:,.0f})  "
          f"time-v max RSS {r['time_max_rss_mb'] or 0:,.0f} MB  tree RSS {s['max_total_rss_mb']:,.0f} MB "
          f"PSS {s['max_total_pss_mb']:,.0f} MB  load {load0:.1f}", flush=True)
    return r


# ---------------------------------------------------------------------------- phases of one shard
def first_window(path: Path, shard_chars: int):
    return next(P._windows(iter_documents([path], stats=None), shard_chars))


def shard_phases(window, tokenizer_dir: Path, dupe: int, out_dir: Path) -> dict[str, Any]:
    """``build_shard``'s steps, timed one by one (single-threaded tokenizer, as in a worker)."""
    cfg = P.PrepareConfig(dupe_factor=dupe)
    tok = P._tokenizer(str(tokenizer_dir))
    T: dict[str, float] = {}
    t = time.perf_counter()

    def tick(name: str) -> None:
        nonlocal t
        now = time.perf_counter()
        T[name] = now - t
        t = now

    special = P.special_ids(tok)
    tick("special ids (vocab scan)")
    per_doc = [d.sentences() for d in window]
    flat = [s for d in per_doc for s in d]
    tick("sentences() (split)")
    ids = tok.encode_batch_ids(flat)
    tick("encode_batch_ids")
    pool = DocumentPool.from_sentences(ids, [len(d) for d in per_doc])
    tick("DocumentPool (flat tokens)")
    rng, mask_rng = P.shard_rngs(cfg.seed, 0)
    instances = create_instances(pool, max_seq_length=cfg.max_seq_length, short_seq_prob=cfg.short_seq_prob,
                                 dupe_factor=P.passes(cfg), nsp=cfg.nsp, special=special, rng=rng)
    tick("create_instances (NSP ranges, assemble)")
    instances = mask_batch(instances, special, cfg.masking, mask_rng)
    tick("mask_batch")
    info = P._instance_stats(instances, cfg, special)
    tick("_instance_stats")
    write_shard(out_dir / "phase.safetensors", instances, vocab_size=special.vocab_size, vocab_hash=tok.vocab_hash,
                info={"input_tokens": len(pool.tokens), **info})
    tick("write_shard")
    total = sum(T.values())
    return {"dupe_factor": dupe, "input_tokens": len(pool.tokens), "instances": len(instances), "seconds": total,
            "tokens_per_s": len(pool.tokens) / total, "phases": T}


def profile_shard(window, tokenizer_dir: Path, dupe: int, out_dir: Path, top: int) -> str:
    P._tokenizer(str(tokenizer_dir))
    task = P._ShardJob(0, window, str(out_dir), str(tokenizer_dir), P.PrepareConfig(dupe_factor=dupe), "profile")
    prof = cProfile.Profile()
    prof.enable()
    P.build_shard(task)
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    return buf.getvalue()


# ---------------------------------------------------------------------------- tables
def table(headers: list[str], rows: list[list[Any]]) -> str:
    cells = [[str(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    numeric = re.compile(r"^[-+]?[\d,.]+( / [\d,.]+)*%?$")
    line = lambda r: "| " + " | ".join(c.rjust(w) if numeric.match(c) else c.ljust(w) for c, w in zip(r, widths)) + " |"
    return "\n".join([line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, cells)])


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="See the module docstring (head -60 benchmarks/prepare.py) for what is measured.")
    ap.add_argument("--inputs", default="json,txt", help="small inputs to run: json (the leads file, wiki-json), "
                    "txt (the same sentences in Google's format); comma-separated (default: json,txt)")
    ap.add_argument("--workers", default="1,2", help="worker counts for the small inputs (default: 1,2)")
    ap.add_argument("--dupe", default="10,1", help="dupe factors for the small inputs (default: 10,1)")
    ap.add_argument("--big-mb", type=float, default=200, help="size of the replicated Google-format file, MB (default: 200)")
    ap.add_argument("--big-workers", default="2", help="worker counts for the big file (default: 2)")
    ap.add_argument("--big-dupe", default="1,10", help="dupe factors for the big file (default: 1,10)")
    ap.add_argument("--no-big", action="store_true", help="skip the big file")
    ap.add_argument("--no-bare", action="store_true", help="skip the bare tokenizer rates")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per bare encoder (median and best; default: 3)")
    ap.add_argument("--bare-passes", type=int, choices=(1, 2), default=2,
                    help="measure the bare rates before the prepare runs (1) or before and after them (2, default); "
                         "the ratios use the faster pass, so a burst of load from other jobs makes them stricter, "
                         "not looser")
    ap.add_argument("--no-phases", action="store_true", help="skip the per-step timing of one shard")
    ap.add_argument("--profile", action="store_true", help="cProfile build_shard on one window (dupe factors of --dupe)")
    ap.add_argument("--profile-top", type=int, default=20, help="functions shown per profile (default: 20)")
    ap.add_argument("--interval", type=float, default=0.5, help="RSS sampling interval, s (default: 0.5)")
    ap.add_argument("--cache-dir", type=Path, default=Path(tempfile.gettempdir()) / "bertforge-bench-prepare",
                    help="where the Google-format inputs are written once (default: %(default)s)")
    ap.add_argument("--keep", action="store_true", help="keep the prepared folders and logs (in the cache dir)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds before a prepare run is killed")
    ap.add_argument("--json", type=Path, help="write every number to this JSON file")
    a = ap.parse_args(argv)

    t_start = time.perf_counter()
    info = machine_info()
    print(f"machine: {info['nproc']} CPUs ({info['cpu']}), Python {info['python']}, tokenizers {info['tokenizers']}, "
          f"{info['date']}, load {info['loadavg_start'][0]:.2f}", flush=True)
    tokenizer_dir = minilm_folder()
    leads = wikipedia_leads_file()
    docs, split_s = leads_documents()
    sentences = [s for d in docs for s in d]
    block = google_text(docs)
    a.cache_dir.mkdir(parents=True, exist_ok=True)
    small_txt = write_replicated(block, a.cache_dir / "leads.txt", 1)
    corpus = {"leads_json": str(leads), "leads_json_bytes": leads.stat().st_size, "documents": len(docs),
              "sentences": len(sentences), "characters": sum(map(len, sentences)), "split_seconds": split_s,
              "leads_txt": small_txt}
    print(f"corpus: {len(docs):,} documents, {len(sentences):,} sentences, {corpus['characters']:,} characters "
          f"(read + split in {split_s:.1f} s); Google format {small_txt['bytes'] / _MB:.1f} MB", flush=True)
    results: dict[str, Any] = {"machine": info, "corpus": corpus, "args": {k: str(v) for k, v in vars(a).items()}}

    if not a.no_bare:
        print("bare tokenizer rates (same sentences), before the prepare runs:", flush=True)
        results["bare"] = bare_rates(sentences, tokenizer_dir, a.repeats, "before")

    work = a.cache_dir if a.keep else Path(tempfile.mkdtemp(prefix="prepare-bench-"))
    runs: list[dict[str, Any]] = []
    try:
        small = {"json": ("leads.json", [leads]), "txt": ("leads.txt", [Path(small_txt["path"])])}
        for key in [s.strip() for s in a.inputs.split(",") if s.strip()]:
            label, inputs = small[key]
            for dupe in _ints(a.dupe):
                for w in _ints(a.workers):
                    runs.append(run_prepare(label, inputs, tokenizer_dir, w, dupe, work, a.interval, a.keep, a.timeout))
        if not a.no_big:
            t0 = time.perf_counter()
            big = write_replicated(block, a.cache_dir / f"leads-{a.big_mb:g}MB.txt", int(a.big_mb * 1e6))
            big["write_seconds"] = time.perf_counter() - t0
            results["big_file"] = big
            print(f"big file: {big['path']} ({big['copies']} copies, {big['bytes'] / 1e6:,.0f} MB; "
                  f"{big['write_seconds']:.1f} s to write or find)", flush=True)
            for dupe in _ints(a.big_dupe):
                for w in _ints(a.big_workers):
                    runs.append(run_prepare(f"leads-{a.big_mb:g}MB.txt", [Path(big["path"])], tokenizer_dir, w, dupe,
                                            work, a.interval, a.keep, a.timeout))
        results["prepare"] = runs

        if not a.no_phases or a.profile:
            window = first_window(leads, P.PrepareConfig().shard_chars)
            scratch = work / "phases"
            scratch.mkdir(exist_ok=True)
            saved = os.environ.get("TOKENIZERS_PARALLELISM")
            os.environ["TOKENIZERS_PARALLELISM"] = "false"  # a worker's setting
            try:
                if not a.no_phases:
                    results["phases"] = [shard_phases(window, tokenizer_dir, d, scratch) for d in _ints(a.dupe)]
                if a.profile:
                    results["profiles"] = {str(d): profile_shard(window, tokenizer_dir, d, scratch, a.profile_top)
                                           for d in _ints(a.dupe)}
            finally:
                if saved is None:
                    os.environ.pop("TOKENIZERS_PARALLELISM", None)
                else:
                    os.environ["TOKENIZERS_PARALLELISM"] = saved
            shutil.rmtree(scratch, ignore_errors=True)
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)

    if not a.no_bare and a.bare_passes == 2:
        print("bare tokenizer rates, after the prepare runs:", flush=True)
        results["bare"] += bare_rates(sentences, tokenizer_dir, a.repeats, "after")
    info["loadavg_end"] = os.getloadavg()
    info["total_seconds"] = time.perf_counter() - t_start

    # ------------------------------------------------------------------ report
    print()
    print(f"machine: nproc {info['nproc']}, {info['cpu']}, {info['mem_total_mb']} MB RAM, Python {info['python']}, "
          f"tokenizers {info['tokenizers']}, numpy {info['numpy']}, splitter {info['sentence_splitter']}, "
          f"bertforge {info['bertforge_commit'] or '?'}, {info['date']}; load average {info['loadavg_start'][0]:.2f} "
          f"at start, {info['loadavg_end'][0]:.2f} at end; {info['total_seconds']:.0f} s in all")
    print(f"corpus: Wikipedia leads, {len(docs):,} documents, {len(sentences):,} sentences, "
          f"{corpus['characters']:,} characters; vocab {tokenizer_dir / 'vocab.txt'}")
    bare_fast = {}
    if results.get("bare"):
        print(f"\nBare tokenizer (same sentences, same process; {a.repeats} runs each; the ratios below use the median "
              "of tokenizers BERT encode_batch_fast, from the faster pass)\n")
        rows = []
        for b in results["bare"]:
            rows.append([b["pass"], b["encoder"], b["threads"], f"{b['tokens']:,}", f"{b['seconds']:.2f}",
                         f"{b['tokens_per_s']:,.0f}", f"{b['best_tokens_per_s']:,.0f}", f"{b['cpu_per_wall']:.2f}", f"{b['tokens_per_cpu_s']:,.0f}",
                         f"{b['loadavg_1min_before']:.1f}"])
            if b["encoder"] == "tokenizers BERT encode_batch_fast":
                bare_fast[b["threads"]] = max(bare_fast.get(b["threads"], 0.0), b["tokens_per_s"])
        print(table(["pass", "encoder", "threads", "tokens", "median s", "tokens/s (median)", "best tokens/s", "cpu/wall", "tokens/cpu-s", "load"], rows))
    if runs:
        print("\nbertforge prepare (subprocess `python -m bertforge prepare`; tokens = manifest totals.input_tokens)\n")
        rows = []
        for r in runs:
            row = [r["label"], f"{r['input_bytes'] / 1e6:,.1f}", r["workers"], r["dupe_factor"], f"{r['input_tokens']:,}",
                   r["shards"], f"{r['wall_s']:.1f}", f"{r['prepare_s'] or 0:.1f}", f"{r['tokens_per_s']:,.0f}",
                   f"{r['tokens_per_s_prepare'] or 0:,.0f}", f"{r['tokens_per_cpu_s'] or 0:,.0f}"]
            for threads in ("1", "all"):
                row.append(f"{r['tokens_per_s'] / bare_fast[threads]:.0%}" if threads in bare_fast else "-")
            row.append(f"{r['loadavg_1min_before']:.1f}")
            rows.append(row)
        print(table(["input", "MB", "workers", "dupe", "input tokens", "shards", "wall s", "prepare() s", "tok/s",
                     "tok/s prepare()", "tok/cpu-s", "vs bare 1 thr", "vs bare all", "load"], rows))
        print("\nMemory (MB). time -v: max RSS of the largest single process; tree: peak of the sum over the "
              "process tree, sampled every", a.interval, "s\n")
        rows = []
        for r in runs:
            s = r["sampler"]
            rows.append([r["label"], r["workers"], r["dupe_factor"], f"{r['time_max_rss_mb'] or 0:,.0f}",
                         f"{s['max_total_rss_mb']:,.0f}", f"{s['max_total_pss_mb']:,.0f}", f"{s['main_hwm_mb']:,.0f}",
                         " / ".join(f"{x:,.0f}" for x in s["worker_hwm_mb"]) or "-", s["max_procs"], s["samples"],
                         f"{s['main_cpu_s']:.1f}", " / ".join(f"{x:.1f}" for x in s["worker_cpu_s"]) or "-"])
        print(table(["input", "workers", "dupe", "time -v max RSS", "tree RSS peak", "tree PSS peak", "main HWM",
                     "worker HWM", "procs", "samples", "main cpu s", "worker cpu s"], rows))
    if results.get("phases"):
        print("\nOne shard's steps (first 2,000,000-character window of the leads, wiki-json; 1 thread; seconds)\n")
        names = list(results["phases"][0]["phases"])
        rows = []
        for n in names:
            rows.append([n, *(f"{p['phases'][n]:.3f} ({p['phases'][n] / p['seconds']:.0%})" for p in results["phases"])])
        rows.append(["total", *(f"{p['seconds']:.3f}" for p in results["phases"])])
        rows.append(["input tokens / s", *(f"{p['tokens_per_s']:,.0f}" for p in results["phases"])])
        print(table(["step", *(f"dupe {p['dupe_factor']} ({p['input_tokens']:,} tok, {p['instances']:,} inst)"
                               for p in results["phases"])], rows))
    for d, text in results.get("profiles", {}).items():
        print(f"\ncProfile of build_shard, dupe {d}:\n{text}")
    if a.json:
        a.json.write_text(json.dumps(results, indent=1) + "\n")
        print(f"\nwrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
