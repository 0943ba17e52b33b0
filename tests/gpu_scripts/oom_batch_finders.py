"""The batch-size finders under a 4 GiB cap, over a tiny causal LM (oom_common.tiny_lm): each shrinks (or stops
growing) the batch at an out-of-memory; the batch size found is printed as one JSON line.

    python oom_batch_finders.py accelerate|trainer|lightning [OUTDIR]

accelerate: accelerate.utils.find_executable_batch_size over two training steps, from 1024, halving.
trainer: transformers' Trainer with auto_find_batch_size=True (accelerate's finder underneath), from 1024.
lightning: Lightning's Tuner.scale_batch_size, mode power, from 2 doubling, two steps a trial."""
import json
import sys
import tempfile

import torch
from oom_common import SEQ, VOCAB, Tokens, allocator_name, cap, tiny_lm

finder = sys.argv[1]
outdir = sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp()
cap(4)
attempts = []

if finder == "accelerate":
    from accelerate.utils import find_executable_batch_size

    model = tiny_lm().cuda()

    @find_executable_batch_size(starting_batch_size=1024)
    def train(batch_size):
        attempts.append(batch_size)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        for _ in range(2):
            x = torch.randint(VOCAB, (batch_size, SEQ), device="cuda")
            model(input_ids=x, labels=x).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return batch_size

    found = train()
elif finder == "trainer":
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(output_dir=outdir, per_device_train_batch_size=1024, auto_find_batch_size=True,
                             max_steps=2, report_to="none", save_strategy="no", logging_strategy="no",
                             disable_tqdm=True, dataloader_pin_memory=False)
    trainer = Trainer(model=tiny_lm(), args=args, train_dataset=Tokens(4096))
    trainer.train()
    found = trainer.state.train_batch_size or trainer._train_batch_size
elif finder == "lightning":
    import lightning as L
    from lightning.pytorch.tuner import Tuner

    class LM(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.batch_size = 2
            self.model = tiny_lm()

        def training_step(self, batch, _index):
            attempts.append(len(batch["input_ids"]))
            return self.model(input_ids=batch["input_ids"], labels=batch["labels"]).loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

        def train_dataloader(self):
            return torch.utils.data.DataLoader(Tokens(16384), batch_size=self.batch_size)

    trainer = L.Trainer(accelerator="gpu", devices=1, max_steps=2, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=outdir)
    found = Tuner(trainer).scale_batch_size(LM(), mode="power", init_val=2, max_trials=12, steps_per_trial=2)
else:
    raise SystemExit(f"unknown finder {finder!r}: accelerate, trainer or lightning")
print(json.dumps({"allocator": allocator_name(), "finder": finder, "batch_size": found,
                  "tried": sorted(set(attempts), reverse=finder != "lightning"),
                  "num_ooms": torch.cuda.memory_stats()["num_ooms"]}))
