"""Models for the level tests: the awkward cases module hooks must survive.

* ``HFStyleLM``: returns an HF-style ``ModelOutput`` (a dataclass that is also a dict),
  one of whose outputs (``aux``) gets no gradient.
* ``SharedNet``: one block called twice (counter N), weights tied between two Linears.
* ``InplaceNet``: ``nn.ReLU(inplace=True)`` on a view of a slice, which
  ``register_full_backward_hook``-based tools break.
* the msprobe fixture's tiny model, loaded from tests/fixtures/dump/tiny_model.py.
"""
import importlib.util
import os
from collections import OrderedDict
from dataclasses import dataclass, fields
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))


def tiny_model():
    """The module the msprobe fixtures were made with (make(), train_step())."""
    spec = importlib.util.spec_from_file_location("tiny_model_levels",
                                                  os.path.join(HERE, "fixtures", "dump", "tiny_model.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class ModelOutput(OrderedDict):
    """Like transformers.utils.ModelOutput: a dataclass whose non-None fields are dict items."""

    def __post_init__(self):
        for f in fields(self):
            v = getattr(self, f.name)
            if v is not None:
                self[f.name] = v


@dataclass
class LMOutput(ModelOutput):
    loss: Optional[torch.Tensor] = None
    logits: Optional[torch.Tensor] = None
    hidden_states: Optional[tuple] = None
    aux: Optional[torch.Tensor] = None


@dataclass
class PlainPair:
    """A plain (non-dict) dataclass output."""
    main: torch.Tensor
    side: torch.Tensor


class Encoder(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.proj = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)

    def forward(self, x, mask=None):
        h = self.proj(x)
        if mask is not None:
            h = h * mask
        return PlainPair(main=self.norm(h), side=h.detach().abs())


class HFStyleLM(nn.Module):
    def __init__(self, vocab=20, d=16):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.encoder = Encoder(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, input_ids, labels=None, attention_mask=None):
        h0 = self.embed(input_ids)
        enc = self.encoder(h0, mask=attention_mask)
        logits = self.head(enc.main)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
        return LMOutput(loss=loss, logits=logits, hidden_states=(h0, enc.main), aux=logits.detach() * 2)


def make_hf(seed=0, batch=2, seq=5):
    """(LMWrapper, input ids, labels, mask): the wrapper's ``lm`` returns an LMOutput."""
    torch.manual_seed(seed)
    model = LMWrapper()
    ids = torch.randint(0, 20, (batch, seq))
    labels = torch.randint(0, 20, (batch, seq))
    mask = torch.ones(batch, seq, 1)
    return model, ids, labels, mask


class SharedNet(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.inp = nn.Linear(d, d)
        self.block = nn.Sequential(nn.Linear(d, d), nn.Tanh())
        self.out = nn.Linear(d, d, bias=False)
        self.out.weight = self.inp.weight   # tied

    def forward(self, x):
        h = self.block(self.inp(x))
        h = self.block(h)                   # the same block again: forward.1
        return self.out(h)


class InplaceNet(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.fc = nn.Linear(d, 2 * d)
        self.act = nn.ReLU(inplace=True)
        self.fc2 = nn.Linear(2 * d, 2 * d)
        self.act_view = nn.ReLU(inplace=True)
        self.head = nn.Linear(2 * d, 3)

    def forward(self, x):
        h = self.act(self.fc(x))          # in place on a whole activation
        g = self.fc2(h)
        self.act_view(g[:, :4])           # in place through a view of a slice
        return self.head(g)


class LMWrapper(nn.Module):
    """Puts the HF-style model under a root, so that its ModelOutput is a dumped module's output."""

    def __init__(self):
        super().__init__()
        self.lm = HFStyleLM()

    def forward(self, *args, **kwargs):
        return self.lm(*args, **kwargs)


def train_steps(model, make_loss, steps=2, lr=0.1, before=None, after=None):
    """Run ``steps`` SGD steps; returns the losses and the final parameters (clones)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        if before:
            before()
        opt.zero_grad()
        loss = make_loss()
        loss.backward()
        opt.step()
        if after:
            after()
        losses.append(loss.detach().clone())
    return losses, [p.detach().clone() for p in model.parameters()]
