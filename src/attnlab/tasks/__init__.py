"""Task families, one module each: the model and tokenizer from a recipe, the objective, evaluation,
loading a run directory (base.py: the skeleton; registry.py: model_type -> task)."""
