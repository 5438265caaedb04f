"""pjd-ssd2d: PJD (speculative/pjd.py) whose fresh drafts come from a 2-D "below" head (SSD's
right-and-below heads, arXiv 2606.20543; models/head2d.py, trained by `lisa-trt train --arch ssd`).

PJD drafts a column that no forward has predicted yet (a row that just entered the lanes, the
columns past a lane's window) from a uniform prior over the allowed tokens, so its first draft
is almost never accepted. Here such a column (r, c) is drafted from the below head on the
target's final hidden state at (r - 1, c), whenever the row above has committed that column (the
hidden state of the query that fed the committed token there, recorded after every forward);
else from the prior, as in PJD. The head's logits pass through the session's Guide (CFG over the
two halves' hidden states, temperature / top-k / top-p, the layout's allowed and forced ids), so
the draft law is the same kind of law PJD's Jacobi drafts have. Acceptance, the Jacobi update,
the lanes and the row-causal mask are PJD's, unchanged: the head changes only the law a fresh
draft is drawn from (and that SJD's ratio test divides by), so with one lane PJD's lossless
property holds as before, and without a head (`heads=None`) the loop is PJD, token for token.

Without `--ssd-head` the head is the untrained one (models/head2d.Heads2D.from_target): the
target's own output layer on the hidden state above, i.e. the law of the token right of the one
above; docs/ssd_head.md measures it against a trained head and against PJD.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import InputError
from .methods import Method, MethodOption, register_method
from .pjd import PJDDecoder, PJDSettings, RowGrid

BELOW = (1, 0)
UNTRAINED = "untrained"  # PJDSSDDecoder(heads=UNTRAINED): the target's output layer as the below head


@dataclass(frozen=True)
class SSD2DSettings:
    """pjd-ssd2d's own knob (flat name pjd_ssd2d_head; CLI --ssd-head); the lanes are PJD's (--pjd-*)."""

    head: str = ""  # a `lisa-trt train --arch ssd` head2d.safetensors; "": the untrained head (the target's output layer)


class BelowLaws:
    """The below head's draft laws from the hidden states of committed tokens.

    hidden (CFG rows, N + 1, dim): the final hidden state at each committed image token (column N:
    the dump of masked writes); known (B, N + 1) which are recorded."""

    def __init__(self, heads, session, grid: RowGrid, prior):
        self.heads, self.k, self.s, self.g, self.prior = heads, heads.index(BELOW), session, grid, prior
        rows = session.B * (2 if session.cfg else 1)
        self.hidden = torch.zeros(rows, grid.N + 1, heads.config.dim, device=session.device)
        self.known = torch.zeros(session.B, grid.N + 1, dtype=torch.bool, device=session.device)

    def put(self, out, fed: torch.Tensor, rows, n, n_after, lead) -> None:
        """After a step's commit: out.hidden (CFG rows, S, dim) of the step's queries: the lanes' (lane-major,
        K + 1 each; fed (B, R, K + 1) the tokens they fed), then the re-fed last token of the row above
        the leading row `lead` (B,). Query j of a lane fed column n - 1 + j; its hidden state is
        recorded when that column is now committed with the token it fed; the re-fed token's always
        (a row's last token is often its bonus draw, which no lane query fed)."""
        hidden = out.hidden
        if hidden is None:
            raise InputError("pjd-ssd2d reads the target's final hidden state; this target engine returns none "
                             "(re-export the bundle with a current lisa-trt, or use pjd)")
        B, R, K1 = fed.shape
        last = lead * self.g.L - 1
        self._write(hidden[:, -1:], torch.where((last >= 0) & (last < self.g.N), last, self.g.N)[:, None])
        col = n[..., None] - 1 + torch.arange(K1, device=n.device)
        idx = (rows[..., None] * self.g.L + col).clamp(min=0, max=self.g.N - 1)
        out = self.s.out_buf.gather(1, idx.reshape(B, -1)).view(B, R, K1)
        ok = (col >= 0) & (col < n_after[..., None]) & (out == fed)
        self._write(hidden[:, : R * K1], torch.where(ok, idx, self.g.N).reshape(B, -1))

    def _write(self, h: torch.Tensor, dst: torch.Tensor) -> None:
        """hidden (CFG rows, S, dim) at image indices dst (B, S) (N: dropped into the dump column)."""
        self.hidden.scatter_(1, self.s.guide.dup(dst)[..., None].expand(-1, -1, h.shape[-1]), h.float())
        self.known.scatter_(1, dst, torch.ones_like(dst, dtype=torch.bool))

    def __call__(self, idx: torch.Tensor) -> torch.Tensor:
        """(B, R, K) raster indices -> (B, R, K, V) draft laws: the head's where the token above is
        recorded, else the prior's."""
        B = idx.shape[0]
        above = (idx - self.g.L).reshape(B, -1)
        has = (above >= 0) & self.known.gather(1, above.clamp(min=0))
        src = self.s.guide.dup(above.clamp(min=0))
        h = self.hidden.gather(1, src[..., None].expand(-1, -1, self.hidden.shape[-1]))
        law = torch.softmax(self.s.guide(self.heads.head_logits(h, self.k), idx.reshape(B, -1)), -1)
        return torch.where(has.view(*idx.shape, 1), law.view(*idx.shape, -1), self.prior(idx))


class PJDSSDDecoder(PJDDecoder):
    """PJD with the below head's fresh drafts (module docstring); heads None: PJD itself."""

    def __init__(self, target, settings: PJDSettings, heads=None, name: str = "pjd-ssd2d", head_name: str = ""):
        """heads: trained Heads2D, UNTRAINED (the target's output layer as the below head, built for
        each request's grid) or None (PJD's prior: the loop is PJD's)."""
        super().__init__(target, settings, name)
        self.heads, self.head_name = heads, head_name or ("untrained" if isinstance(heads, str) else "")
        if isinstance(heads, str):
            untrained_head(target, 1, 2)  # InputError now for a target without an output layer
        elif heads is not None:
            heads.index(BELOW)  # ConfigError now for heads without a below head

    def fresh_laws(self, session, grid: RowGrid, prior):
        """PJDDecoder's hook: (law_of(idx) -> fresh draft laws, the BelowLaws to feed or None)."""
        if self.heads is None:
            return prior, None
        heads = untrained_head(session.target, grid.L, grid.N) if self.heads == UNTRAINED else self.heads
        cfg = heads.config
        if (cfg.row_len, cfg.n_tokens) != (grid.L, grid.N):
            raise InputError(f"the 2-D heads were trained for rows of {cfg.row_len} in {cfg.n_tokens} tokens; this "
                             f"request has rows of {grid.L} in {grid.N}: train heads for this grid (--arch ssd)")
        below = BelowLaws(heads, session, grid, prior)
        return below, below

    def report_settings(self) -> dict:
        return super().report_settings() | {"pjd_ssd2d_head": self.head_name if self.heads is not None else "off"}


def untrained_head(target, row_len: int, n_tokens: int):
    """The below head with no training: the target's own output layer (Heads2D.from_target)."""
    from ..models.head2d import Heads2D

    if not isinstance(getattr(target, "output", None), torch.nn.Linear):
        raise InputError("pjd-ssd2d without --ssd-head builds its head from the target's output layer, which this "
                         "target engine does not expose: pass --ssd-head (lisa-trt train --arch ssd)")
    return Heads2D.from_target(target, row_len, n_tokens, (BELOW,)).eval()


def ssd2d_decoder(target, drafter, tables, gasv, spec):
    """pjd-ssd2d's Decoder (Method.decoder): PJD's settings, `spec`'s head (pjd_ssd2d_head; "": UNTRAINED)."""
    from ..models.head2d import load_heads2d

    path = spec.settings("pjd-ssd2d").head
    heads = load_heads2d(path, target, check_target=isinstance(target, torch.nn.Module)) if path else UNTRAINED
    return PJDSSDDecoder(target, spec.settings("pjd"), heads, head_name=path)


register_method(Method(
    "pjd-ssd2d", "sjd", "PJD whose fresh drafts (a new row, the columns past a window) come from a 2-D below head on "
    "the row above's hidden states (SSD's heads; --ssd-head, else the untrained head; approximate like pjd)",
    settings=SSD2DSettings, decoder=ssd2d_decoder,
    options=(MethodOption("--ssd-head", "pjd_ssd2d_head", str, "pjd-ssd2d: 2-D heads from `lisa-trt train --arch "
                          "ssd` (head2d.safetensors); default: the untrained head (the target's output layer)."),)))

__all__ = ["BELOW", "BelowLaws", "PJDSSDDecoder", "SSD2DSettings", "UNTRAINED", "ssd2d_decoder", "untrained_head"]
