"""Equal-time EAGLE training on the cached distillation data (`train-drafter`'s answers): hard
(argmax token) vs soft (target distribution) cross-entropy, same seed and wall time each; prints
held-out acceptance (out-of-vocabulary tokens count as misses) and expected τ of 4- and 12-node trees.

    python scripts/drafter_label_ab.py 330 --out docs/reports/drafter-soft-labels-cpu.json
"""

import json
import sys
import time
from pathlib import Path

import torch

from specserve.engine.drafters.artifact import build_module
from specserve.engine.drafters.modules import EagleSpec
from specserve.engine.drafters.trees import expected_tau
from specserve.engine.drafters.vocab import head_rows
from specserve.models.load import load_model
from specserve.paths import default_cache_dir
from specserve.training import examples, trainers
from specserve.training.data import DistillData, frequent_vocab, teacher_features, token_counts

secs = float(sys.argv[1])  # training seconds per arm
out_path = Path(sys.argv[sys.argv.index("--out") + 1]) if "--out" in sys.argv else None


def log(m):
    print(m, file=sys.stderr, flush=True)


loaded = load_model("smollm2-135m")
model = loaded.model
data = DistillData.load(next((default_cache_dir() / "distill").glob("distill-*.pt")))
done = data.done
held, train = done[-24:], done[:-24]
seqs = [data.sequence(i) for i in train]
hseqs = [data.sequence(i) for i in held]
pl = [len(data.prompts[i]) for i in train]
hpl = [len(data.prompts[i]) for i in held]
vocab = frequent_vocab(
    token_counts([data.answers[i] for i in train], model.config.vocab_size), 8192
)
index = examples.vocab_index(vocab, model.config.vocab_size)
w = head_rows(model, vocab).float()
t = time.time()
f = teacher_features(model, seqs, (-1, -1))
hf = teacher_features(model, hseqs, (-1, -1))
log(f"features {time.time() - t:.0f}s")
out = {}
for name, soft in [("hard", False), ("soft", True)]:
    torch.manual_seed(0)
    ts = trainers.TrainerSettings(soft_labels=soft)
    b = examples.eagle_batches(seqs, pl, f, index, ts.eagle_batch_seqs, 64)
    hb = examples.eagle_batches(hseqs, hpl, hf, index, 4, 64)
    d = build_module(model, EagleSpec()).float()
    std = torch.cat([x[:, 0] for x in f]).std(0)
    st = trainers.train_eagle(d, model, w, b, ts, secs, None, None, std, hb)
    acc = trainers.eagle_accept_rates(d, model, w, hb, 6, 8)
    out[name] = {
        "acc_rank0": [round(a[0], 3) for a in acc],
        "top8_d1": round(sum(acc[0]), 3),
        "exp_tau_4": round(expected_tau(acc, 4), 3),
        "exp_tau_12": round(expected_tau(acc, 12), 3),
        "steps": st["step"],
        "epochs": st["epoch"],
        "best_epoch": st.get("best_epoch"),
    }
    log(json.dumps({name: out[name]}))
print(json.dumps(out, indent=1))
if out_path:
    out_path.write_text(json.dumps(out, indent=1))
