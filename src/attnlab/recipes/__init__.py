"""Recipes: one small file each (data + model preset + train config); RECIPES maps names to them."""
from __future__ import annotations

from attnlab.errors import UserError
from attnlab.recipes import (bert, digits_vit, mnist_vit, multi30k_en_de, shakespeare_bpe, shakespeare_char,
                             shakespeare_char_mamba)
from attnlab.recipes.recipe import Recipe

__all__ = ["Recipe", "RECIPES", "get_recipe"]

RECIPES = {multi30k_en_de.NAME: multi30k_en_de.recipe,
           shakespeare_char.NAME: shakespeare_char.recipe,
           shakespeare_char.LLAMA_NAME: shakespeare_char.llama_recipe,
           shakespeare_bpe.NAME: shakespeare_bpe.recipe,
           shakespeare_char_mamba.NAME: shakespeare_char_mamba.recipe,
           bert.MLM_NAME: bert.mlm_recipe,
           bert.SST2_NAME: bert.sst2_recipe,
           bert.MINILM_NAME: bert.minilm_recipe,
           mnist_vit.NAME: mnist_vit.recipe,
           digits_vit.NAME: digits_vit.recipe}


def get_recipe(name: str) -> Recipe:
    """The recipe called `name`.

    Raises:
        ValueError: listing the known recipes when `name` is not one.
    """
    if name not in RECIPES:
        raise UserError(f"unknown recipe {name!r}; known recipes: {', '.join(sorted(RECIPES))}")
    return RECIPES[name]()
