"""Task families: one module each (model + tokenizer from a recipe, objective, evaluation, loading a run)."""
