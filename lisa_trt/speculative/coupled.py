"""Coupled tree drafting (`coupled`): the LISA drafter's EAGLE-2 tree drafted with the random
numbers verification will use; lossless (docs/spec/decoders.md, "coupled").

Every image-token index i of a row owns one Gumbel noise vector g_i (V values, drawn once from
the row's seed and i alone: `PositionNoise`). The target's token at index i is the Gumbel-max
sample y_i = argmax_v (log p_i(v) + g_i(v)), p_i its guided, filtered law given the committed
tokens before i; the whole decode is therefore the AR loop's Gumbel-max sampler with noises
g_1 .. g_N, whatever the drafts are, and each token is distributed exactly as the target's.

The drafter sees the same noise: a node predicting index i ranks its children by
log q_i(v) + scale * g_i(v) (scale 1: a Gumbel top-K, i.e. K draws without replacement from q
whose first draw is q's Gumbel-max sample with the target's noise), and the tree is built from
log_softmax of those keys. When q is close to p the drafter's first child IS the target's
sample (Gumbel coupling: P(same) >= (1 - TV) / (1 + TV)), so acceptance no longer stops at the
top-K mass of p as exact verification of deterministic drafts does.

Verification (`verify_coupled`) needs no random numbers: from the root, the child whose token
is y at the current node is followed; when no child is, y is committed as the bonus. It is
`verify.verify_greedy` run on log p + g. Greedy sampling runs the exact rule's greedy path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import InputError
from . import verify as V
from .decode import tree_decoder
from .methods import Method, MethodOption, RuleContext, exact_rule, register_method
from .sampling import RowGenerators

_MASK64 = (1 << 64) - 1


def _mix(a: int, b: int) -> int:
    """A 63-bit seed from (row seed, token index) (splitmix64 finaliser over a + golden * (b + 1))."""
    z = (a + 0x9E3779B97F4A7C15 * (b + 1)) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 1


def gumbel(u: torch.Tensor) -> torch.Tensor:
    """Standard Gumbel noise from uniforms in [0, 1)."""
    return -torch.log(-torch.log(u.clamp(1e-20, 1.0 - 1e-7)))


class PositionNoise:
    """One Gumbel vector per (row, image-token index), a function of the row's seed and the index
    only (so the decode is the same whatever the tree, the drafter or the batch's progress).

    A ring of `span` indices per row holds the vectors in use: a request may span at most `span`
    consecutive indices per row (one tree: root .. deepest node), and indices never go back by
    more than that (the decode only moves forward)."""

    def __init__(self, row_seeds, vocab: int, device, span: int):
        self.seeds = [int(s) for s in row_seeds]
        self.V, self.dev, self.span = int(vocab), device, int(span)
        B = len(self.seeds)
        self.buf = torch.zeros(B, self.span, self.V, device=device)
        self.held = torch.full((B, self.span), -1, dtype=torch.long, device=device)
        self.gen = torch.Generator(device=device)

    def vector(self, row: int, index: int) -> torch.Tensor:
        """g for (row, index), freshly computed (V,)."""
        self.gen.manual_seed(_mix(self.seeds[row], int(index)))
        return gumbel(torch.rand(self.V, generator=self.gen, device=self.dev))

    def __call__(self, rows: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """rows (B,) original rows, index (B, ...) token indices -> (B, ..., V) noise."""
        shape = index.shape
        idx = index.reshape(shape[0], -1).long()
        slot = idx % self.span
        r = rows.long()[:, None].expand_as(idx)
        miss = self.held[r, slot] != idx
        if bool(miss.any()):
            pairs = sorted(set(zip(r[miss].tolist(), idx[miss].tolist())))
            for row, i in pairs:
                self.buf[row, i % self.span] = self.vector(row, i)
                self.held[row, i % self.span] = i
            if bool((self.held[r, slot] != idx).any()):
                raise InputError(f"internal: one noise request spans more than {self.span} token indices")
        return self.buf[r, slot].reshape(*shape, self.V)


def row_seeds(batch: int, generator) -> list:
    """One 62-bit seed per row, drawn from the decode's generator (per row for RowGenerators)."""
    if isinstance(generator, RowGenerators):
        return [int(torch.randint(0, 1 << 62, (1,), generator=g, device=g.device)) for g in generator.gens]
    dev = generator.device if generator is not None else "cpu"
    return torch.randint(0, 1 << 62, (batch,), generator=generator, device=dev).tolist()


@dataclass(frozen=True)
class CoupledSettings:
    """Coupled drafting knobs (flat name coupled_scale; CLI --coupled-scale)."""

    scale: float = 1.0  # drafter keys log q + scale * g (0: the exact rule's top-K drafts)

    def __post_init__(self):
        if not self.scale >= 0:
            raise InputError(f"coupled scale must be >= 0, got {self.scale}")


class CoupledSession:
    """Per-decode state of `coupled` (Method.session): the position noise, shared by the target's
    sampling, the drafter's tree and the verification."""

    def __init__(self, *, batch, vocab, generator, device, spec):
        self.settings = spec.settings("coupled")
        self.noise = PositionNoise(row_seeds(batch, generator), vocab, device, span=spec.tree.depth + 3)

    def sample(self, logits: torch.Tensor, token_index: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """The target's Gumbel-max token at token_index (B,) from logits (B, V)."""
        return (logits.float() + self.noise(rows, token_index)).argmax(-1)

    def draft(self, logprobs: torch.Tensor, token_index: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Drafter log-probs (B, [n,] V) -> log_softmax(log q + scale * g) (-inf stays -inf)."""
        s = self.settings.scale
        if s == 0:
            return logprobs
        g = self.noise(rows, token_index)
        return torch.log_softmax(logprobs + s * g, -1)


def verify_coupled(logits: torch.Tensor, tree, noise: torch.Tensor) -> V.VerifyResult:
    """Follow the children equal to the target's Gumbel-max sample argmax(logits + noise) at each
    node (logits (B, N, V) guided and filtered, noise (B, N, V) the nodes' position noise); the
    first node without such a child commits that sample as the bonus. TVD 0 (lossless)."""
    return V.verify_greedy(logits.float() + noise, tree)


def coupled_rule(logits, tree, ctx: RuleContext):
    """The `coupled` rule: verify_coupled with the session's noise at the nodes' indices; the exact
    rule when greedy (no session)."""
    if ctx.greedy or ctx.session is None:
        return exact_rule(logits, tree, ctx)
    return verify_coupled(logits, tree, ctx.session.noise(ctx.rows, ctx.token_index))


register_method(Method(
    "coupled", "tree", "exact tree speculation with coupled drafting: the drafter's tree and the target's "
    "sampling share one Gumbel noise per token position (lossless)", needs_drafter=True, rule=coupled_rule,
    session=CoupledSession, settings=CoupledSettings, decoder=tree_decoder,
    options=(MethodOption("--coupled-scale", "coupled_scale", float,
                          "coupled: weight of the shared noise in the drafter's keys (1 = Gumbel top-K, "
                          "0 = exact's top-K drafts)."),)))

__all__ = ["CoupledSession", "CoupledSettings", "PositionNoise", "coupled_rule", "gumbel", "row_seeds",
           "verify_coupled"]
