"""transformers' ``Trainer`` integration: ``Trainer(..., callbacks=[MonitorCallback(mon)])``.

The model and optimizer are taken at ``on_train_begin`` (accelerate's optimizer wrapper is
unwrapped); the logged numbers of ``on_log`` (loss, grad_norm, learning_rate) are recorded
under the name ``trainer`` at the step they belong to; ``on_train_end`` closes the monitor.
"""
from transformers import TrainerCallback


class MonitorCallback(TrainerCallback):
    def __init__(self, monitor):
        self.monitor = monitor

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        if self.monitor.collector is None:
            self.monitor.set_monitor(model, optimizer=optimizer)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or self.monitor.collector is None:
            return
        values = {k: v for k, v in logs.items()
                  if k in ("loss", "grad_norm", "learning_rate") and isinstance(v, (int, float))}
        if values:
            # global_step counts finished steps; the monitor numbers them from 0
            self.monitor.log_scalars(values, step=max(state.global_step - 1, 0), name="trainer")

    def on_train_end(self, args, state, control, **kwargs):
        self.monitor.close()
