"""multi30k-en-de: the original Transformer, trained from scratch on Multi30k English→German.

Sized for a 2-core CPU: a 10-minute run (`make demo`) and longer runs (`bench/translation.py`).
Multi30k has 29k short sentence pairs (~13 words), so the model is smaller than the paper's base
(d_model 512, 6+6 layers). The settings are tuned for the short budget (10 minutes, ~370–530 steps)
on the validation set at a fixed number of steps (bench/translation_sweep.py,
bench/results/translation_sweep.jsonl; 373 steps, one seed): a warm-up of 200 steps to a peak of
2e-3 and a cosine decay that reaches 0 as the minutes budget runs out (optim.budget_cosine_lr), and
no dropout — a model this far from convergence is not over-fitting. Against the paper's schedule
(Noam, warm-up 400, dropout 0.1, the last 5 checkpoints averaged) validation loss fell from 2.99 to
2.84 and validation BLEU (all 1,014 sentences) rose from 22.17 to 24.99 greedy, 22.22 to 25.48 with
beam 4 (the best average of Noam's checkpoints, the last 3, reached 24.43 greedy; the same cosine
with dropout 0.1, 22.90). The cosine's last weights beat every average of its last checkpoints
(24.89 to 23.37 for 2 to 5), so none are averaged. Longer runs set their own
(bench/translation.py's 70-minute command in the README: Noam, dropout 0.2, averaging).

The peak is 3e-3 since bf16 steps made the 10 minutes hold ~620–640 steps (AMD EPYC): at 640
steps with the clock replayed (bench/translation_sweep.py --clock-steps 640, one seed, whole
validation split) a 3e-3 peak reached validation loss 2.357 and BLEU 30.92 greedy / 31.60 beam 4,
where the two 10-minute demo runs at 2e-3 ended at 2.509 and 2.567 (beam 4: 30.70, 29.85); a
warm-up of 100 steps instead of 200 (at 2e-3), 2.474 and 29.16 / 30.57.

Beam search's length penalty is α = 1.0, not the paper's 0.6 (chosen for WMT): on the whole
validation split, beam 4, α 1.0 beat 0.6 on each of three 10-minute models, by 0.32 / 0.31 / 0.35
BLEU (31.02 / 30.16 / 29.87 against 30.70 / 29.85 / 29.52: the demo runs at 16dd15b, 21872a2 and
2b33bdb, `attnlab evaluate --split val --length-penalty A`); 0.3 was worse (30.52 on the first).

Shorter budgets: the warm-up is 200 steps (300 since the batch warm-up, below) or 55% of the minutes budget, whichever ends first
(warmup_ratio; optim.budget_warmup). At 2 cores the 10 minutes hold 370–530 steps, so step 200
comes before 55% of the budget and the run is exactly the one tuned above (a steady run of N steps
is unchanged for N >= 200 / 0.55 ≈ 364; with the 300-step warm-up, N >= 546); a 2- or 4-minute run on one thread (~54 or ~98 steps)
used to spend its whole budget warming up (the peak never reached, test BLEU 0.06 at 2 minutes)
and now rises to ~1e-3 at ~40% of it and decays, the shape of the 10-minute schedule. Measured at
fixed steps with the clock replayed (bench/translation_sweep.py --clock-steps, whole validation
split, greedy; bench/results/translation_sweep.jsonl): 54 steps, validation BLEU 1.54 (ratio 0.25:
1.22, the same loss); 98 steps, 2.59. Smaller batches learn faster still at these budgets (1,500
tokens, 100 steps in the same 2 minutes: 3.95) but are not the default: they would change the
10-minute run.

Batch-size warm-up (data/rampup.py): the first 200 batches grow linearly from 1,000 to 3,000 padded
tokens, and the learning-rate warm-up is 300 steps instead of 200 (the same ~2 minutes of a
2-thread run: 200 ramped steps take about as long as 100 full ones). Measured on the real clock,
the candidate and the recipe before it trained side by side, one thread and one CPU each
(bench/translation.py --set threads=1 [--set ...], bench/results/translation_rampup_ab.jsonl, AMD
EPYC, 2026-12-05; test BLEU beam 4 / greedy): 2 minutes, 218 steps against 105, 11.98 / 7.02
against 5.10 / 2.81 (validation loss 4.175 against 4.767); 10 minutes, 610 steps against 500,
30.86 / 28.24 against 30.07 / 27.21 (2.516 against 2.606). The ramp with the 200-step warm-up lost
at 10 minutes (618 steps, 28.45 / 26.37 against 30.54 / 27.47, loss 2.658 against 2.582): the
learning rate then reached its peak after half the tokens, on batches still small.

Batches of 2,000 tokens (the ramp from 1,000) and a peak of 2.5e-3, not 3,000 and 3e-3: in a slow
hour (one thread of this host, ~2,450 target tok/s, about 640 steps of the 3,000-token recipe in 10
minutes) the smaller batches make ~910 steps and learn more per second. The same A/B on the real
clock (bench/results/translation_rampup_ab.jsonl, AMD EPYC, 2026-12-05; test BLEU beam 4 / greedy,
validation loss): the recipe before, 31.01 / 28.45, 2.476 (638 steps) and 31.28 / 28.99, 2.454
(651); 2,000 tokens at 2.5e-3, 32.70 / 30.58, 2.372 (909) and 31.82 / 29.64, 2.353 (919), the
second beside the recipe's 651-step run. At 2,000 tokens the 3e-3 peak gave 31.02 / 29.45, 2.401
and 2e-3 31.06 / 29.48, 2.454; 2,500 tokens at 2.5e-3 29.92 / 29.17, 2.545 (in a slower round, 711
steps); 1,500 tokens (3e-3) 30.41 / 27.32, 2.479; the 3,000-token recipe with a 4e-3 peak 30.01 /
26.84, 2.526, with Adam's β2 0.95 30.60 / 28.21, 2.522. Seeds 1 and 2 of the recipe, side by
side: 31.76 / 29.98, 2.427 (866 steps) and 31.69 / 28.55, 2.418 (874). Runs of one setting on the
real clock differ by ~0.02 nats and ~0.9 BLEU.

The kept weights are those of the lowest validation loss (best_metric="val_loss", the whole
split's NLL), not of the best greedy BLEU on 300 validation sentences: in the 10-minute demo run of
2026-12-02 (AMD EPYC, bf16, 642 steps, README) greedy BLEU peaked at step 500 (30.23 against 29.19
at the end) and kept weights that score 30.20 test BLEU with beam 4, where the final weights, lower
in validation loss (2.509 against 2.559), score 31.08 (validation beam 4: 30.70 against 28.85).
At the end of a cosine decay to 0 the last weights are nearly always the best; the loss says so
with less noise than 300 sentences' BLEU. `--set best_metric=val_bleu` is the former rule.

On CPUs that multiply bf16 natively (AVX512-BF16 or AMX; nn/cpu_tuning.native_bf16) the training
step runs its matrix products under bf16 autocast (train/speed.py; weights, gradients, optimizer,
softmax, loss and every evaluation stay fp32): 1.54x the fp32 step on an AMD EPYC Zen 4 (1,012 vs
1,553 ms at 2 threads, bench/train_step.py), so a 10-minute budget holds ~1.5x the steps. At equal
steps it learns the same (373 steps, whole validation split, bench/translation_sweep.py, seeds 0
and 1): validation loss 2.8415 / 2.8686 against fp32's 2.8407 / 2.8698, beam-4 BLEU 25.70 / 25.37
against 25.48 / 25.33. Elsewhere, and with `--set autocast=none`, the step is the fp32 reference.
"""
from __future__ import annotations

from attnlab.models.seq2seq import Seq2SeqConfig
from attnlab.nn.cpu_tuning import native_bf16
from attnlab.recipes.recipe import Recipe
from attnlab.tasks.translation import TranslationDataConfig
from attnlab.train.config import TrainConfig

NAME = "multi30k-en-de"


def recipe():
    fast = dict(autocast="bf16") if native_bf16() else {}
    return Recipe(
        name=NAME,
        description="Transformer En→De on Multi30k (test_2016_flickr), sacreBLEU",
        model=Seq2SeqConfig(d_model=256, n_heads=4, n_encoder_layers=3, n_decoder_layers=3, d_ff=1024,
                            dropout=0.0, norm_position="pre", max_seq_len=256),
        data=TranslationDataConfig(dataset="multi30k", src_lang="en", tgt_lang="de", tokenizer_vocab_size=8000,
                                   batch_tokens=2000, batch_tokens_start=1000,
                                   batch_rampup=200, label_smoothing=0.1, eval_bleu_sentences=300, beam_size=4,
                                   length_penalty=1.0, best_metric="val_loss"),
        train=TrainConfig(lr_schedule="cosine", lr=2.5e-3, min_lr=0.0, warmup_steps=300, warmup_ratio=0.55,
                          eval_every=250,
                          checkpoint_every=50, average_last=0, minutes=10.0, **fast),
    )
