"""A Hugging Face Trainer run with memory metrics (skip_memory_metrics=False), under gmlake or natively.

    GMLAKE=1 python tests/gpu_scripts/hf_trainer_memory_metrics.py

A small GPT-2 built from its config (no download) trains 8 steps on random tokens. Trainer's memory tracker calls
torch.cuda.memory_allocated / max_memory_allocated / reset_peak_memory_stats; under gmlake they must answer from
gmlake. Prints PASS/FAIL lines and exits 1 on a failure.
"""
import sys
import tempfile

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

failures = 0


def check(name: str, ok: bool, detail: str = "") -> None:
    global failures
    failures += not ok
    print(f"{'PASS' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)


class RandomTokens(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> dict:
        ids = torch.randint(0, 1000, (64 + 8 * (i % 5),), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


def collate(batch: list) -> dict:
    n = max(len(b["input_ids"]) for b in batch)
    ids = torch.stack([torch.nn.functional.pad(b["input_ids"], (0, n - len(b["input_ids"]))) for b in batch])
    return {"input_ids": ids, "labels": ids}


torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(vocab_size=1000, n_positions=128, n_embd=256, n_layer=4, n_head=4))
with tempfile.TemporaryDirectory() as out:
    args = TrainingArguments(output_dir=out, max_steps=8, per_device_train_batch_size=4, logging_steps=4,
                             skip_memory_metrics=False, report_to=[], save_strategy="no", dataloader_num_workers=0)
    result = Trainer(model=model, args=args, train_dataset=RandomTokens(), data_collator=collate).train()
metrics = result.metrics
print("metrics:", {k: v for k, v in metrics.items() if "mem" in k})
check("Trainer reported GPU memory metrics", "train_mem_gpu_alloc_delta" in metrics and
      "train_mem_gpu_peaked_delta" in metrics, str(sorted(metrics)))
check("the training loss is finite", metrics.get("train_loss", float("nan")) == metrics.get("train_loss"))
try:
    import gmlake.torch as gt
    under_gmlake = gt.is_enabled()
except ImportError:
    under_gmlake = False
if under_gmlake:
    s = gt.allocator().stats()
    check("gmlake served the run", s["allocs"] > 100, f"{s['allocs']} allocations, {s['stitches']} stitches, "
          f"peak reserved {s['peak_reserved_bytes'] >> 20} MiB")
    check("torch.cuda.memory_allocated() is gmlake's", torch.cuda.memory_allocated() == s["allocated_bytes"])
print(f"allocator: {'gmlake' if under_gmlake else 'native'}")
print("ALL PASS" if not failures else f"{failures} FAILED")
sys.exit(1 if failures else 0)
