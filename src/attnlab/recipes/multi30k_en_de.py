"""multi30k-en-de: the original Transformer, trained from scratch on Multi30k English→German.

Sized for a 2-core CPU: a 10-minute run (`make demo`) and longer runs (`bench/translation.py`).
Multi30k has 29k short sentence pairs (~13 words), so the model is smaller than the paper's base
(d_model 512, 6+6 layers) and the warm-up shorter. The Noam learning rate is still high when a
short budget ends, so the last 5 checkpoints (50 steps apart) are averaged, as the paper does (§6.1),
and the average is kept when its validation BLEU is higher.
"""
from __future__ import annotations

from attnlab.models.seq2seq import Seq2SeqConfig
from attnlab.recipes.recipe import Recipe
from attnlab.tasks.translation import TranslationDataConfig
from attnlab.train.config import TrainConfig

NAME = "multi30k-en-de"


def recipe():
    return Recipe(
        name=NAME,
        description="Transformer En→De on Multi30k (test_2016_flickr), sacreBLEU",
        model=Seq2SeqConfig(d_model=256, n_heads=4, n_encoder_layers=3, n_decoder_layers=3, d_ff=1024,
                            dropout=0.1, norm_position="pre", max_seq_len=256),
        data=TranslationDataConfig(dataset="multi30k", src_lang="en", tgt_lang="de", tokenizer_vocab_size=8000,
                                   batch_tokens=3000, label_smoothing=0.1, eval_bleu_sentences=300, beam_size=4,
                                   length_penalty=0.6),
        train=TrainConfig(lr_factor=1.0, warmup_steps=400, eval_every=250, checkpoint_every=50, average_last=5,
                          minutes=10.0),
    )
