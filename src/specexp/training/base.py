"""What every trainable part's LightningModule shares (DFlash, DEdit, EAGLE-3, the DeLS local heads and fusion
weights, Domino-FT), as drafters/base.py is what every drafter shares:

- the frozen target, held outside the module's state: not saved in Lightning checkpoints, not given to the
  optimiser, not wrapped by DDP / FSDP (training/distributed.py);
- one training step: the subclass's `step_loss(batch)` gives (loss, metrics); the loss and the metrics named in
  `shown` go to the progress bar, every metric is logged under `train/`; a sequence that gives no loss is skipped
  (`distributed.no_loss`, which keeps ranks in step);
- the recipe's optimiser (optim.adamw_cosine) over the module's trainable parameters.
"""
from __future__ import annotations

import lightning as L

from .distributed import no_loss
from .optim import adamw_cosine


class LitModule(L.LightningModule):
    shown: tuple[str, ...] = ()          # metrics shown on the progress bar beside the loss

    def __init__(self, target, *, lr: float, warmup_ratio: float, weight_decay: float):
        super().__init__()
        self._target = (target,)          # a tuple: the frozen target is not a submodule
        self.lr, self.warmup_ratio, self.weight_decay = lr, warmup_ratio, weight_decay

    @property
    def target(self):
        return self._target[0]

    def step_loss(self, batch) -> tuple[object, dict]:
        """(loss, metrics) of one batch (one sequence); loss None when the sequence gives none."""
        raise NotImplementedError

    def training_step(self, batch, batch_idx):
        loss, metrics = self.step_loss(batch)
        if loss is None:
            return no_loss(self)
        self.log("train/loss", loss, prog_bar=True, batch_size=1)
        for k in self.shown:
            self.log(f"train/{k}", metrics.pop(k), prog_bar=True, batch_size=1)
        self.log_dict({f"train/{k}": v for k, v in metrics.items()}, batch_size=1)
        return loss

    def configure_optimizers(self):
        params = [p for p in self.parameters() if p.requires_grad]
        return adamw_cosine(params, self.trainer, self.lr, self.weight_decay, self.warmup_ratio)
