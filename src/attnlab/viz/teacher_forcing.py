"""teacher-forcing: one parallel training pass against step-by-step greedy decoding.

In training the decoder reads the reference shifted right (<bos> + target) and predicts every next
token at once; at inference it reads its own previous outputs, one step at a time. Position 0 sees
the same input (<bos> and the source) in both, so its prediction is greedy decoding's first token.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from attnlab.errors import UserError
from attnlab.generate import greedy_decode
from attnlab.viz.figure import finish, new_figure, short
from attnlab.viz.sources import FITTING, Source
from attnlab.tasks.kinds import Kind


@dataclass
class TeacherForcingResult:
    model: str
    source: str                    # the English sentence
    reference: str                 # its German reference
    decoder_input: list[str]       # <bos> + reference tokens (shifted right)
    predicted: list[str]           # argmax at every position of one parallel pass
    target: list[str]              # reference tokens + <eos>
    predicted_ids: list[int]
    greedy_ids: list[int]          # greedy decoding, step by step (ends with eos_id when it stopped)
    greedy: list[str]
    greedy_text: str

    @property
    def correct(self) -> list[bool]:
        return [p == t for p, t in zip(self.predicted, self.target)]

    @property
    def caption(self) -> str:
        n = sum(self.correct)
        return (f"Teacher forcing: one pass over the shifted reference predicts all {len(self.target)} next tokens "
                f"({n} right, green); greedy decoding instead feeds back its own choices one step at a time "
                f"and wrote {self.greedy_text!r} (green: the reference's token at that position). Both agree at "
                f"position 0, where the inputs are the same.")


@torch.no_grad()
def teacher_forcing(source: Source, sentence: str, reference: str, max_new_tokens: int | None = None
                    ) -> TeacherForcingResult:
    """Predictions of one teacher-forced pass and of greedy decoding for one sentence pair.

    Raises:
        ValueError: for a model that is not a translation model, or an empty sentence.
    """
    if source.kind is not Kind.SEQ2SEQ:
        raise UserError(f"the teacher-forcing figure needs {FITTING[Kind.SEQ2SEQ]}; {source.name} is "
                        f"{source.described}")
    if not sentence.strip() or not reference.strip():
        raise UserError("the teacher-forcing figure needs a sentence and its reference translation")
    model, tok = source.model, source.tokenizer
    cfg = model.cfg
    src = torch.tensor([tok.encode(sentence)[:cfg.max_seq_len]])
    tgt = tok.encode(reference)[:cfg.max_seq_len - 1]
    tgt_in = torch.tensor([[cfg.bos_id] + tgt])
    predicted = model(src, tgt_in)[0].argmax(-1).tolist()  # (T,)
    limit = max_new_tokens or min(cfg.max_seq_len - 1, len(tgt) + 10)
    greedy = greedy_decode(model, src, limit)[0]
    if len(greedy) < limit:  # it stopped at <eos>
        greedy = greedy + [cfg.eos_id]
    name = _namer(source, cfg)
    return TeacherForcingResult(source.name, sentence, reference, ["<bos>"] + [name(i) for i in tgt],
                                [name(i) for i in predicted], [name(i) for i in tgt] + ["<eos>"], predicted, greedy,
                                [name(i) for i in greedy], tok.decode(greedy, skip_special=True))


def _namer(source: Source, cfg):
    special = {cfg.bos_id: "<bos>", cfg.eos_id: "<eos>", cfg.pad_id: "<pad>"}
    return lambda i: special.get(i) or source.display(i)


def draw_teacher_forcing(r: TeacherForcingResult, out) -> None:
    rows = max(len(r.target), len(r.greedy))
    fig = new_figure(13, 1.3 + 0.25 * rows)
    left, right = fig.subplots(1, 2, width_ratios=[1, 1.6])
    header = ["pos", "decoder input", "prediction", "target"]
    cells = [[str(i), short(a, 14), short(p, 14), short(t, 14)]
             for i, (a, p, t) in enumerate(zip(r.decoder_input, r.predicted, r.target))]
    colors = [["white", "white", "#b7e4c7" if ok else "#f8c4b4", "white"] for ok in r.correct]
    _table(left, header, cells, colors, [0.1, 0.3, 0.3, 0.3])
    left.set_title("teacher forcing: one parallel pass", fontsize=10)
    steps = []
    for k, token in enumerate(r.greedy):
        prefix = " ".join(short(t, 10) for t in ["<bos>"] + r.greedy[:k])
        prefix = prefix if len(prefix) <= 58 else "… " + prefix[-56:]
        steps.append([str(k + 1), prefix, short(token, 14)])
    match = [["white", "white", "#b7e4c7" if k < len(r.target) and r.greedy[k] == r.target[k] else "#eeeeee"]
             for k in range(len(r.greedy))]
    _table(right, ["step", "decoder has read (its own outputs)", "chooses"], steps, match, [0.08, 0.72, 0.2])
    right.set_title("greedy decoding: one token per step", fontsize=10)
    finish(fig, f"Teacher forcing vs. greedy decoding: {r.source!r} ({r.model.rstrip('/').split('/')[-1]})",
           r.caption, out)


def _table(ax, header: list[str], cells: list[list[str]], colors: list[list[str]], widths: list[float]) -> None:
    ax.axis("off")
    if not cells:
        return
    table = ax.table(cellText=cells, colLabels=header, cellColours=colors, colWidths=widths, loc="upper center",
                     cellLoc="left")
    table.auto_set_font_size(False)
    table.set_fontsize(8)
    table.scale(1.0, 1.1)
