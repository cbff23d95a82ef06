"""Small real models for the dump tests: an MLP, a conv net with BatchNorm, a transformer block.

Each ``make_*`` returns (model, inputs, targets) built from a fixed seed, so two calls give
bitwise the same model and data; ``train_step`` runs forward, backward and an optimizer step.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self, d_in=16, d_hidden=32, n_cls=5):
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_hidden)
        self.head = nn.Linear(d_hidden, n_cls)

    def forward(self, x):
        h = F.gelu(self.fc1(x))
        h = h + torch.tanh(self.fc2(h))
        return self.head(h)


class ConvNet(nn.Module):
    def __init__(self, n_cls=5):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(8)
        self.head = nn.Linear(8, n_cls)

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = F.max_pool2d(h, 2)
        h = F.relu(self.bn2(self.conv2(h))) + h
        return self.head(h.mean(dim=(2, 3)))


class TransformerBlock(nn.Module):
    """Pre-norm GPT-2-style block: LayerNorm, causal multi-head attention (SDPA), GELU MLP."""

    def __init__(self, d=32, n_heads=4):
        super().__init__()
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyGPT(nn.Module):
    def __init__(self, vocab=50, d=32, n_layers=1, n_heads=4, seq=8):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(seq, d))
        self.blocks = nn.ModuleList([TransformerBlock(d, n_heads) for _ in range(n_layers)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx):
        x = self.tok(idx) + self.pos[: idx.shape[1]]
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


class MoEBlock(nn.Module):
    """A top-k mixture of experts, routed per token as Mixtral routes: router linear,
    ``topk``, softmax over the k chosen logits, each expert's MLP on its tokens
    (``torch.where`` -> ``index_select``) added back weighted (``index_add``). Every expert
    runs at every call (on no token at all where none is routed to it), so the call
    sequence does not depend on the routing.
    ``near_tie``: the router's rows 0 and 1 agree to that relative amount, so that many
    tokens' logits for experts 0 and 1 nearly tie (upcycled experts start so): a run in
    another dtype or reduction order routes some of them to the other expert."""

    def __init__(self, d=64, n_experts=4, k=2, d_ff=128, near_tie=None):
        super().__init__()
        self.k = k
        self.norm = nn.LayerNorm(d)
        self.router = nn.Linear(d, n_experts, bias=False)
        if near_tie is not None:
            with torch.no_grad():
                w = self.router.weight
                w[1] = w[0] + near_tie * w[0].abs().mean() * torch.randn_like(w[0])
        self.fc = nn.ModuleList([nn.Linear(d, d_ff) for _ in range(n_experts)])
        self.out = nn.ModuleList([nn.Linear(d_ff, d) for _ in range(n_experts)])

    def forward(self, x):
        b, t, d = x.shape
        h = self.norm(x).reshape(-1, d)
        top, idx = torch.topk(self.router(h), self.k, dim=-1)
        gate = F.softmax(top, dim=-1)
        out = torch.zeros_like(h)
        for e, (fc, proj) in enumerate(zip(self.fc, self.out)):
            rows, slot = torch.where(idx == e)
            y = proj(F.silu(fc(h.index_select(0, rows)))) * gate[rows, slot].unsqueeze(-1)
            out = out.index_add(0, rows, y.to(out.dtype))
        return x + out.view(b, t, d)


class TinyMoE(nn.Module):
    """Token embedding, ``n_layers`` MoE blocks, LayerNorm and a head: logits per token."""

    def __init__(self, vocab=128, d=64, n_layers=2, n_experts=4, k=2, near_tie=None):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList([MoEBlock(d, n_experts, k, near_tie=near_tie) for _ in range(n_layers)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx):
        x = self.tok(idx)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def make_mlp(seed=0, batch=4):
    torch.manual_seed(seed)
    return MLP(), torch.randn(batch, 16), torch.randint(0, 5, (batch,))


def make_convnet(seed=0, batch=4):
    torch.manual_seed(seed)
    return ConvNet(), torch.randn(batch, 3, 8, 8), torch.randint(0, 5, (batch,))


def make_gpt(seed=0, batch=2, seq=8, d=32, n_layers=1):
    torch.manual_seed(seed)
    model = TinyGPT(d=d, n_layers=n_layers, seq=seq)
    idx = torch.randint(0, 50, (batch, seq))
    return model, idx, torch.randint(0, 50, (batch, seq))


MAKERS = {"mlp": make_mlp, "convnet": make_convnet, "gpt": make_gpt}


def train_step(model, opt, x, y):
    """Forward, cross-entropy loss, backward and optimizer step; returns the loss."""
    opt.zero_grad()
    out = model(x)
    loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
    loss.backward()
    opt.step()
    return loss
