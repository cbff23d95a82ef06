"""transformers' Trainer with MonitorCallback: the Trainer's own loop, unchanged, monitored."""
import csv

import pytest
import torch
from test_monitor import make_gpt2, one_thread  # noqa: F401  (one_thread: autouse fixture)

from probe import Monitor

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")   # the Trainer needs it


class Tokens(torch.utils.data.Dataset):
    def __init__(self, batches):
        self.rows = [row for b in batches for row in b]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return {"input_ids": self.rows[i], "labels": self.rows[i]}


def test_trainer_callback_records_every_step_and_the_trainers_logs(tmp_path):
    from probe.monitor import MonitorCallback
    model, _, batches = make_gpt2()
    mon = Monitor(output_dir=str(tmp_path / "mon"), activations=True)
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "trainer"), max_steps=6, per_device_train_batch_size=4,
                                          logging_steps=2, learning_rate=1e-3, report_to=[], save_strategy="no",
                                          use_cpu=True, disable_tqdm=True, dataloader_num_workers=0)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Tokens(batches),
                                   callbacks=[MonitorCallback(mon)])
    trainer.train()
    assert mon.outputs == []     # closed at on_train_end
    with open(tmp_path / "mon" / "metrics_rank0.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert sorted({int(r["step"]) for r in rows}) == list(range(6))
    losses = {int(r["step"]): float(r["loss"]) for r in rows if r["name"] == "train"}
    assert sorted(losses) == list(range(6))               # the model's output.loss, every step
    logged = {int(r["step"]): r for r in rows if r["name"] == "trainer"}
    assert sorted(logged) == [1, 3, 5]                      # on_log every 2 steps, after the step
    # the Trainer's logged loss is the mean over the logging window of the per-step losses
    assert float(logged[1]["loss"]) == pytest.approx((losses[0] + losses[1]) / 2, rel=1e-4)
    assert all(r["output_norm"] for r in rows if r["name"] == "transformer.h.1.mlp.c_fc")
