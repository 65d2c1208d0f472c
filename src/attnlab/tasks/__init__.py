"""Task families, one module each: the model and tokenizer from a recipe, the objective, evaluation,
loading a run directory (base.py: the skeleton and what a family states; kinds.py: the kinds of model;
loaded.py: LoadedModel; registry.py: model_type -> task, the one vocabulary of kinds)."""
